#include "tandem/run/trainer.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/fault.h"
#include "tandem/core/fs.h"
#include "tandem/core/interrupt.h"
#include "tandem/core/log.h"
#include "tandem/core/stats.h"
#include "tandem/core/strings.h"
#include "tandem/data/dataset.h"
#include "tandem/data/loader.h"
#include "tandem/engine/param_store.h"
#include "tandem/io/hf.h"
#include "tandem/memory/pinned.h"
#include "tandem/memory/plan.h"
#include "tandem/models/model.h"
#include "tandem/optim/optimizer.h"
#include "tandem/parallel/comm.h"
#include "tandem/parallel/data_parallel.h"
#include "tandem/parallel/grad_reducer.h"
#include "tandem/parallel/pipeline_checkpoint.h"
#include "tandem/parallel/pipeline_report.h"
#include "tandem/parallel/pipeline_step.h"
#include "tandem/run/checkpointer.h"
#include "tandem/run/engine_setup.h"
#include "tandem/run/lr_schedule.h"
#include "tandem/run/pipeline_setup.h"
#include "tandem/run/placement_driver.h"
#include "tandem/run/progress.h"
#include "tandem/run/run_metrics.h"
#include "tandem/run/step_runner.h"
#include "tandem/run/step_timer.h"
#include "tandem/run/trainable.h"

namespace fs = std::filesystem;

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

// Note [Peer loss]
// A rank that dies (killed, crashed, out of memory) breaks the collectives of the others mid-call
// with a transport error ("Connection reset by peer"). A survivor that catches any such failure
// asks the heartbeat which rank went silent (Comm::find_lost_rank) and reports that rank and how
// the run continues: the launcher's restart from the newest checkpoint while restarts remain,
// else --resume auto by hand. It exits with kExitPeerLost; the original error is kept when no
// rank is found lost.
void throw_if_peer_lost(Comm& comm, const std::string& what, const std::string& run_dir) {
  const int lost = comm.find_lost_rank();
  if (lost < 0) return;
  const RankInfo& ranks = comm.info();
  throw PeerLostError(strprintf("rank %d stopped (rank %d saw: %s); %s", lost, ranks.rank,
                                one_line(what).substr(0, 160).c_str(), how_the_run_continues(ranks, run_dir).c_str()));
}

// dist.balance=auto's row cap for this rank: the rows its device memory holds beside what it holds now.
double max_rows_on_device(const RunContext& ctx, const DataParallelRows& rows, double gpu_memory_fraction) {
  double max_rows = double(rows.global_rows());
  if (ctx.device_index < 0 || !accelerator()) return max_rows;
  const auto ms = accelerator()->memory_stats(ctx.device_index);
  // Activation memory per row from the step's peak over the memory held between steps.
  const double per_row = std::max(1.0, double(ms.peak_allocated - ms.allocated) / double(rows.rows()));
  const double room = double(ms.total) * gpu_memory_fraction - double(ms.peak_allocated);
  return std::min(max_rows, double(rows.rows()) + std::max(0.0, room) / per_row);
}

std::unique_ptr<BatchLoader> training_loader(const DataSplits& data, const RunPlan& plan, const RunContext& ctx,
                                             const DataParallelRows& rows) {
  return std::make_unique<BatchLoader>(data.train, rows.rows(), plan.seq_len, plan.cfg.train.seed, ctx.device,
                                       plan.cfg.data.prefetch, plan.spec.vocab_size, "training", rows.first_row());
}

// This rank's place among the data-parallel replicas (of its pipeline stage, Note [Pipeline parallel]).
RankInfo replica_view(const RunContext& ctx) {
  RankInfo r = ctx.ranks;
  if (ctx.comm) r.rank = ctx.comm->replica(), r.world_size = ctx.comm->replicas();
  return r;
}

// Rank 0 evaluates; with a pipeline, the first replica of every stage (Note [Pipeline parallel]).
std::unique_ptr<BatchLoader> held_out_loader(const DataSplits& data, const RunPlan& plan, const RunContext& ctx,
                                             bool pipelined) {
  const Config& cfg = plan.cfg;
  const bool evaluates = pipelined ? ctx.comm->replica() == 0 : ctx.main_rank();
  if (cfg.train.eval_every == 0 || !evaluates) return nullptr;
  if (data.val.size() >= plan.seq_len + 1)
    return std::make_unique<BatchLoader>(data.val, cfg.train.micro_batch, plan.seq_len, cfg.train.seed ^ 0x5eedull,
                                         ctx.device, cfg.data.prefetch, plan.spec.vocab_size, "held-out");
  log::warn(strprintf("no held-out data (data.val_fraction=%g leaves %lld tokens); evaluation is off",
                      cfg.data.val_fraction, static_cast<long long>(data.val.size())));
  return nullptr;
}

// The held-out loss: this rank's evaluation; with a pipeline every rank takes part and the first
// replicas of the stages hold it in parts (the last the cross-entropy, each its MoE balance loss).
double held_out_loss(StepRunner& runner, BatchLoader* val_loader, const Config& cfg, const RunContext& ctx,
                     const PipelineParts& pipeline) {
  const double loss = val_loader ? runner.evaluate(*val_loader, cfg.train.eval_batches) : 0.0;
  if (!pipeline.on()) return loss;
  const bool mine = pipeline.grid.replica() == 0;
  return ctx.comm->sum(mine ? loss : 0.0);
}

// The model, device, data and batch lines at the start of a run.
void log_run_header(const RunPlan& plan, const RunContext& ctx, const DataParallelRows& rows, const DataSplits& data,
                    int64_t tokens_per_step) {
  const ModelSpec& spec = plan.spec;
  log::info(strprintf("model %s (%s params, %lld layers, d_model %lld) on %s | %s | data: %s", spec.name.c_str(),
                      format_count(double(spec.num_params_unpadded())).c_str(), static_cast<long long>(spec.n_layer),
                      static_cast<long long>(spec.d_model), ctx.device.str().c_str(),
                      to_string(plan.cfg.train.precision), data.description.c_str()));
  const std::string ranks =
      ctx.comm ? strprintf(" | rows %lld .. %lld on rank %d of %d", static_cast<long long>(rows.first_row()),
                           static_cast<long long>(rows.first_row() + rows.rows() - 1), ctx.ranks.rank, ctx.world())
               : "";
  log::info(strprintf("batch %lld x %lld tokens x %lld accumulation = %lld tokens/step%s | run dir %s",
                      static_cast<long long>(rows.global_rows()), static_cast<long long>(plan.seq_len),
                      static_cast<long long>(plan.cfg.train.grad_accum), static_cast<long long>(tokens_per_step),
                      ranks.c_str(), plan.run_dir.c_str()));
}

// The progress bar's (or line's) view of a step: tokens/s over the last 20 steps, the ETA, skips.
ProgressSample progress_sample(const Config& cfg, int64_t step, double loss, double lr, const StepResult& r, double dt,
                               const std::vector<double>& step_times, int64_t tokens_per_step) {
  ProgressSample ps;
  ps.step = step, ps.total = cfg.train.steps, ps.loss = loss, ps.lr = lr;
  ps.tokens_per_s =
      tokens_per_step /
      median(std::vector<double>(step_times.end() - std::min<size_t>(step_times.size(), 20), step_times.end()));
  ps.step_time_s = dt;
  ps.eta_s = double(cfg.train.steps - step) * tokens_per_step / ps.tokens_per_s;
  const bool fp16 = cfg.train.precision == Precision::kFp16;
  if (r.skipped)
    ps.extra =
        fp16 ? strprintf("overflow, step skipped, scale %g", r.loss_scale) : "non-finite gradients, step skipped";
  else if (fp16)
    ps.extra = strprintf("scale %g", r.loss_scale);
  return ps;
}

// A step's metrics row: loss, rate, memory, and the step time split (Note [Step time split]).
nlohmann::json step_row(const TrainerState& state, double loss, double lr, const StepResult& r, double dt,
                        int64_t tokens_per_step, const StepPhases& phases, double t_s) {
  nlohmann::json row = step_metrics_row(state.step, loss, lr, r.grad_norm, dt, tokens_per_step, state.tokens_seen, t_s);
  row["time_forward_s"] = phases.forward_s;
  row["time_backward_s"] = phases.backward_s;
  row["time_update_s"] = phases.update_s;
  row["time_idle_s"] = phases.idle_s;
  return row;
}

// The run's last line: steps, loss, speed and peak memory, or that nothing was left to do.
void log_run_end(const TrainSummary& summary, double wall, int device_index, int64_t total_steps) {
  if (summary.losses.empty()) {
    log::info(strprintf("nothing to do: already at step %lld of train.steps=%lld",
                        static_cast<long long>(summary.final_step), static_cast<long long>(total_steps)));
    return;
  }
  log::info(
      strprintf("done: %lld steps in %s | loss %.4f -> %.4f%s | %s tok/s median | peak memory %s",
                static_cast<long long>(summary.final_step - summary.first_step), format_duration(wall).c_str(),
                summary.losses.front(), summary.losses.back(),
                summary.last_eval_loss >= 0 ? strprintf(" | eval %.4f", summary.last_eval_loss).c_str() : "",
                format_count(summary.median_tokens_per_s).c_str(),
                format_bytes(double(device_index >= 0 ? summary.peak_device_bytes : summary.peak_host_bytes)).c_str()));
}

// The run directory is made sure of before anything is built, the data opened.
DataSplits open_run_data(const RunPlan& plan) {
  DataSplits data = open_data(plan.cfg.data);
  ensure_writable_directory(plan.run_dir, "run directory");
  return data;
}

// The model with its first weights (the seed's, or model.init_from's for a new run), training.
std::shared_ptr<Model> build_run_model(const RunPlan& plan, const c10::Device& device, double& build_s) {
  const auto t_build = Clock::now();
  torch::manual_seed(plan.cfg.train.seed);
  // Note [Stage build]: a pipeline stage whose cut the config gives fills only its own Blocks.
  const auto& l = plan.layout;
  const auto fill = l.stages > 1 ? std::pair<size_t, size_t>(static_cast<size_t>(l.first), static_cast<size_t>(l.end))
                                 : std::pair<size_t, size_t>(0, std::numeric_limits<size_t>::max());
  auto model = build_model(plan.spec, plan.cfg.model.checkpointing, fill);
  offload_activations(*model, plan.cfg.model.activation_offload, device, pinned_slabs());
  if (const auto* offload = model->activation_offload())  // Note [Activation host arena]
    offload->arena().reserve(offloaded_activation_bytes(plan.spec, plan.cfg, plan.seq_len, plan.layout));
  build_s = std::chrono::duration<double>(Clock::now() - t_build).count();
  if (!plan.cfg.model.init_from.empty() && plan.resume_dir.empty()) {
    load_hf_weights(*model, plan.cfg.model.init_from);
    log::info("initialised from " + plan.cfg.model.init_from);
  }
  model->train();
  return model;
}

// One training run: its collaborators, each built from those declared above it (the model and its
// pipeline stage, the engine or optimizer that trains it, checkpoints, data, the step runner),
// and the step loop over them.
class TrainingRun {
 public:
  TrainingRun(RunContext& ctx, RunPlan plan);
  TrainSummary run();

 private:
  bool run_step(int64_t step);  // true: a stop was requested and the loop ends here
  nlohmann::json metrics_row(const StepResult& r, double loss, double lr, double dt, const StepPhases& phases);
  void rebalance(const StepPhases& phases);
  void evaluate();
  void checkpoint_between_steps();
  bool stops_after(bool stop_requested_now);
  void finish();

  RunContext& ctx_;
  RunPlan plan_;  // settled by open_pipeline where the partitioner cuts (Note [Plan layout]), then read-only
  const Config& cfg_ = plan_.cfg;
  const NumericsGuard numerics_;
  const DataSplits data_;
  double build_s_ = 0;
  std::shared_ptr<Model> model_;
  PipelineParts pipeline_;
  RunMetrics metrics_;
  Trainable trainable_;
  Progress progress_;
  Checkpointer checkpointer_;
  int64_t gathers_ = 0;  // Note [Pipeline checkpoints]
  TrainerState state_;
  DataParallelRows rows_;  // this rank's rows of each global micro-batch (Note [Data parallel])
  std::unique_ptr<BatchLoader> train_loader_, val_loader_;
  bool evaluates_ = false;
  int64_t tokens_per_step_ = 0;  // every rank's
  StepTimer timer_;
  StepRunner runner_;
  PipelineReport pipeline_report_;
  TrainSummary summary_;
  std::vector<double> step_times_, compute_s_;  // compute_s_: forward + backward per step (dist.balance=auto)
  int64_t tokens_run_ = 0;
};

TrainingRun::TrainingRun(RunContext& ctx, RunPlan plan)
    : ctx_(ctx),
      plan_(std::move(plan)),
      numerics_(cfg_.train, ctx.device),
      data_(open_run_data(plan_)),
      model_(build_run_model(plan_, ctx.device, build_s_)),
      pipeline_(open_pipeline(*model_, plan_, ctx)),  // Note [Pipeline parallel]
      metrics_(plan_, ctx, plan_.offload ? "offload engine" : "GPU-resident"),
      trainable_(build_trainable(*model_, pipeline_, plan_, ctx, metrics_, build_s_)),
      progress_(cfg_.train.progress, cfg_.train.log_every),
      checkpointer_(cfg_, plan_.run_dir, ctx, checkpoint_model(*model_), trainable_.optimizer(),
                    trainable_.offload.store.get(), trainable_.engine(),
                    {[this](const nlohmann::json& row) { metrics_.publish(row); },
                     [this](const std::string& line) { progress_.message(line); }}),
      state_(checkpointer_.resume(plan_.resume_dir)),
      rows_(cfg_, replica_view(ctx)),
      train_loader_(training_loader(data_, plan_, ctx, rows_)),
      val_loader_(held_out_loader(data_, plan_, ctx, pipeline_.on())),
      timer_(ctx.device),
      runner_(
          plan_, ctx, *model_, trainable_.targets(), pipeline_.step.get(), timer_,
          [this](const nlohmann::json& row) { metrics_.publish(row); }, state_),
      pipeline_report_(pipeline_, *model_, cfg_, plan_.run_dir) {
  if (pipeline_.on())
    checkpointer_.set_before_write([this] {
      gather_pipeline_state(*ctx_.comm, pipeline_.grid, *pipeline_.blocks, *trainable_.gathered, *model_, gathers_++);
    });
  // Written only once the model, weights and checkpoint are known to be good, so a failed
  // resume leaves the run directory's files as they were.
  if (ctx.main_rank()) {
    write_file_atomic((fs::path(plan_.run_dir) / "config.yaml").string(), config_to_yaml(cfg_));
    write_file_atomic((fs::path(plan_.run_dir) / "model_config.json").string(), hf_config_json(plan_.spec));
  }
  if (ctx.comm) ctx.comm->set_run_dir(plan_.run_dir);  // for the heartbeat's messages
  train_loader_->seek(state_.data_position);
  // With a pipeline every rank takes part in an evaluation that any does.
  evaluates_ = pipeline_.on() ? ctx.comm->sum(val_loader_ ? 1.0 : 0.0) > 0 : val_loader_ != nullptr;
  tokens_per_step_ = rows_.global_rows() * plan_.seq_len * cfg_.train.grad_accum;
  log_run_header(plan_, ctx, rows_, data_, tokens_per_step_);
}

TrainSummary TrainingRun::run() {
  summary_.run_dir = plan_.run_dir;
  summary_.first_step = state_.step;
  if (ctx_.device_index >= 0 && accelerator()) accelerator()->reset_peak_memory(ctx_.device_index);
  metrics_.start();
  for (int64_t step = state_.step; step < cfg_.train.steps; ++step)
    if (run_step(step)) break;
  finish();
  return summary_;
}

bool TrainingRun::run_step(int64_t step) {
  const auto t0 = Clock::now();
  const double lr = lr_at(cfg_.optim, step, cfg_.train.steps);
  const auto latest = metrics_.latest();
  const StepResult r = runner_.run(step, lr, *train_loader_, rows_.share(), latest ? &*latest : nullptr);
  double loss = r.loss;
  bool stop_now = stop_requested();
  if (ctx_.comm) {
    // The global batch's loss, and one decision to stop: every rank stops after the same step.
    const auto sums = ctx_.comm->sum({loss * rows_.share(), stop_now ? 1.0 : 0.0});
    loss = sums[0];
    stop_now = sums[1] > 0;
  }
  runner_.driver().pace();  // toward a GPU power budget (Note [Placement policies])
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  state_.step = step + 1;
  state_.tokens_seen += tokens_per_step_;
  tokens_run_ += tokens_per_step_;
  if (r.skipped) ++summary_.skipped_steps;
  summary_.losses.push_back(loss);
  step_times_.push_back(dt);

  const StepPhases phases = timer_.read(dt);
  metrics_.publish(metrics_row(r, loss, lr, dt, phases));
  fault_after_step(ctx_.ranks.rank, state_.step, ctx_.ranks.restart_count);  // Note [Test faults]
  rebalance(phases);
  progress_.update(progress_sample(cfg_, state_.step, loss, lr, r, dt, step_times_, tokens_per_step_));
  if (evaluates_ && state_.step % cfg_.train.eval_every == 0) evaluate();
  checkpoint_between_steps();
  return stops_after(stop_now);
}

// The step's metrics row: the trainer's fields, then the step driver's (memory, telemetry, the
// engine's counters, the placement policy's reading).
nlohmann::json TrainingRun::metrics_row(const StepResult& r, double loss, double lr, double dt,
                                        const StepPhases& phases) {
  nlohmann::json m = step_row(state_, loss, lr, r, dt, tokens_per_step_, phases, metrics_.since_start_s());
  if (ctx_.comm) m["dist_rows"] = rows_.all();
  if (pipeline_.on()) pipeline_report_.add_step(*ctx_.comm, state_.step, state_.step - summary_.first_step, dt, m);
  runner_.driver().complete_row(m, r, dt, tokens_per_step_, metrics_);
  return m;
}

// Note [Data parallel]: dist.balance=auto measures, then sizes each rank's rows once.
void TrainingRun::rebalance(const StepPhases& phases) {
  compute_s_.push_back(phases.forward_s + phases.backward_s);
  if (!ctx_.comm || !rows_.balances_at(state_.step, summary_.first_step)) return;
  std::string said;
  if (!rows_.rebalance(*ctx_.comm, median(compute_s_),
                       max_rows_on_device(ctx_, rows_, cfg_.offload.gpu_memory_fraction), &said))
    return;
  log::info("dist.balance=auto: " + said);
  const int64_t pos = train_loader_->position();
  train_loader_ = training_loader(data_, plan_, ctx_, rows_);
  train_loader_->seek(pos);
}

void TrainingRun::evaluate() {
  summary_.last_eval_loss = held_out_loss(runner_, val_loader_.get(), cfg_, ctx_, pipeline_);
  metrics_.publish({{"step", state_.step}, {"eval_loss", summary_.last_eval_loss}});
  progress_.message(
      strprintf("step %lld | eval loss %.4f", static_cast<long long>(state_.step), summary_.last_eval_loss));
}

void TrainingRun::checkpoint_between_steps() {
  if (cfg_.train.checkpoint_every > 0 && state_.step % cfg_.train.checkpoint_every == 0 &&
      state_.step < cfg_.train.steps) {
    state_.data_position = train_loader_->position();
    runner_.driver().save_scaler(state_);
    checkpointer_.write(state_, true);
  }
  checkpointer_.collect(false);
}

// Note [Stopping on a signal]
// SIGINT/SIGTERM set a flag (core/interrupt.h); the step in flight finishes, the loop stops
// here, a checkpoint is written whatever train.save_final says, and the run ends normally
// (exit 0), so `--resume` continues exactly. A second signal ends the process at once.
bool TrainingRun::stops_after(bool stop_requested_now) {
  if (!stop_requested_now || state_.step >= cfg_.train.steps) return false;
  summary_.interrupted = true;
  log::warn(strprintf("stop requested: stopping after step %lld of %lld", static_cast<long long>(state_.step),
                      static_cast<long long>(cfg_.train.steps)));
  return true;
}

// The end: a last evaluation, the final checkpoint, summary.json.
void TrainingRun::finish() {
  progress_.finish();
  if (OffloadEngine* engine = trainable_.engine()) engine->finish_trace();  // a traced last step: written now
  const double wall = metrics_.since_start_s();
  if (evaluates_ && !summary_.interrupted && state_.step > summary_.first_step &&
      (summary_.last_eval_loss < 0 || state_.step % cfg_.train.eval_every != 0)) {
    summary_.last_eval_loss = held_out_loss(runner_, val_loader_.get(), cfg_, ctx_, pipeline_);
    metrics_.publish({{"step", state_.step}, {"eval_loss", summary_.last_eval_loss}});
  }
  state_.data_position = train_loader_->position();
  runner_.driver().save_scaler(state_);
  checkpointer_.finish(state_, (cfg_.train.save_final || summary_.interrupted) && state_.step > summary_.first_step);
  summary_.last_checkpoint = checkpointer_.last();
  summary_.checkpoint_error = checkpointer_.error();
  summary_.unsaved = checkpointer_.unsaved();
  summary_.final_step = state_.step;
  summary_.oom_retries = runner_.oom_retries();
  add_speed_and_memory(summary_, step_times_, tokens_per_step_, ctx_.device_index);
  PlacementDriver* placement = trainable_.offload.placement.get();
  metrics_.write_summary(summary_, plan_, ctx_, tokens_run_, tokens_per_step_, wall,
                         placement ? placement->summary() : nlohmann::json());
  if (ctx_.comm) {
    // Every rank stops its heartbeat before rank 0, which serves the store, may exit.
    ctx_.comm->stop_heartbeat();
    ctx_.comm->barrier();
  }
  metrics_.finish();
  log_run_end(summary_, wall, ctx_.device_index, cfg_.train.steps);
}

TrainSummary train_in(RunContext& ctx, Config user_cfg, const TrainOptions& options) {
  return TrainingRun(ctx, resolve_run_plan(std::move(user_cfg), options, ctx)).run();
}

}  // namespace

TrainSummary train(Config cfg, const TrainOptions& options) {
  validate_config(cfg);
  RunContext ctx = open_run_context(cfg);
  const std::string run_dir = cfg.train.run_dir;
  try {
    return train_in(ctx, std::move(cfg), options);
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) {
    if (ctx.comm) throw_if_peer_lost(*ctx.comm, e.what(), run_dir);
    throw;
  }
}

}  // namespace tandem
