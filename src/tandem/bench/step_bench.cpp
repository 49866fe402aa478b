#include "tandem/bench/step_bench.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/fs.h"
#include "tandem/core/stats.h"
#include "tandem/core/strings.h"
#include "tandem/io/hf.h"
#include "tandem/memory/activation_choice.h"
#include "tandem/memory/pinned.h"
#include "tandem/memory/plan.h"
#include "tandem/models/autocast.h"
#include "tandem/models/model.h"
#include "tandem/models/spec.h"
#include "tandem/run/run_setup.h"

namespace tandem {

int run_step_bench(const Config& given, const std::string& json_path, const std::string& model_json) {
  const torch::Device device = resolve_device(given.train.device);
  const ModelSpec spec = resolve_model_spec(given.model);
  const int64_t T = given.train.seq_len > 0 ? given.train.seq_len : std::min<int64_t>(spec.max_seq_len, 2048);
  // Note [Automatic activation offload]; the host room is not checked here.
  const Config cfg = resolve_activation_offload(given, spec, T, device, -1);
  TANDEM_CHECK(cfg.train.steps >= 3, "bench step needs --steps >= 3 (two untimed), got ", cfg.train.steps);
  if (!json_path.empty()) {  // refused before anything runs, not found unwritable after the timing
    std::ofstream probe(json_path, std::ios::app);
    TANDEM_CHECK(probe.good(), "cannot write --json '", json_path, "'; choose a writable path");
  }
  if (!model_json.empty()) write_file_atomic(model_json, hf_config_json(spec));
  const int64_t B = cfg.train.micro_batch;
  const auto dtype = compute_dtype(cfg.train.precision);
  if (device.is_cuda()) at::globalContext().setFloat32MatmulPrecision(cfg.train.tf32 ? "high" : "highest");
  torch::manual_seed(cfg.train.seed);
  auto model = build_model(spec, cfg.model.checkpointing);
  offload_activations(*model, cfg.model.activation_offload, device, pinned_slabs());  // Note [Activation offload]
  if (const auto* offload = model->activation_offload())
    offload->arena().reserve(offloaded_activation_bytes(spec, cfg, T));
  // The offload engine's device side: weights in the compute dtype (fp32 residual stream, Note
  // [fp32 residual stream]), gradients in the compute dtype, no master, no optimizer state.
  model->to(device, dtype);
  for (auto& b : model->buffers()) b.set_data(b.to(device));
  model->train();
  for (auto& p : model->parameters()) p.mutable_grad() = torch::zeros_like(p);
  auto tokens =
      torch::randint(0, spec.vocab_size, {B, T + 1}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  const auto in = tokens.narrow(1, 0, T), tgt = tokens.narrow(1, 1, T);
  const auto sync = [&] {
    if (device.is_cuda() && accelerator()) accelerator()->synchronize(device.index());
  };
  if (device.is_cuda() && accelerator()) accelerator()->reset_peak_memory(device.index());
  std::vector<double> times;
  double loss_v = 0;
  for (int64_t s = 0; s < cfg.train.steps; ++s) {
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    torch::Tensor loss;
    {
      AutocastGuard ac(device.type(), cfg.train.precision);
      loss = model->loss(model->forward(in), tgt);
    }
    loss.backward();
    for (auto& p : model->parameters()) p.mutable_grad().zero_();
    sync();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    loss_v = loss.item<double>();
    if (s >= 2) times.push_back(dt);
    std::printf("step %lld: %.1f ms (loss %.4f)%s\n", static_cast<long long>(s + 1), dt * 1e3, loss_v,
                s < 2 ? " untimed" : "");
  }
  const double med = median(times);
  const double tok_s = double(B * T) / med;
  const double n = double(spec.num_params_unpadded());
  const double tflops = 6.0 * n * tok_s / 1e12;
  const int64_t offload_per_step =
      model->activation_offload() ? model->activation_offload()->bytes() / std::max<int64_t>(cfg.train.steps, 1) : 0;
  const std::string offloaded =
      model->activation_offload()
          ? strprintf(", activations of %lld layers to the host (%s a step, %lld of %lld tensors back ahead, host slab %s, "
                      "%s outside it)",
                      (long long)cfg.model.activation_offload, format_bytes(double(offload_per_step)).c_str(),
                      (long long)model->activation_offload()->fetched_ahead(),
                      (long long)model->activation_offload()->tensors(),
                      format_bytes(double(model->activation_offload()->arena().capacity())).c_str(),
                      format_bytes(double(model->activation_offload()->arena().fallback_bytes())).c_str())
          : "";
  int64_t peak = 0;
  if (device.is_cuda() && accelerator()) peak = accelerator()->memory_stats(device.index()).peak_allocated;
  std::printf(
      "forward+backward only: %s, B=%lld, T=%lld%s%s: %.1f ms per step, %s tok/s, %.0f model TFLOP/s (6 N per "
      "token, N = %s), peak device %s\n",
      spec.name.c_str(), static_cast<long long>(B), static_cast<long long>(T),
      cfg.model.checkpointing ? ", checkpointing" : "", offloaded.c_str(), med * 1e3, format_count(tok_s).c_str(),
      tflops, format_count(n).c_str(), format_bytes(double(peak)).c_str());
  if (!json_path.empty()) {
    nlohmann::json j = {{"bench", "step"},
                        {"model", spec.name},
                        {"params", n},
                        {"batch", B},
                        {"seq", T},
                        {"checkpointing", cfg.model.checkpointing},
                        {"activation_offload", cfg.model.activation_offload},
                        {"activation_offload_bytes_per_step", offload_per_step},
                        {"activation_host_slab_bytes", model->activation_offload() ? model->activation_offload()->arena().capacity() : 0},
                        {"median_step_s", med},
                        {"tokens_per_s", tok_s},
                        {"model_tflops", tflops},
                        {"peak_device_bytes", peak},
                        {"loss", loss_v},
                        {"device", device.str()}};
    std::ofstream(json_path, std::ios::app) << j.dump() << "\n";
  }
  return 0;
}

}  // namespace tandem
