#include "tandem/run/step_runner.h"

#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/fault.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/data/loader.h"
#include "tandem/engine/offload_engine.h"
#include "tandem/models/autocast.h"
#include "tandem/models/model.h"
#include "tandem/optim/optimizer.h"
#include "tandem/parallel/comm.h"
#include "tandem/parallel/grad_reducer.h"
#include "tandem/parallel/pipeline_step.h"
#include "tandem/run/resident_update.h"
#include "tandem/run/run_plan.h"
#include "tandem/run/run_setup.h"
#include "tandem/run/step_timer.h"

namespace tandem {

StepRunner::StepRunner(const RunPlan& plan, const RunContext& ctx, Model& model, std::vector<torch::Tensor> params,
                       Optimizer& optimizer, OffloadEngine* engine, GradReducer* reducer, PipelineStep* pipeline,
                       StepTimer& timer, std::function<void(const nlohmann::json&)> publish, const TrainerState& state)
    : plan_(plan),
      ctx_(ctx),
      model_(model),
      optimizer_(optimizer),
      engine_(engine),
      reducer_(reducer),
      pipeline_(pipeline),
      timer_(timer),
      publish_(std::move(publish)),
      fp16_(plan.cfg.train.precision == Precision::kFp16),
      fopts_(torch::TensorOptions().dtype(torch::kFloat32).device(ctx.device)),
      params_(std::move(params)),
      replicas_(ctx.comm ? ctx.comm->replicas() : 1) {
  scale_ = torch::full({1}, state.loss_scale, fopts_);
  growth_tracker_ =
      torch::full({1}, state.growth_tracker, torch::TensorOptions().dtype(torch::kInt32).device(ctx.device));
}

// Note [Adaptive micro-batch]
// An out-of-memory error in a forward or backward gives the step up (the engine undoes what it
// began), frees the cache, rewinds the loader to the step's first micro-batch and runs the step
// again with each micro-batch cut into twice as many parts: the micro-batch halves, the
// accumulation doubles, and the step sees the same samples with the same weights (each part's
// loss weighted by its share of rows), so only the summation order differs. After
// train.oom_grow_after clean steps the parts halve again. At micro-batch 1 the plan cannot fit.
StepResult StepRunner::run(int64_t step, double lr, BatchLoader& loader, double rank_share) {
  const TrainConfig& train = plan_.cfg.train;
  torch::Tensor loss_sum;
  const int64_t data_pos0 = loader.position();
  for (;;) {
    timer_.begin();
    loss_sum = torch::zeros({}, fopts_);
    if (engine_) engine_->begin_step(lr, fp16_ ? scale_.item<double>() : 1.0);
    if (pipeline_) {
      accumulate_pipeline(step, loader, rank_share, loss_sum);
      break;
    }
    try {
      accumulate(step, loader, rank_share, loss_sum);
      break;
    } catch (const c10::OutOfMemoryError& e) {
      retry_after_oom(step, one_line(e.what_without_backtrace()), loader, data_pos0);
    }
  }
  torch::Tensor found_inf = torch::zeros({}, fopts_), norm;
  update(lr, norm, found_inf);
  if (fp16_) update_loss_scale(scale_, growth_tracker_, found_inf, plan_.cfg.scaler);
  timer_.mark(StepTimer::Phase::kUpdate);
  // One host synchronisation per step: where a rank waits for the GPU's work and its collectives.
  const Comm::Waiting waiting(ctx_.comm.get(), strprintf("the end of step %lld (the GPU's work and its collectives)",
                                                         static_cast<long long>(step + 1)));
  auto host = torch::stack({loss_sum / double(train.grad_accum), norm.to(torch::kFloat32), found_inf, scale_.squeeze()})
                  .to(torch::kCPU, torch::kFloat64);
  StepResult r;
  r.loss = host[0].item<double>();
  r.grad_norm = host[1].item<double>();
  r.skipped = host[2].item<double>() != 0.0;
  r.loss_scale = host[3].item<double>();
  return r;
}

void StepRunner::accumulate(int64_t step, BatchLoader& loader, double rank_share, torch::Tensor& loss_sum) {
  const TrainConfig& train = plan_.cfg.train;
  const int world = replicas_;
  for (int64_t micro = 0; micro < train.grad_accum; ++micro) {
    Batch b = loader.next();
    const int64_t rows = b.inputs.size(0), parts = std::min(oom_parts_, rows);
    for (int64_t part = 0; part < parts; ++part) {
      const bool last = micro + 1 == train.grad_accum && part + 1 == parts;
      if (engine_) engine_->begin_micro(last);
      if (reducer_) reducer_->begin_micro(last);
      const int64_t r0 = rows * part / parts, r1 = rows * (part + 1) / parts;
      const torch::Tensor inputs = parts == 1 ? b.inputs : b.inputs.narrow(0, r0, r1 - r0);
      const torch::Tensor targets = parts == 1 ? b.targets : b.targets.narrow(0, r0, r1 - r0);
      TORCH_CHECK_WITH(OutOfMemoryError, !fault_oom(inputs.numel()), "injected out-of-memory: ", inputs.numel(),
                       " tokens in a micro-batch (TANDEM_FAULTS, Note [Test faults])");
      const double share = double(r1 - r0) / double(rows);
      torch::Tensor loss;
      {
        AutocastGuard ac(ctx_.device.type(), train.precision);
        loss = model_.loss(model_.forward(inputs), targets);
      }
      timer_.mark(StepTimer::Phase::kForward);
      // Gradients accumulate in the fp32 .grad of the fp32 parameters (autocast casts weights
      // per op; their gradients arrive in fp32), so accumulation adds no rounding beyond fp32.
      // Note [Data parallel]: weighted by this rank's share of the global batch; the ranks' sum is its mean.
      torch::Tensor scaled =
          world == 1 ? (parts == 1 ? loss / double(train.grad_accum) : loss * (share / double(train.grad_accum)))
                     : loss * (share * rank_share / double(train.grad_accum));
      if (fp16_) scaled = scaled * scale_;
      scaled.backward();
      loss_sum += parts == 1 ? loss.detach() : loss.detach() * share;
      timer_.mark(StepTimer::Phase::kBackward);
    }
  }
}

// Note [Pipeline parallel]: the step's micro-batches through this stage in the schedule's order;
// each loss weighted as accumulate() weights it. An out-of-memory error ends the run: the stages
// cannot retry one step together, so the fix is a smaller micro-batch or more stages.
void StepRunner::accumulate_pipeline(int64_t step, BatchLoader& loader, double rank_share, torch::Tensor& loss_sum) {
  const TrainConfig& train = plan_.cfg.train;
  std::vector<Batch> batches;
  for (int64_t micro = 0; micro < train.grad_accum; ++micro) batches.push_back(loader.next());
  const double weight = (replicas_ == 1 ? 1.0 : rank_share) / double(train.grad_accum);
  const auto scaled = [&](const torch::Tensor& loss, int64_t) {
    return fp16_ ? loss * weight * scale_ : loss * weight;
  };
  const auto before_backward = [&](bool last) {
    if (engine_) engine_->begin_micro(last);
    if (reducer_) reducer_->begin_micro(last);
  };
  try {
    loss_sum += pipeline_->run(batches, scaled, before_backward);
  } catch (const c10::OutOfMemoryError& e) {
    TANDEM_FAIL("out of memory at step ", step + 1, " in pipeline stage ", pipeline_->grid().stage(), " (",
                one_line(e.what_without_backtrace()),
                "); lower train.micro_batch, set model.checkpointing=true or use more dist.pipeline_stages");
  }
  timer_.mark(StepTimer::Phase::kBackward);
}

void StepRunner::retry_after_oom(int64_t step, const std::string& what, BatchLoader& loader, int64_t data_pos0) {
  const TrainConfig& train = plan_.cfg.train;
  TANDEM_CHECK(train.oom_retry, "out of memory at step ", step + 1, " (", what,
               "); lower train.micro_batch, set model.checkpointing=true, or set train.oom_retry=true");
  if (engine_) engine_->abandon_step();
  optimizer_.zero_grad();
  if (ctx_.device_index >= 0 && accelerator()) accelerator()->empty_cache(ctx_.device_index);
  loader.seek(data_pos0);
  TANDEM_CHECK(oom_parts_ * 2 <= train.micro_batch, "out of memory at step ", step + 1, " even at micro-batch ",
               train.micro_batch / oom_parts_, " (", what,
               "); lower train.seq_len, set model.checkpointing=true or offload.optimizer=cpu");
  oom_parts_ *= 2;
  oom_clean_steps_ = 0;
  ++oom_retries_;
  const int64_t mb = (train.micro_batch + oom_parts_ - 1) / oom_parts_;
  const int64_t tokens = train.micro_batch * replicas_ * plan_.seq_len * train.grad_accum;
  log::warn(
      strprintf("out of memory at step %lld: retrying it with micro-batch %lld x %lld accumulation "
                "(same %lld tokens per step)",
                static_cast<long long>(step + 1), static_cast<long long>(mb),
                static_cast<long long>(train.grad_accum * oom_parts_), static_cast<long long>(tokens)));
  publish_({{"step", step + 1},
            {"oom", what},
            {"micro_batch_effective", mb},
            {"grad_accum_effective", train.grad_accum * oom_parts_}});
}

void StepRunner::update(double lr, torch::Tensor& norm, torch::Tensor& found_inf) {
  if (engine_) {
    // Norm, clipping, the non-finite check and the GPU-updated Blocks (Note [Speculative clipping]).
    const StepOutcome out = engine_->end_step();
    norm = torch::full({}, out.grad_norm, fopts_);
    found_inf.fill_(out.skipped ? 1.0 : 0.0);
    return;
  }
  if (reducer_) reducer_->finish();  // every Block's gradient summed over the ranks
  std::function<torch::Tensor(const torch::Tensor&)> global_norm;
  if (pipeline_) global_norm = [this](const torch::Tensor& n) { return pipeline_global_norm(*ctx_.comm, n); };
  norm = resident_update(params_, optimizer_, lr, plan_.cfg.train.grad_clip,
                         fp16_ ? std::optional<torch::Tensor>(scale_) : std::nullopt, found_inf, global_norm);
}

void StepRunner::save_scaler(TrainerState& state) const {
  state.loss_scale = scale_.item<double>();
  state.growth_tracker = growth_tracker_.item<int64_t>();
}

void StepRunner::after_step(nlohmann::json& row) {
  if (oom_parts_ == 1) return;
  const TrainConfig& train = plan_.cfg.train;
  row["micro_batch_effective"] = (train.micro_batch + oom_parts_ - 1) / oom_parts_;
  if (train.oom_grow_after > 0 && ++oom_clean_steps_ >= train.oom_grow_after) {
    oom_parts_ /= 2;
    oom_clean_steps_ = 0;
    log::info(strprintf("%lld clean steps: trying micro-batch %lld again", static_cast<long long>(train.oom_grow_after),
                        static_cast<long long>((train.micro_batch + oom_parts_ - 1) / oom_parts_)));
  }
}

double StepRunner::evaluate(BatchLoader& loader, int64_t batches) {
  torch::NoGradGuard no_grad;
  model_.eval();
  loader.seek(0);
  torch::Tensor sum = torch::zeros({}, fopts_);
  if (pipeline_) {  // every stage evaluates its part of the loss (Note [Pipeline parallel])
    std::vector<Batch> all;
    for (int64_t i = 0; i < batches; ++i) all.push_back(loader.next());
    sum = pipeline_->evaluate(all);
  }
  for (int64_t i = 0; i < batches && !pipeline_; ++i) {
    Batch b = loader.next();
    AutocastGuard ac(ctx_.device.type(), plan_.cfg.train.precision);
    sum += model_.loss(model_.forward(b.inputs), b.targets).detach();
  }
  model_.train();
  return sum.item<double>() / double(batches);
}

}  // namespace tandem
