#include "tandem/run/step_runner.h"

#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/fault.h"
#include "tandem/core/strings.h"
#include "tandem/data/loader.h"
#include "tandem/models/autocast.h"
#include "tandem/models/model.h"
#include "tandem/parallel/comm.h"
#include "tandem/parallel/pipeline_step.h"
#include "tandem/run/run_plan.h"
#include "tandem/run/run_setup.h"
#include "tandem/run/step_timer.h"

namespace tandem {

namespace {

// Note [Pipeline parallel]: a stage's norm is one part of the global norm.
StepTargets with_pipeline_norm(StepTargets t, PipelineStep* pipeline, const RunContext& ctx) {
  if (pipeline) t.global_norm = [&ctx](const torch::Tensor& n) { return pipeline_global_norm(*ctx.comm, n); };
  return t;
}

}  // namespace

StepRunner::StepRunner(const RunPlan& plan, const RunContext& ctx, Model& model, StepTargets targets,
                       PipelineStep* pipeline, StepTimer& timer, std::function<void(const nlohmann::json&)> publish,
                       const TrainerState& state)
    : plan_(plan),
      ctx_(ctx),
      model_(model),
      pipeline_(pipeline),
      timer_(timer),
      fopts_(torch::TensorOptions().dtype(torch::kFloat32).device(ctx.device)),
      replicas_(ctx.comm ? ctx.comm->replicas() : 1),
      driver_(plan.cfg, ctx, with_pipeline_norm(std::move(targets), pipeline, ctx), state, std::move(publish)) {}

// Note [Adaptive micro-batch]: after an out-of-memory error the loader rewinds to the step's first
// micro-batch and the step runs again, its micro-batches cut into more parts.
StepResult StepRunner::run(int64_t step, double lr, BatchLoader& loader, double rank_share,
                           const TelemetrySample* latest) {
  torch::Tensor loss_sum;
  const int64_t data_pos0 = loader.position();
  driver_.begin_step(step, lr, latest);
  for (bool first = true;; first = false) {
    timer_.begin();
    loss_sum = torch::zeros({}, fopts_);
    if (!first) driver_.restart_step(lr);
    if (pipeline_) {
      accumulate_pipeline(step, loader, rank_share, loss_sum);
      break;
    }
    try {
      accumulate(step, loader, rank_share, loss_sum);
      break;
    } catch (const c10::OutOfMemoryError& e) {
      driver_.abandon();
      driver_.retry_smaller(step, one_line(e.what_without_backtrace()), plan_.cfg.train.micro_batch);
      loader.seek(data_pos0);
    }
  }
  driver_.update(lr);
  timer_.mark(StepTimer::Phase::kUpdate);
  return driver_.read(loss_sum / double(plan_.cfg.train.grad_accum), step);
}

void StepRunner::accumulate(int64_t step, BatchLoader& loader, double rank_share, torch::Tensor& loss_sum) {
  const TrainConfig& train = plan_.cfg.train;
  const int world = replicas_;
  for (int64_t micro = 0; micro < train.grad_accum; ++micro) {
    Batch b = loader.next();
    const int64_t rows = b.inputs.size(0), parts = driver_.split().parts(rows);
    for (int64_t part = 0; part < parts; ++part) {
      driver_.begin_micro(micro + 1 == train.grad_accum && part + 1 == parts);
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
      driver_.scale_loss(scaled).backward();
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
  const auto scaled = [&](const torch::Tensor& loss, int64_t) { return driver_.scale_loss(loss * weight); };
  const auto before_backward = [&](bool last) { driver_.begin_micro(last); };
  try {
    loss_sum += pipeline_->run(batches, scaled, before_backward);
  } catch (const c10::OutOfMemoryError& e) {
    TANDEM_FAIL("out of memory at step ", step + 1, " in pipeline stage ", pipeline_->grid().stage(), " (",
                one_line(e.what_without_backtrace()),
                "); lower train.micro_batch, set model.checkpointing=true or use more dist.pipeline_stages");
  }
  timer_.mark(StepTimer::Phase::kBackward);
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
