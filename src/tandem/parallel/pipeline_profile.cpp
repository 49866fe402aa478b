#include "tandem/parallel/pipeline_profile.h"

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <optional>

#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/stats.h"
#include "tandem/core/strings.h"
#include "tandem/memory/estimate.h"
#include "tandem/memory/plan.h"
#include "tandem/models/autocast.h"
#include "tandem/models/model.h"
#include "tandem/monitor/nvml.h"
#include "tandem/parallel/pipeline_grid.h"

namespace tandem {

// Note [Pipeline profile]
// The partitioner (Note [Pipeline partition]) needs, per Block and for one micro-batch, its
// forward and backward time on one device, its bytes on a stage's device and what it sends on;
// and per device, its speed and free memory. Before any stage exists, each Block is run alone,
// in order, on the profile's device: its input is the previous Block's output (tokens for the
// embedding), it runs through Model::forward_blocks under the run's autocast (AutocastGuard), so
// decoder layers are recomputed in the backward when model.checkpointing is on, and its backward
// starts from a random output gradient (the head's from the loss). One untimed run, then the
// median of three, each between two device synchronisations: a stage runs the same kernels for
// one micro-batch, launch costs included. The placement profiler (Note [Placement profiles])
// measures Blocks the same way but inside a running step under the offload engine, which a
// pipeline has not built yet.
// Bytes: static = parameters x bytes per parameter as the run keeps them on the device: fp32
// weights and gradients and the optimizer's fp32 states, or under offload.optimizer=cpu the
// compute-dtype weights and gradients alone. Activations kept per micro-batch in flight: on a GPU
// the caching allocator's growth over the forward (output included: the next Block keeps it, or
// the stage keeps it for the backward that comes back); on the CPU, which keeps no count, the
// memory estimate's share of the Block (estimate_training_memory). Output: the activation sent to
// the next stage.
// A device's speed is how many times per second it runs the probe Block (the middle decoder layer,
// on a random fp32 residual-stream input of the micro-batch's shape), so a list of devices made
// relative to the first (relative_to_first) says how much faster each is than the profile's.
// A GPU's power while it computes is NVML's energy counter over half a second of probe runs.

namespace {

using Clock = std::chrono::steady_clock;

// The weights' dtype on a stage's device: the compute dtype under offload, else fp32 masters.
torch::ScalarType weight_dtype(const Config& cfg) {
  return cfg.offload.optimizer == OffloadTarget::kCpu ? compute_dtype(cfg.train.precision) : torch::kFloat32;
}

int64_t optimizer_states(const OptimConfig& o) {
  switch (o.type) {
    case OptimizerType::kAdamW:
    case OptimizerType::kAdam:
      return 2;
    case OptimizerType::kLion:
      return 1;
    case OptimizerType::kSgd:
      return o.momentum > 0 ? 1 : 0;
  }
  return 2;
}

// Bytes per parameter on a stage's device (Note [Pipeline profile]).
int64_t static_bytes_per_param(const Config& cfg) {
  const int64_t w = torch::elementSize(weight_dtype(cfg));
  if (cfg.offload.optimizer == OffloadTarget::kCpu) return 2 * w;
  return 2 * w + 4 * optimizer_states(cfg.optim);
}

void synchronize(const c10::Device& device) {
  if (device.is_cuda() && accelerator()) accelerator()->synchronize(device.index());
}

int64_t allocated(const c10::Device& device) {
  return device.is_cuda() && accelerator() ? accelerator()->memory_stats(device.index()).allocated : -1;
}

// Block i's tensors on `device` for a measurement, put back as they were on exit (values,
// devices, dtypes, gradients): the model is the run's. The tied head also takes the embedding's
// matrix, which it reads.
class BlockOnDevice {
 public:
  BlockOnDevice(Model& model, size_t i, const c10::Device& device, torch::ScalarType dtype) {
    torch::NoGradGuard no_grad;
    for (auto& p : model.blocks()[i]->parameters()) take(p, device, dtype);
    if (i + 1 == model.block_count() && model.spec().tie_embeddings)
      for (auto& p : model.blocks()[0]->parameters()) take(p, device, dtype);
    for (auto& b : model.blocks()[i]->buffers()) take(b, device, b.scalar_type());
  }
  ~BlockOnDevice() {
    for (auto& s : saved_) {
      s.tensor.set_data(s.data);
      if (s.tensor.requires_grad()) s.tensor.mutable_grad() = s.grad;
    }
  }
  BlockOnDevice(const BlockOnDevice&) = delete;
  BlockOnDevice& operator=(const BlockOnDevice&) = delete;

 private:
  struct Saved {
    torch::Tensor tensor, data, grad;
  };
  void take(torch::Tensor& t, const c10::Device& device, torch::ScalarType dtype) {
    saved_.push_back({t, t.data(), t.requires_grad() ? t.grad() : torch::Tensor()});
    if (t.requires_grad()) t.mutable_grad() = torch::Tensor();
    t.set_data(t.data().to(device, t.is_floating_point() ? dtype : t.scalar_type(), /*non_blocking=*/false,
                           /*copy=*/true));
  }
  std::vector<Saved> saved_;
};

// The last stage's loss. A mixture-of-experts model's Model::loss adds every layer's load-balance
// loss of the forward that made the logits, whose graphs the profile's per-Block backward has
// already freed: its profile takes the cross-entropy alone (the load-balance terms cost little).
torch::Tensor head_loss(Model& model, const torch::Tensor& logits, const torch::Tensor& targets) {
  const auto& s = model.spec();
  if ((s.arch != Arch::kResNetBk && s.arch != Arch::kAmxMoe) || s.moe_aux_weight <= 0)
    return model.loss(logits, targets);
  return torch::nn::functional::cross_entropy(
      logits.narrow(-1, 0, s.vocab_size).reshape({-1, s.vocab_size}).to(torch::kFloat32), targets.reshape({-1}));
}

// One Block's measurement.
struct BlockRun {
  double seconds = 0;
  int64_t kept_bytes = -1;  // -1: the device keeps no count
  torch::Tensor output;     // detached
};

// Block i on `input` (on `device`), forward and backward: one untimed run, then the median of
// `timed` (Note [Pipeline profile]).
BlockRun run_block(Model& model, size_t i, const torch::Tensor& input, const Config& cfg, const c10::Device& device,
                   int timed) {
  const bool last = i + 1 == model.block_count();
  const torch::Tensor x = input.is_floating_point() ? input.detach().requires_grad_(true) : input;
  const auto& spec = model.spec();
  const auto targets = last ? torch::randint(0, spec.vocab_size, {input.size(0), input.size(1)},
                                             torch::TensorOptions().dtype(torch::kInt64).device(device))
                            : torch::Tensor();
  BlockRun run;
  torch::Tensor out_grad;
  std::vector<double> times;
  for (int r = 0; r <= timed; ++r) {
    synchronize(device);
    const int64_t before = allocated(device);
    const auto t0 = Clock::now();
    torch::Tensor y, loss;
    {
      AutocastGuard autocast(device.type(), cfg.train.precision);
      y = model.forward_blocks(x, i, i + 1);
      if (last) loss = head_loss(model, y, targets);
    }
    if (r == 1 && before >= 0) {
      synchronize(device);
      run.kept_bytes = allocated(device) - before;
    }
    if (last) {
      loss.backward();
    } else {
      if (!out_grad.defined()) out_grad = torch::randn_like(y) * 1e-3;
      y.backward(out_grad);
    }
    synchronize(device);
    if (r > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (r == timed) run.output = y.detach();
  }
  run.seconds = median(times);
  return run;
}

// Activation bytes per micro-batch of Block i by the memory estimate (the CPU keeps no count):
// the embedding's output, a decoder layer's saved tensors (its input alone when checkpointed),
// the head's logits.
int64_t estimated_activation_bytes(const Model& model, size_t i, const Config& cfg, int64_t seq_len) {
  const auto& s = model.spec();
  const int64_t B = cfg.train.micro_batch;
  const auto plain = estimate_training_memory(s, B, seq_len, cfg.train.precision, false);
  const auto kept = estimate_training_memory(s, B, seq_len, cfg.train.precision, true);
  const int64_t per_layer = plain.activations / s.n_layer;
  const int64_t layer_input = (kept.activations - per_layer) / s.n_layer;
  if (i == 0) return layer_input;
  if (i + 1 == model.block_count()) return plain.logits;
  return model.checkpointing() ? layer_input : per_layer;
}

int64_t parameter_count(Model& model, size_t i) {
  int64_t n = 0;
  for (const auto& [name, p] : model.block_parameters(i)) n += p.numel();
  return n;
}

// A random residual-stream input of one micro-batch for a decoder layer: (B, T, C) fp32.
torch::Tensor probe_input(const Model& model, const Config& cfg, int64_t seq_len, const c10::Device& device) {
  return torch::randn({cfg.train.micro_batch, seq_len, model.spec().d_model},
                      torch::TensorOptions().dtype(torch::kFloat32).device(device));
}

// The GPU's power while it runs the probe Block for half a second; none when NVML cannot say.
std::optional<double> busy_power_w(Model& model, const Config& cfg, const torch::Tensor& input,
                                   const c10::Device& device) {
  std::string why;
  const auto nvml = Nvml::open(&why);
  if (!nvml || !accelerator()) return std::nullopt;
  const int index = nvml->index_of_pci_bus_id(accelerator()->pci_bus_id(device.index()));
  if (index < 0) return std::nullopt;
  const size_t probe = speed_probe_block(model);
  synchronize(device);
  const auto e0 = nvml->energy_j(index);
  const auto t0 = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - t0).count() < 0.5) run_block(model, probe, input, cfg, device, 1);
  const auto e1 = nvml->energy_j(index);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!e0 || !e1 || *e1 <= *e0) return std::nullopt;
  return (*e1 - *e0) / s;
}

// Memory a stage may use on `device`: a GPU's free memory less the workspace reserve (its cache
// emptied first), the host's MemAvailable.
int64_t free_bytes(const c10::Device& device) {
  if (!device.is_cuda()) return host_available_bytes();
  if (!accelerator()) return 0;
  accelerator()->empty_cache(device.index());
  return std::max<int64_t>(0, accelerator()->memory_stats(device.index()).free - kGpuWorkspaceReserveBytes);
}

std::string device_list(const std::vector<PipelineDevice>& devices) {
  std::vector<std::string> parts;
  for (const auto& d : devices) {
    const std::string power = d.busy_w ? strprintf(", %.0f W busy", *d.busy_w) : std::string();
    parts.push_back(strprintf("%s (speed %.2f, %s free%s)", d.name.c_str(), d.speed,
                              format_bytes(double(d.memory_bytes)).c_str(), power.c_str()));
  }
  return join(parts, ", ");
}

}  // namespace

size_t speed_probe_block(const Model& model) {
  const auto layers = static_cast<size_t>(model.spec().n_layer);
  return std::min(layers, 1 + layers / 2);
}

std::vector<PipelineBlockCost> profile_pipeline_blocks(Model& model, const Config& cfg, int64_t seq_len,
                                                       const c10::Device& device) {
  TANDEM_CHECK(seq_len > 0 && cfg.train.micro_batch > 0, "train.micro_batch=", cfg.train.micro_batch,
               " and sequence length ", seq_len, ": a pipeline profile needs both above 0; set them");
  const auto& spec = model.spec();
  const int64_t per_param = static_bytes_per_param(cfg);
  torch::Tensor x = torch::randint(0, spec.vocab_size, {cfg.train.micro_batch, seq_len},
                                   torch::TensorOptions().dtype(torch::kInt64).device(device));
  std::vector<PipelineBlockCost> out;
  for (size_t i = 0; i < model.block_count(); ++i) {
    BlockRun run;
    {
      const BlockOnDevice on(model, i, device, weight_dtype(cfg));
      run = run_block(model, i, x, cfg, device, /*timed=*/3);
    }
    PipelineBlockCost c;
    c.name = model.block_name(i);
    c.time_s = run.seconds;
    c.static_bytes = parameter_count(model, i) * per_param;
    c.activation_bytes = run.kept_bytes >= 0 ? run.kept_bytes : estimated_activation_bytes(model, i, cfg, seq_len);
    c.output_bytes = static_cast<int64_t>(run.output.nbytes());
    out.push_back(c);
    x = run.output;
  }
  return out;
}

PipelineDevice measure_pipeline_device(Model& model, const Config& cfg, int64_t seq_len, const c10::Device& device) {
  const size_t probe = speed_probe_block(model);
  const auto input = probe_input(model, cfg, seq_len, device);
  PipelineDevice d;
  d.name = device.str();
  {
    const BlockOnDevice on(model, probe, device, weight_dtype(cfg));
    d.speed = 1.0 / std::max(1e-9, run_block(model, probe, input, cfg, device, /*timed=*/3).seconds);
    if (device.is_cuda()) d.busy_w = busy_power_w(model, cfg, input, device);
  }
  d.memory_bytes = free_bytes(device);
  return d;
}

std::vector<PipelineDevice> visible_pipeline_gpus(Model& model, const Config& cfg, int64_t seq_len) {
  std::vector<PipelineDevice> out;
  if (!torch::cuda::is_available() || !accelerator()) return out;
  for (int i = 0; i < accelerator()->device_count(); ++i)
    out.push_back(
        measure_pipeline_device(model, cfg, seq_len, c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i))));
  return out;
}

PipelinePlan plan_from_profile(const std::vector<PipelineBlockCost>& blocks, const Config& cfg, int64_t seq_len,
                               const std::vector<PipelineDevice>& devices, bool tied, std::string* table) {
  const PipelinePlan plan = plan_pipeline_costs(blocks, cfg, devices, tied);
  if (table == nullptr) return plan;
  *table = strprintf("profile on %s: micro-batch %lld x %lld tokens, %s, activation checkpointing %s\n%s",
                     devices[0].name.c_str(), static_cast<long long>(cfg.train.micro_batch),
                     static_cast<long long>(seq_len), to_string(cfg.train.precision),
                     cfg.model.checkpointing ? "on" : "off", format_pipeline_profile(blocks).c_str());
  *table += strprintf("\ndevices: %s\n%lld micro-batches, %s schedule, dist.pipeline_stages=%s\n",
                      device_list(relative_to_first(devices)).c_str(), static_cast<long long>(cfg.train.grad_accum),
                      to_string(cfg.dist.pipeline_schedule), cfg.dist.pipeline_stages.c_str());
  *table += format_pipeline_plan(blocks, plan);
  return plan;
}

PipelinePlan plan_pipeline(Model& model, const Config& cfg, int64_t seq_len, const std::vector<PipelineDevice>& devices,
                           std::string* table) {
  TANDEM_CHECK(!devices.empty(), "no device to place pipeline stages on");
  const auto n = static_cast<int64_t>(model.block_count());
  const int64_t stages = pipeline_stage_count(cfg.dist);
  TANDEM_CHECK(stages <= n, "dist.pipeline_stages=", stages, " is more stages than the model's ", n,
               " Blocks; use at most ", n, " stages");
  const auto blocks = profile_pipeline_blocks(model, cfg, seq_len, c10::Device(devices[0].name));
  return plan_from_profile(blocks, cfg, seq_len, devices, model.spec().tie_embeddings, table);
}

std::optional<std::vector<int64_t>> configured_pipeline_cut(const DistConfig& dist, int64_t blocks) {
  const PipelineCut& cut = dist.pipeline_cut;
  if (cut.kind == PipelineCut::Kind::kPartitioner) return std::nullopt;
  int64_t stages = pipeline_stage_count(dist);
  if (cut.kind == PipelineCut::Kind::kEven) {
    TANDEM_CHECK(stages > 0, "dist.pipeline_cut=even needs a stage count; set dist.pipeline_stages=N");
    return even_pipeline_cut(stages, blocks);
  }
  if (stages == 0) stages = static_cast<int64_t>(cut.ends.size()) + 1;
  return given_pipeline_cut(cut.ends, stages, blocks);
}

std::vector<int64_t> pipeline_stage_ends(Model& model, const Config& cfg, int64_t seq_len,
                                         const std::vector<PipelineDevice>& devices, std::string* table) {
  if (auto cut = configured_pipeline_cut(cfg.dist, static_cast<int64_t>(model.block_count()))) return *cut;
  return stage_ends(plan_pipeline(model, cfg, seq_len, devices, table));
}

}  // namespace tandem
