#include "tandem/run/step_driver.h"

#include <chrono>
#include <thread>

#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/optim/optimizer.h"
#include "tandem/parallel/comm.h"
#include "tandem/parallel/grad_reducer.h"
#include "tandem/run/placement_driver.h"
#include "tandem/run/resident_update.h"
#include "tandem/run/run_metrics.h"
#include "tandem/run/run_setup.h"

namespace tandem {

StepDriver::StepDriver(const Config& cfg, const RunContext& ctx, StepTargets targets, const TrainerState& state,
                       std::function<void(const nlohmann::json&)> publish)
    : cfg_(cfg),
      ctx_(ctx),
      t_(std::move(targets)),
      publish_(std::move(publish)),
      fp16_(cfg.train.precision == Precision::kFp16),
      fopts_(torch::TensorOptions().dtype(torch::kFloat32).device(ctx.device)),
      split_(cfg.train) {
  TANDEM_ASSERT(t_.optimizer, "a step without an optimizer");
  scale_ = torch::full({1}, 1.0, fopts_);
  growth_tracker_ = torch::zeros({1}, torch::TensorOptions().dtype(torch::kInt32).device(ctx.device));
  load_scaler(state);
}

void StepDriver::begin_step(int64_t step, double lr, const TelemetrySample* latest) {
  if (t_.placement) t_.placement->before_step(step + 1, latest);  // Note [Block placement]
  if (t_.engine) stats0_ = t_.engine->stats();                    // one locked copy
  restart_step(lr);
}

void StepDriver::restart_step(double lr) {
  if (t_.engine) t_.engine->begin_step(lr, fp16_ ? host_scale_ : 1.0);
}

void StepDriver::begin_micro(bool last) {
  if (t_.engine) t_.engine->begin_micro(last);
  if (t_.reducer) t_.reducer->begin_micro(last);
}

torch::Tensor StepDriver::scale_loss(const torch::Tensor& loss) const { return fp16_ ? loss * scale_ : loss; }

void StepDriver::update(double lr) {
  found_inf_ = torch::zeros({}, fopts_);
  if (t_.engine) {
    // Norm, clipping, the non-finite check and the GPU-updated Blocks (Note [Speculative clipping]).
    const StepOutcome out = t_.engine->end_step();
    norm_ = torch::full({}, out.grad_norm, fopts_);
    found_inf_.fill_(out.skipped ? 1.0 : 0.0);
  } else {
    if (t_.reducer) t_.reducer->finish();  // every Block's gradient summed over the ranks
    norm_ = resident_update(t_.params, *t_.optimizer, lr, cfg_.train.grad_clip,
                            fp16_ ? std::optional<torch::Tensor>(scale_) : std::nullopt, found_inf_, t_.global_norm);
  }
  if (fp16_) update_loss_scale(scale_, growth_tracker_, found_inf_, cfg_.scaler);
}

StepResult StepDriver::read(const torch::Tensor& loss, int64_t step) {
  TANDEM_ASSERT(norm_.defined(), "read() before update()");
  // One host synchronisation per step: where a rank waits for the GPU's work and its collectives.
  const Comm::Waiting wait(ctx_.comm.get(), strprintf("the end of step %lld (the GPU's work and its collectives)",
                                                      static_cast<long long>(step + 1)));
  const torch::Tensor loss_now = loss.detach().to(ctx_.device, torch::kFloat32).reshape({});
  auto host = torch::stack({loss_now, norm_.to(torch::kFloat32), found_inf_, scale_.squeeze()})
                  .to(torch::kCPU, torch::kFloat64);
  norm_ = found_inf_ = torch::Tensor();
  StepResult r;
  r.loss = host[0].item<double>();
  r.grad_norm = host[1].item<double>();
  r.skipped = host[2].item<double>() != 0.0;
  r.loss_scale = host_scale_ = host[3].item<double>();
  return r;
}

void StepDriver::abandon() {
  if (t_.engine)
    t_.engine->abandon_step();
  else
    t_.optimizer->zero_grad();
  norm_ = found_inf_ = torch::Tensor();
  if (ctx_.device_index >= 0 && accelerator()) accelerator()->empty_cache(ctx_.device_index);
}

void StepDriver::retry_smaller(int64_t step, const std::string& what, int64_t rows) {
  split_.split_further(step, what, rows);
  const int64_t accumulation = split_.accumulation(cfg_.train.grad_accum);
  log::warn(
      strprintf("out of memory at step %lld: retrying it with micro-batch %lld x %lld accumulation (the same "
                "samples)",
                static_cast<long long>(step + 1), static_cast<long long>(split_.part_rows()),
                static_cast<long long>(accumulation)));
  publish_({{"step", step + 1},
            {"oom", what},
            {"micro_batch_effective", split_.part_rows()},
            {"grad_accum_effective", accumulation}});
}

void StepDriver::pace() const {
  if (t_.placement && t_.placement->pace_s() > 0)
    std::this_thread::sleep_for(std::chrono::duration<double>(t_.placement->pace_s()));
}

void StepDriver::complete_row(nlohmann::json& row, const StepResult& r, double step_s, int64_t tokens,
                              RunMetrics& metrics) {
  add_device_memory_row(row, ctx_.device_index);
  if (fp16_) row["loss_scale"] = r.loss_scale;
  bool grew = false;
  if (const int64_t part_rows = split_.after_step(&grew); part_rows > 0) row["micro_batch_effective"] = part_rows;
  if (grew)
    log::info(strprintf("%lld clean steps: trying micro-batch %lld again",
                        static_cast<long long>(cfg_.train.oom_grow_after), static_cast<long long>(split_.part_rows())));
  if (r.skipped) row["skipped"] = true;
  const auto [gpu_j, cpu_j] = metrics.add_telemetry(row, tokens);
  if (t_.engine && t_.store) add_engine_row(row, *t_.engine, *t_.store, stats0_);
  if (t_.placement) t_.placement->after_step(step_s, gpu_j, cpu_j, row);
}

void StepDriver::save_scaler(TrainerState& state) const {
  state.loss_scale = scale_.item<double>();
  state.growth_tracker = growth_tracker_.item<int64_t>();
}

void StepDriver::load_scaler(const TrainerState& state) {
  scale_.fill_(state.loss_scale);
  growth_tracker_.fill_(state.growth_tracker);
  host_scale_ = state.loss_scale;
}

}  // namespace tandem
