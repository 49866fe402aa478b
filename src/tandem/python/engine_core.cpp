#include "tandem/python/engine_core.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/fs.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/engine/offload_engine.h"
#include "tandem/engine/param_store.h"
#include "tandem/io/checkpoint.h"
#include "tandem/optim/optimizer.h"
#include "tandem/parallel/comm.h"
#include "tandem/parallel/grad_reducer.h"
#include "tandem/python/module_plan.h"
#include "tandem/run/checkpointer.h"
#include "tandem/run/engine_setup.h"
#include "tandem/run/lr_schedule.h"
#include "tandem/run/placement_driver.h"
#include "tandem/run/run_metrics.h"
#include "tandem/run/run_setup.h"

namespace fs = std::filesystem;

namespace tandem {

// Note [Python engine]
// The user's loop runs forward and backward; the package's hooks and calls tell the engine where
// the loop is:
//   - the model's forward pre-hook (gradients on): begin_forward opens the step on its first
//     micro-batch (the step driver's begin_step at the schedule's learning rate) and tells the
//     engine and the gradient reducer whether this micro-batch is the last of the step;
//   - each Block's forward pre-hook: ModuleBlocks::before_block, where the offload engine waits
//     for that Block's weights of this step (Note [Gradient streaming]);
//   - engine.backward(loss): the loss times loss_multiplier() (accumulation, this rank's share of
//     the global batch, the fp16 loss scale), backward, end_backward;
//   - engine.step(): at the accumulation boundary, update(): the step driver's update and read;
//   - engine.train_step after an out-of-memory error: retry_smaller (Note [Adaptive micro-batch]).
// The step's mechanics are the CLI's step driver (run/step_driver.h), as the StepRunner's.
// Everything else is the CLI's too: the config keys and their checks, the run context (torchrun's or
// tandem launch's environment), the ParamStore and OffloadEngine over the model's Blocks (Note
// [Block sequence]), the split solver, ZeRO-2 sharding, the checkpoint format.
// The memory plan is module_plan's (Note [Module plan]).

namespace {

constexpr size_t kMeasuredPlanStep = 2;  // the engine's steps whose peak memory widens the split's range

}  // namespace

EngineCore::EngineCore(std::shared_ptr<ModuleBlocks> blocks, Config cfg, std::string run_dir)
    : blocks_(std::move(blocks)), cfg_(std::move(cfg)), run_dir_(std::move(run_dir)) {
  validate_config(cfg_);
  ctx_ = std::make_unique<RunContext>(open_run_context(cfg_));
  if (ctx_->comm) run_dir_ = ctx_->comm->broadcast_string("python/run_dir", run_dir_);  // rank 0 names it
  numerics_ = std::make_unique<NumericsGuard>(cfg_.train, ctx_->device);
  if (ctx_->main_rank()) ensure_writable_directory(run_dir_, "run directory");
  metrics_ = std::make_unique<RunMetrics>(cfg_, run_dir_,
                                          strprintf("Python model, %zu Blocks (%s params)", blocks_->block_count(),
                                                    format_count(double(blocks_->numel())).c_str()),
                                          *ctx_, offload() ? "offload engine" : "GPU-resident");
  for (auto& [name, p] : blocks_->all_parameters()) params_.push_back(p);
  check_data_parallel_start();
  if (offload()) {
    build_offload_engine();
    optimizer_ = std::make_unique<EngineOptimizer>(*offload_->engine, offload_->store->sharded());
  } else {
    for (const auto& [name, p] : blocks_->all_parameters())
      TANDEM_CHECK(p.device() == ctx_->device, "parameter '", name, "' is on ", p.device().str(),
                   " but this run trains on ", ctx_->device.str(),
                   "; move the model there first (model.to(device)), or set offload.optimizer=cpu");
    optimizer_ = make_optimizer(cfg_.optim, blocks_->all_parameters(), ctx_->device);
    if (ctx_->comm) reducer_ = std::make_unique<GradReducer>(*blocks_, *ctx_->comm);
  }
  StepTargets targets;
  targets.optimizer = optimizer_.get();
  if (offload_) {
    targets.engine = offload_->engine.get();
    targets.store = offload_->store.get();
    targets.placement = offload_->placement.get();
  } else {
    targets.params = params_;
  }
  targets.reducer = reducer_.get();
  TrainerState start;
  start.loss_scale = cfg_.train.precision == Precision::kFp16 ? cfg_.scaler.init_scale : 1.0;
  driver_ = std::make_unique<StepDriver>(cfg_, *ctx_, std::move(targets), start,
                                         [this](const nlohmann::json& row) { metrics_->publish(row); });
  metrics_->start();
}

EngineCore::~EngineCore() {
  finish_run();
  driver_.reset();
  reducer_.reset();
  optimizer_.reset();
  offload_.reset();
  metrics_.reset();
  if (ctx_ && ctx_->comm) ctx_->comm->stop_heartbeat();
}

void EngineCore::finish_run() {
  if (finished_) return;
  finished_ = true;
  if (offload_ && offload_->engine) {
    try {
      offload_->engine->wait_all();
    } catch (const std::exception& e) {
      log::warn(std::string("engine: while finishing the last updates: ") + one_line(e.what()));
    }
  }
  write_run_summary();
  if (metrics_) metrics_->finish();
}

bool EngineCore::offload() const { return cfg_.offload.optimizer == OffloadTarget::kCpu; }
std::string EngineCore::device() const { return ctx_->device.str(); }
int EngineCore::rank() const { return ctx_->ranks.rank; }
int EngineCore::world() const { return ctx_->world(); }

// Data parallel: every rank must start from the same weights (the same seed before the model was
// built), as DDP's broadcast would make them; compared by a checksum rather than sent.
void EngineCore::check_data_parallel_start() {
  if (!ctx_->comm) return;
  torch::NoGradGuard no_grad;
  torch::Tensor sum = torch::zeros({}, params_.front().options().dtype(torch::kFloat64));
  for (const auto& p : params_) sum += p.to(torch::kFloat64).abs().sum();
  ctx_->comm->check_same("initial weights (checksum)", strprintf("%.17g", sum.item<double>()),
                         "call torch.manual_seed(S) with the same S on every rank before building the model, or load "
                         "the same pretrained weights");
}

// This rank's share of the host; the model's parameters on the host are freed by the store.
HostShare EngineCore::host_share() const {
  HostShare h;
  h.shards = cfg_.dist.zero_stage == 2 ? world() : 1;
  h.device_is_host = !ctx_->device.is_cuda();
  if (cfg_.offload.host_memory_gib > 0) {
    h.available = static_cast<int64_t>(cfg_.offload.host_memory_gib * double(1 << 30));
    return h;
  }
  h.available = host_available_bytes() / std::max(1, ctx_->ranks.local_world_size);
  for (const auto& [name, p] : blocks_->all_parameters())
    if (p.device().is_cpu()) h.reclaimable += static_cast<int64_t>(p.nbytes());
  return h;
}

// Note [Module plan]: the split first, then the host for the Blocks after it.
void EngineCore::build_offload_engine() {
  auto [gpu_blocks, limit] = plan_module_split(cfg_, *blocks_, ctx_->device);
  std::pair<int64_t, int64_t> range{plan_module_host(cfg_, *blocks_, host_share(), gpu_blocks), limit};
  agree_on_offload_plan(*ctx_, gpu_blocks, range, cfg_.offload);  // as the CLI's plan
  offload_ = std::make_unique<OffloadParts>(
      build_offload(*blocks_, OffloadSetup{cfg_, gpu_blocks, range, run_dir_}, *ctx_, metrics_->trace_counters(), 0.0));
  log::info(
      strprintf("offload: %lld of %zu Blocks updated on the %s first (offload.update_split=%s) | %s "
                "parameters, host buffers %s",
                static_cast<long long>(gpu_blocks), blocks_->block_count(), ctx_->device.is_cuda() ? "GPU" : "device",
                cfg_.offload.update_split.c_str(), format_count(double(blocks_->numel())).c_str(),
                cfg_.offload.host_ring > 0 ? strprintf("a ring of %lld", (long long)cfg_.offload.host_ring).c_str()
                                           : "per Block"));
}

void EngineCore::begin_forward(std::optional<double> lr, std::optional<bool> last_micro) {
  if (!open_) {
    // Note [Module plan]: the measured peak starts at the engine's first step, not with its build.
    if (step_times_.empty() && ctx_->device_index >= 0 && accelerator())
      accelerator()->reset_peak_memory(ctx_->device_index);
    lr_ = lr ? *lr : lr_at(cfg_.optim, step_, cfg_.train.steps);
    step_start_ = std::chrono::steady_clock::now();
    if (offload_) offload_->store->restore_grad_views();  // a zero_grad(set_to_none=True) in the user's loop
    const auto latest = metrics_->latest();
    driver_->begin_step(step_, lr_, latest ? &*latest : nullptr);
    open_ = true;
    micro_ = 0;
    forwards_ = 0;
  }
  // A further backward into gradients the engine is already updating would race with the update
  // (the Blocks were dispatched by the last micro-batch's backward): refused.
  TANDEM_CHECK(last_micro || forwards_ < cfg_.train.grad_accum, "a forward that records gradients after the step's ",
               cfg_.train.grad_accum,
               " micro-batch(es) and before the optimizer's step: the engine updates the gradients as the last "
               "backward completes them, so another backward cannot add to them; call opt.step() (engine.step()) "
               "after each backward, run other forwards under torch.no_grad(), or set train.grad_accum to the "
               "backward passes of a step (tandem.Engine)");
  ++forwards_;
  driver_->begin_micro(last_micro ? *last_micro : micro_ + 1 >= cfg_.train.grad_accum);
}

double EngineCore::loss_multiplier() const {
  // Note [Data parallel]: each rank's loss weighted by its share of the global batch (equal rows
  // per rank here); the gradients' sum over the ranks is the mean.
  return driver_->loss_scale() / double(cfg_.train.grad_accum) / double(world());
}

void EngineCore::end_backward() {
  TANDEM_CHECK(open_,
               "backward without a forward through the engine's model; call the model wrapped by "
               "tandem.Engine (its forward opens the step)");
  ++micro_;
  ++data_position_;
}

StepInfo EngineCore::update(const std::optional<torch::Tensor>& loss, int64_t tokens) {
  TANDEM_CHECK(open_ && micro_ > 0,
               "step() without a backward since the last step; call engine.backward(loss) "
               "first (or loss.backward() with tandem.optim.OffloadAdamW)");
  driver_->update(lr_);
  const torch::Tensor loss_now =
      loss ? *loss : torch::full({}, NAN, torch::TensorOptions().dtype(torch::kFloat32).device(ctx_->device));
  const StepResult r = driver_->read(loss_now, step_);
  open_ = false;
  micro_ = 0;
  ++step_;
  StepInfo info;
  info.step = step_;
  info.grad_norm = r.grad_norm;
  info.skipped = r.skipped;
  info.loss_scale = r.loss_scale;
  info.lr = lr_;
  info.loss = r.loss;
  if (info.skipped)
    log::warn(strprintf("step %lld skipped: non-finite gradients (norm %g); nothing was updated%s",
                        static_cast<long long>(step_), info.grad_norm,
                        cfg_.train.precision == Precision::kFp16
                            ? strprintf(", the loss scale is now %g", info.loss_scale).c_str()
                            : ""));
  if (step_times_.size() + 1 == kMeasuredPlanStep) widen_split_range();  // this engine's steps (a resumed run too)
  publish_step(info, r, tokens);
  return info;
}

// Note [Module plan]: the split's range from the peak of the first steps.
void EngineCore::widen_split_range() {
  if (!offload_ || !ctx_->device.is_cuda() || !accelerator() || parse_update_split(cfg_.offload.update_split)) return;
  offload_->engine->set_max_gpu_blocks(
      measured_split_limit(cfg_, *blocks_, offload_->store->gpu_blocks(), ctx_->device_index));
}

// The step's metrics row, as the CLI's (Note [Telemetry]); with several ranks the global batch's
// loss and tokens.
void EngineCore::publish_step(const StepInfo& info, const StepResult& r, int64_t tokens) {
  driver_->pace();  // toward a GPU power budget (Note [Placement policies])
  double loss = info.loss;
  if (ctx_->comm) {
    const auto sums = ctx_->comm->sum({loss / double(world()), double(tokens)});
    loss = sums[0];
    tokens = static_cast<int64_t>(sums[1]);
  }
  tokens_seen_ += tokens;
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start_).count();
  nlohmann::json row =
      step_metrics_row(info.step, loss, info.lr, info.grad_norm, dt, tokens, tokens_seen_, metrics_->since_start_s());
  driver_->complete_row(row, r, dt, tokens, *metrics_);
  metrics_->publish(row);
  if (summary_.losses.empty()) summary_.first_step = info.step - 1;
  summary_.final_step = info.step;
  summary_.losses.push_back(loss);
  if (info.skipped) ++summary_.skipped_steps;
  step_times_.push_back(dt);
  tokens_run_ += tokens;
  tokens_per_step_ = tokens;
}

// summary.json as the CLI writes it, for the steps this engine ran (none: nothing is written).
void EngineCore::write_run_summary() {
  if (!metrics_ || summary_.losses.empty()) return;
  try {
    summary_.run_dir = run_dir_;
    summary_.oom_retries = driver_ ? driver_->split().retries() : 0;
    add_speed_and_memory(summary_, step_times_, tokens_per_step_, ctx_->device_index);
    const nlohmann::json model = {{"params", blocks_->numel()},
                                  {"blocks", blocks_->block_count()},
                                  {"precision", to_string(cfg_.train.precision)},
                                  {"device", ctx_->device.str()}};
    std::filesystem::create_directories(run_dir_);  // nothing else may have written there (monitor.enabled=false)
    metrics_->write_summary(summary_, model, run_dir_, tokens_run_, tokens_per_step_, metrics_->since_start_s(),
                            offload_ && offload_->placement ? offload_->placement->summary() : nlohmann::json());
  } catch (const std::exception& e) {
    log::warn(std::string("summary.json not written: ") + one_line(e.what()));
  }
}

void EngineCore::abandon() {
  if (!open_) return;
  driver_->abandon();
  if (offload_) offload_->store->restore_grad_views();
  open_ = false;
  micro_ = 0;
}

void EngineCore::retry_smaller(const std::string& what, int64_t rows) {
  abandon();
  driver_->retry_smaller(step_, what, rows);
}

void EngineCore::wait() {
  if (!offload_) return;
  offload_->engine->wait_all();
  if (!open_) offload_->engine->finish_trace();
}

// The Python model's side of a checkpoint: its parameters and persistent buffers (BatchNorm's
// running statistics, ...) under their names, as the module's state_dict names them, and copied
// back in by name (every one must be in the checkpoint, with its shape).
CheckpointModel EngineCore::checkpoint_model(const std::string& hf_config) {
  CheckpointModel m;
  const auto tensors = [this] {
    std::vector<NamedTensor> all = blocks_->all_parameters();
    all.insert(all.end(), buffers_.begin(), buffers_.end());
    return all;
  };
  m.weights = tensors;
  m.hf_config = hf_config;
  m.load = [tensors](const auto& lookup, const std::string& source) {
    torch::NoGradGuard no_grad;
    for (auto& [name, p] : tensors()) {
      const auto t = lookup(name);
      TANDEM_CHECK(t.has_value(), source, " has no tensor '", name,
                   "'; the checkpoint is of another model (compare its config.json with this one)");
      TANDEM_CHECK(t->sizes() == p.sizes(), source, ": '", name, "' has shape ", t->sizes(), ", the model's is ",
                   p.sizes(), "; the checkpoint is of another architecture");
      p.copy_(*t);
    }
  };
  return m;
}

// The CLI's Checkpointer over this engine (Note [Checkpoint layout], Note [Sharded checkpoints]).
std::unique_ptr<Checkpointer> EngineCore::checkpointer(const std::string& run_dir, const std::string& hf_config) {
  return std::make_unique<Checkpointer>(
      cfg_, run_dir, *ctx_, checkpoint_model(hf_config), *optimizer_, offload_ ? offload_->store.get() : nullptr,
      offload_ ? offload_->engine.get() : nullptr,
      CheckpointReports{[](const nlohmann::json&) {}, [](const std::string& line) { log::info(line); }});
}

std::string EngineCore::save(const std::string& run_dir, const std::string& hf_config) {
  TANDEM_CHECK(!open_, "save() in the middle of a step (after a backward, before step()); save between steps");
  wait();
  TrainerState state;
  state.step = step_;
  state.data_position = data_position_;
  driver_->save_scaler(state);
  state.config_hash = config_hash(cfg_);
  auto ck = checkpointer(run_dir, hf_config);
  ck->write(state, /*allow_async=*/false);
  TANDEM_CHECK(ck->error().empty(), "the checkpoint was not saved (", ck->error(),
               "); the earlier checkpoints are kept: free space or choose a writable directory");
  if (ctx_->comm && !(offload_ && offload_->store->sharded())) ctx_->comm->barrier();
  summary_.last_checkpoint = ck->last();
  return ck->last();
}

std::string EngineCore::load(const std::string& path) {
  TANDEM_CHECK(!open_, "load() in the middle of a step; load between steps");
  const std::string dir = resolve_checkpoint_dir(path, "engine.load");
  wait();
  const TrainerState state = checkpointer(fs::path(dir).parent_path().parent_path().string(), "")->resume(dir);
  step_ = state.step;
  data_position_ = state.data_position;
  driver_->load_scaler(state);
  return dir;
}

std::string EngineCore::stats_json() const {
  nlohmann::json j;
  j["step"] = step_;
  j["device"] = ctx_->device.str();
  j["rank"] = rank();
  j["world"] = world();
  j["offload"] = offload();
  if (offload_) {
    const EngineStats s = offload_->engine->stats();
    j["skipped"] = s.skipped;
    j["rollbacks"] = s.rollbacks;
    j["speculative_steps"] = s.speculative_steps;
    j["cpu_update_s"] = s.cpu_update_s;
    j["transfer_s"] = s.transfer_s;
    j["gpu_blocks"] = offload_->store->gpu_blocks();
    j["host_ring"] = cfg_.offload.host_ring;
    const SplitStatus& split = offload_->engine->split();
    j["split_k"] = split.k;
  }
  return j.dump();
}

void EngineCore::assign_groups(const std::vector<std::pair<torch::Tensor, int64_t>>& params) {
  TANDEM_CHECK(offload_ && !offload_->store->sharded(),
               "parameter groups need the offload engine in one process (offload.optimizer=cpu, no dist.zero_stage)");
  std::map<const c10::TensorImpl*, int> group;
  for (const auto& [p, g] : params) group[p.unsafeGetTensorImpl()] = static_cast<int>(g);
  offload_->store->assign_groups([&](const torch::Tensor& p) {
    const auto it = group.find(p.unsafeGetTensorImpl());
    return it == group.end() ? -1 : it->second;
  });
}

void EngineCore::set_group_hypers(const std::vector<GroupHyper>& groups) {
  TANDEM_CHECK(offload_, "parameter groups need the offload engine (offload.optimizer=cpu)");
  offload_->store->set_group_hypers(groups);
}

std::vector<torch::Tensor> EngineCore::param_state(const torch::Tensor& param) {
  TANDEM_CHECK(offload_, "a parameter's optimizer state lives in the offload engine (offload.optimizer=cpu)");
  wait();
  return offload_->store->param_state(param);
}

void EngineCore::load_param_state(const torch::Tensor& param, const torch::Tensor& master, const torch::Tensor& exp_avg,
                                  const torch::Tensor& exp_avg_sq) {
  TANDEM_CHECK(offload_, "a parameter's optimizer state lives in the offload engine (offload.optimizer=cpu)");
  TANDEM_CHECK(!open_, "an optimizer state loaded in the middle of a step; load between steps");
  wait();
  offload_->store->load_param_state(param, master, exp_avg, exp_avg_sq);
}

void EngineCore::set_step(int64_t step) {
  TANDEM_CHECK(!open_ && step >= 0, "the step count set in the middle of a step, or negative (", step, ")");
  step_ = step;
  if (offload_) offload_->engine->set_step_count(step);
}

}  // namespace tandem
