#include "tandem/run/trainer.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

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
#include "tandem/dist/comm.h"
#include "tandem/dist/grad_reducer.h"
#include "tandem/engine/param_store.h"
#include "tandem/io/hf.h"
#include "tandem/models/model.h"
#include "tandem/optim/optimizer.h"
#include "tandem/run/checkpointer.h"
#include "tandem/run/data_parallel.h"
#include "tandem/run/engine_setup.h"
#include "tandem/run/lr_schedule.h"
#include "tandem/run/pipeline_checkpoint.h"
#include "tandem/run/pipeline_report.h"
#include "tandem/run/pipeline_setup.h"
#include "tandem/run/pipeline_step.h"
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

// The median step over steps after the first few (warm-up: allocator, cuDNN/cuBLAS heuristics), and peaks.
void add_speed_and_memory(TrainSummary& summary, const std::vector<double>& step_times, int64_t tokens_per_step,
                          int device_index) {
  std::vector<double> steady(step_times.begin() + std::min<size_t>(step_times.size() / 5, 5), step_times.end());
  summary.median_step_time_s = median(steady);
  summary.median_tokens_per_s = summary.median_step_time_s > 0 ? tokens_per_step / summary.median_step_time_s : 0;
  summary.peak_host_bytes = host_peak_rss_bytes();
  if (device_index >= 0 && accelerator())
    summary.peak_device_bytes = accelerator()->memory_stats(device_index).peak_allocated;
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

TrainSummary train_in(RunContext& ctx, Config user_cfg, const TrainOptions& options) {
  const RunPlan plan = resolve_run_plan(std::move(user_cfg), options, ctx);
  const Config& cfg = plan.cfg;
  const ModelSpec& spec = plan.spec;
  const NumericsGuard numerics(cfg.train, ctx.device);
  const DataSplits data = open_data(cfg.data);
  ensure_writable_directory(plan.run_dir, "run directory");

  // Model, weights, and the engine or optimizer that trains them.
  const auto t_build = Clock::now();
  torch::manual_seed(cfg.train.seed);
  auto model = build_model(spec, cfg.model.checkpointing);
  const double build_s = std::chrono::duration<double>(Clock::now() - t_build).count();
  if (!cfg.model.init_from.empty() && plan.resume_dir.empty()) {
    load_hf_weights(*model, cfg.model.init_from);
    log::info("initialised from " + cfg.model.init_from);
  }
  model->train();
  PipelineParts pipeline = open_pipeline(*model, plan, ctx);  // Note [Pipeline parallel]
  RunMetrics metrics(plan, ctx, plan.offload ? "offload engine" : "GPU-resident");
  Trainable trainable = build_trainable(*model, pipeline, plan, ctx, metrics, build_s);
  OffloadParts& offload = trainable.offload;
  OffloadEngine* engine = trainable.engine();

  Progress progress(cfg.train.progress, cfg.train.log_every);
  Checkpointer checkpointer(cfg, plan.run_dir, ctx, checkpoint_model(*model), trainable.optimizer(),
                            offload.store.get(), engine,
                            {[&](const nlohmann::json& row) { metrics.publish(row); },
                             [&](const std::string& line) { progress.message(line); }});
  int64_t gathers = 0;  // Note [Pipeline checkpoints]
  if (pipeline.on())
    checkpointer.set_before_write([&] {
      gather_pipeline_state(*ctx.comm, pipeline.grid, *pipeline.blocks, *trainable.gathered, *model, gathers++);
    });
  TrainerState state = checkpointer.resume(plan.resume_dir);
  // Written only once the model, weights and checkpoint are known to be good, so a failed
  // resume leaves the run directory's files as they were.
  if (ctx.main_rank()) {
    write_file_atomic((fs::path(plan.run_dir) / "config.yaml").string(), config_to_yaml(cfg));
    write_file_atomic((fs::path(plan.run_dir) / "model_config.json").string(), hf_config_json(spec));
  }

  // Data: this rank's rows of each global micro-batch (Note [Data parallel]); rank 0 evaluates.
  DataParallelRows rows(cfg, replica_view(ctx));
  std::unique_ptr<BatchLoader> train_loader = training_loader(data, plan, ctx, rows);
  train_loader->seek(state.data_position);
  std::unique_ptr<BatchLoader> val_loader = held_out_loader(data, plan, ctx, pipeline.on());
  // With a pipeline every rank takes part in an evaluation that any does.
  const bool evaluates = pipeline.on() ? ctx.comm->sum(val_loader ? 1.0 : 0.0) > 0 : val_loader != nullptr;
  const int64_t tokens_per_step = rows.global_rows() * plan.seq_len * cfg.train.grad_accum;  // every rank's
  log_run_header(plan, ctx, rows, data, tokens_per_step);

  StepTimer timer(ctx.device);
  StepRunner runner(
      plan, ctx, *model, trainable.params, trainable.optimizer(), engine, trainable.reducer.get(),
      pipeline.step.get(), timer, [&](const nlohmann::json& row) { metrics.publish(row); }, state);
  PipelineReport pipeline_report(pipeline, cfg.train.grad_accum);
  TrainSummary summary;
  summary.run_dir = plan.run_dir;
  summary.first_step = state.step;
  std::vector<double> step_times, compute_s;  // compute_s: forward + backward per step (dist.balance=auto)
  int64_t tokens_run = 0;
  if (ctx.device_index >= 0 && accelerator()) accelerator()->reset_peak_memory(ctx.device_index);
  metrics.start();

  for (int64_t step = state.step; step < cfg.train.steps; ++step) {
    const auto t0 = Clock::now();
    const double lr = lr_at(cfg.optim, step, cfg.train.steps);
    const EngineStats stats0 = engine ? engine->stats() : EngineStats{};  // one locked copy
    if (offload.placement) {
      const auto latest = metrics.latest();
      offload.placement->before_step(step + 1, latest ? &*latest : nullptr);
    }
    const StepResult r = runner.run(step, lr, *train_loader, rows.share());
    double loss = r.loss;
    bool stop_now = stop_requested();
    if (ctx.comm) {
      // The global batch's loss, and one decision to stop: every rank stops after the same step.
      const auto sums = ctx.comm->sum({loss * rows.share(), stop_now ? 1.0 : 0.0});
      loss = sums[0];
      stop_now = sums[1] > 0;
    }
    // Pacing toward a GPU power budget (Note [Placement policies]): the GPU idles, the step's time counts it.
    if (offload.placement && offload.placement->pace_s() > 0)
      std::this_thread::sleep_for(std::chrono::duration<double>(offload.placement->pace_s()));
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    state.step = step + 1;
    state.tokens_seen += tokens_per_step;
    tokens_run += tokens_per_step;
    if (r.skipped) ++summary.skipped_steps;
    summary.losses.push_back(loss);
    step_times.push_back(dt);

    // The step's metrics row.
    const StepPhases phases = timer.read(dt);
    nlohmann::json m = step_row(state, loss, lr, r, dt, tokens_per_step, phases, metrics.since_start_s());
    add_device_memory_row(m, ctx.device_index);
    if (cfg.train.precision == Precision::kFp16) m["loss_scale"] = r.loss_scale;
    runner.after_step(m);
    if (r.skipped) m["skipped"] = true;
    const auto [step_gpu_j, step_cpu_j] = metrics.add_telemetry(m, tokens_per_step);
    if (engine) add_engine_row(m, *engine, *offload.store, stats0);
    if (ctx.comm) m["dist_rows"] = rows.all();
    if (pipeline.on()) pipeline_report.add_step(*ctx.comm, state.step - summary.first_step, dt, m);
    if (offload.placement) offload.placement->after_step(dt, step_gpu_j, step_cpu_j, m);
    metrics.publish(m);
    fault_after_step(ctx.ranks.rank, state.step, ctx.ranks.restart_count);  // Note [Test faults]

    // Note [Data parallel]: dist.balance=auto measures, then sizes each rank's rows once.
    compute_s.push_back(phases.forward_s + phases.backward_s);
    if (ctx.comm && rows.balances_at(state.step, summary.first_step)) {
      std::string said;
      if (rows.rebalance(*ctx.comm, median(compute_s), max_rows_on_device(ctx, rows, cfg.offload.gpu_memory_fraction),
                         &said)) {
        log::info("dist.balance=auto: " + said);
        const int64_t pos = train_loader->position();
        train_loader = training_loader(data, plan, ctx, rows);
        train_loader->seek(pos);
      }
    }

    progress.update(progress_sample(cfg, state.step, loss, lr, r, dt, step_times, tokens_per_step));

    if (evaluates && state.step % cfg.train.eval_every == 0) {
      summary.last_eval_loss = held_out_loss(runner, val_loader.get(), cfg, ctx, pipeline);
      metrics.publish({{"step", state.step}, {"eval_loss", summary.last_eval_loss}});
      progress.message(
          strprintf("step %lld | eval loss %.4f", static_cast<long long>(state.step), summary.last_eval_loss));
    }
    if (cfg.train.checkpoint_every > 0 && state.step % cfg.train.checkpoint_every == 0 &&
        state.step < cfg.train.steps) {
      state.data_position = train_loader->position();
      runner.save_scaler(state);
      checkpointer.write(state, true);
    }
    checkpointer.collect(false);
    // Note [Stopping on a signal]
    // SIGINT/SIGTERM set a flag (core/interrupt.h); the step in flight finishes, the loop stops
    // here, a checkpoint is written whatever train.save_final says, and the run ends normally
    // (exit 0), so `--resume` continues exactly. A second signal ends the process at once.
    if (stop_now && state.step < cfg.train.steps) {
      summary.interrupted = true;
      log::warn(strprintf("stop requested: stopping after step %lld of %lld", static_cast<long long>(state.step),
                          static_cast<long long>(cfg.train.steps)));
      break;
    }
  }
  progress.finish();
  if (engine) engine->finish_trace();  // a traced last step: its trace is written now
  const double wall = metrics.since_start_s();

  // The end: a last evaluation, the final checkpoint, summary.json.
  if (evaluates && !summary.interrupted && state.step > summary.first_step && (summary.last_eval_loss < 0 || state.step % cfg.train.eval_every != 0)) {
    summary.last_eval_loss = held_out_loss(runner, val_loader.get(), cfg, ctx, pipeline);
    metrics.publish({{"step", state.step}, {"eval_loss", summary.last_eval_loss}});
  }
  state.data_position = train_loader->position();
  runner.save_scaler(state);
  checkpointer.finish(state, (cfg.train.save_final || summary.interrupted) && state.step > summary.first_step);
  summary.last_checkpoint = checkpointer.last();
  summary.checkpoint_error = checkpointer.error();
  summary.unsaved = checkpointer.unsaved();
  summary.final_step = state.step;
  summary.oom_retries = runner.oom_retries();
  add_speed_and_memory(summary, step_times, tokens_per_step, ctx.device_index);
  metrics.write_summary(summary, plan, ctx, tokens_run, tokens_per_step, wall,
                        offload.placement ? offload.placement->summary() : nlohmann::json());
  if (ctx.comm) {
    // Every rank stops its heartbeat before rank 0, which serves the store, may exit.
    ctx.comm->stop_heartbeat();
    ctx.comm->barrier();
  }
  metrics.finish();
  log_run_end(summary, wall, ctx.device_index, cfg.train.steps);
  return summary;
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
