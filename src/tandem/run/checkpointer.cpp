#include "tandem/run/checkpointer.h"

#include <filesystem>

#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/fs.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/engine/offload_engine.h"
#include "tandem/engine/param_store.h"
#include "tandem/formats/safetensors.h"
#include "tandem/models/model.h"
#include "tandem/parallel/comm.h"
#include "tandem/run/run_setup.h"

namespace fs = std::filesystem;

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

void EngineOptimizer::step(double, const std::optional<torch::Tensor>&) {
  TANDEM_ASSERT(false, "the offload engine updates through begin_step/end_step");
}

std::vector<NamedTensor> EngineOptimizer::state() {
  return sharded_state_ ? std::vector<NamedTensor>{} : engine_.state();
}

void EngineOptimizer::load_state(const std::function<std::optional<torch::Tensor>(const std::string&)>& lookup,
                                 const std::string& source) {
  engine_.load_state(lookup, source);
}

Checkpointer::Checkpointer(const Config& cfg, const std::string& run_dir, const RunContext& ctx, CheckpointModel model,
                           Optimizer& optimizer, ParamStore* store, OffloadEngine* engine, CheckpointReports reports)
    : cfg_(cfg),
      ctx_(ctx),
      model_(std::move(model)),
      optimizer_(optimizer),
      store_(store),
      engine_(engine),
      reports_(std::move(reports)),
      parent_((fs::path(run_dir) / "checkpoints").string()),
      sharded_(engine != nullptr && cfg.dist.zero_stage == 2) {}

Checkpointer::~Checkpointer() {
  if (pending_ && pending_->result.valid()) pending_->result.wait();  // never leave a write behind
}

void Checkpointer::with_weights(const std::function<void()>& fn) {
  if (!engine_) return fn();
  engine_->wait_all();
  store_->with_masters_bound(fn);
}

TrainerState Checkpointer::resume(const std::string& dir) {
  TrainerState state;
  state.loss_scale = cfg_.scaler.init_scale;
  state.config_hash = config_hash(cfg_);
  if (dir.empty()) return state;
  const int world = ctx_.world();
  // Note [Sharded checkpoints]: dist.zero_stage=2 runs save per-rank shards at every world size.
  if (checkpoint_zero_world(dir) > 0) {
    TANDEM_CHECK(sharded_, "checkpoint ", dir,
                 " holds optimizer shards (dist.zero_stage=2); resume it with "
                 "offload.optimizer=cpu and dist.zero_stage=2, at any world size (1 included)");
    state = load_checkpoint_state(dir, ctx_.device_index);
    const ZeroShards shards(dir);
    store_->load_shard_state([&](const std::string& block, const std::string& kind, int64_t offset, int64_t n,
                                 torch::Tensor out) { shards.read(block, kind, offset, n, out); });
    SafetensorsFile first((fs::path(dir) / zero_shard_file(0)).string());
    engine_->set_step_count(static_cast<int64_t>(first.tensor("_step").item<double>()));
    log::info(strprintf("resumed from %s at step %lld (optimizer shards of %d ranks, now %d)", dir.c_str(),
                        static_cast<long long>(state.step), shards.world(), world));
    return state;
  }
  TANDEM_CHECK(!sharded_ || world == 1, "checkpoint ", dir,
               " holds whole optimizer state; resume it with "
               "dist.zero_stage=0, or in one process, and save again to shard it");
  with_weights([&] { state = load_checkpoint(dir, model_, optimizer_, ctx_.device_index); });
  log::info(strprintf("resumed from %s at step %lld", dir.c_str(), static_cast<long long>(state.step)));
  return state;
}

void Checkpointer::failed(int64_t step, const std::string& why) {
  error_ = strprintf("step %lld: %s", static_cast<long long>(step), why.c_str());
  log::warn(strprintf("checkpoint at step %lld failed: %s; the earlier checkpoints are kept and training goes on",
                      static_cast<long long>(step), why.c_str()));
  reports_.publish({{"step", step}, {"checkpoint_failed", why}});
}

void Checkpointer::written(int64_t step, const std::string& path, const char* time_key, double seconds,
                           const std::string& how) {
  last_ = path;
  prune_checkpoints(parent_, cfg_.train.keep_checkpoints);
  reports_.publish({{"step", step}, {"checkpoint", path}, {time_key, seconds}});
  reports_.message(strprintf("checkpoint %s%s (%.2f s)", path.c_str(), how.c_str(), seconds));
}

// Note [Asynchronous checkpoints]
// With train.async_checkpoint a checkpoint blocks training only while its snapshot is taken (the
// engine's masters and states, or the device weights, cloned into host memory between steps);
// a background thread writes it (Note [Checkpoint layout]) while the next steps run. One write
// is in flight at a time: the next checkpoint, a stop and the end of the run wait for it. When
// the snapshot would not leave 2 GiB of host memory free, the checkpoint is written in place,
// synchronously, and the log says why. Its result is collected on the step loop's thread.
void Checkpointer::collect(bool wait) {
  if (!pending_ || (!wait && pending_->result.wait_for(std::chrono::seconds(0)) != std::future_status::ready)) return;
  PendingWrite done = std::move(*pending_);
  pending_.reset();
  std::string path;
  try {
    path = done.result.get();
  } catch (const InternalError&) {
    throw;
  } catch (const std::exception& e) {
    return failed(done.step, e.what());
  }
  written(done.step, path, "checkpoint_write_s", seconds_since(done.started), " written in the background");
}

void Checkpointer::write(const TrainerState& state, bool allow_async) {
  collect(true);  // one write at a time
  // A sharded store has no whole masters: its checkpoint's weights are the working ones.
  if (before_write_) sharded_ ? before_write_() : with_weights(before_write_);
  if (sharded_) return write_sharded(state);
  if (!ctx_.main_rank()) return;  // replicated state: rank 0 writes it
  const auto t0 = Clock::now();
  const bool want_background = allow_async && cfg_.train.async_checkpoint;
  // Note [Checkpoint failures]
  // A checkpoint that cannot be written (full disk, directory made read-only, quota) fails alone:
  // its temporary directory is removed, the earlier checkpoints stay (pruning runs only after a
  // success), the run goes on and says so in the log and in metrics.jsonl. A run whose final
  // checkpoint (or every checkpoint) failed ends with unsaved() set: the CLI says so and exits 1.
  std::string path;
  try {
    // The snapshot refers to the live tensors; for a background write it is copied to the host,
    // unless the copy would leave less than 2 GiB free: then it is written in place from them.
    CheckpointSnapshot snap;
    bool background = false;
    with_weights([&] {
      snap = take_checkpoint_snapshot(model_, optimizer_, state, cfg_, ctx_.device_index, false);
      if (want_background) {
        const int64_t need = checkpoint_snapshot_bytes(snap), avail = host_available_bytes();
        background = need + (int64_t{2} << 30) <= avail;
        if (background) {
          own_checkpoint_snapshot(snap);
        } else if (!said_sync_) {
          said_sync_ = true;
          log::info(
              strprintf("checkpoints are written synchronously: a snapshot needs %s of host memory, %s is "
                        "available",
                        format_bytes(double(need)).c_str(), format_bytes(double(avail)).c_str()));
        }
      }
      if (!background) path = write_checkpoint(parent_, snap);
    });
    if (background) {
      pending_ = PendingWrite{
          std::async(std::launch::async,
                     [parent = parent_, snap = std::move(snap)] { return write_checkpoint(parent, snap); }),
          state.step, Clock::now()};
      reports_.publish({{"step", state.step}, {"checkpoint_blocking_s", seconds_since(t0)}});
      return;
    }
  } catch (const InternalError&) {
    throw;
  } catch (const std::exception& e) {
    return failed(state.step, e.what());
  }
  written(state.step, path, "checkpoint_blocking_s", seconds_since(t0), "");
}

// Note [Sharded checkpoints]: every rank writes its shard, rank 0 the rest and the manifest.
void Checkpointer::write_sharded(const TrainerState& state) {
  const auto t0 = Clock::now();
  const bool main_rank = ctx_.main_rank();
  const int world = ctx_.world();
  Comm* comm = ctx_.comm.get();
  engine_->wait_all();
  const std::string staging = zero_staging_dir(parent_, state.step);
  std::string error;
  try {
    if (main_rank) ensure_writable_directory(parent_, "checkpoint directory");
    if (comm) comm->barrier();
    fs::create_directories(staging);
    nlohmann::json blocks = nlohmann::json::object();
    for (const auto& b : store_->blocks()) blocks[b.name] = {b.numel, b.shard_offset, b.shard_numel};
    auto tensors = store_->shard_state();
    tensors.emplace_back("_step", torch::full({}, double(engine_->stats().steps), torch::kFloat64));
    const nlohmann::json meta = {{"rank", ctx_.ranks.rank}, {"world", world}, {"blocks", blocks}};
    write_safetensors((fs::path(staging) / zero_shard_file(ctx_.ranks.rank)).string(), tensors,
                      {{"tandem_zero", meta.dump()}});
  } catch (const InternalError&) {
    throw;
  } catch (const std::exception& e) {
    error = strprintf("rank %d: %s", ctx_.ranks.rank, e.what());
  }
  const double failures = comm ? comm->sum(error.empty() ? 0.0 : 1.0) : (error.empty() ? 0.0 : 1.0);
  std::string path;
  if (main_rank) {
    try {
      TANDEM_CHECK(failures == 0,
                   error.empty() ? strprintf("%.0f rank(s) could not write their shards", failures) : error);
      CheckpointSnapshot snap = take_checkpoint_snapshot(model_, optimizer_, state, cfg_, ctx_.device_index, true);
      snap.zero_world = world;
      for (int r = 0; r < world; ++r) snap.adopt.push_back((fs::path(staging) / zero_shard_file(r)).string());
      path = write_checkpoint(parent_, snap);
    } catch (const InternalError&) {
      throw;
    } catch (const std::exception& e) {
      error = e.what();
    }
    std::error_code ec;
    fs::remove_all(staging, ec);
  }
  if (comm) comm->barrier();  // no rank goes on (or ends) before the checkpoint is whole
  if (!main_rank) return;
  if (!error.empty()) return failed(state.step, error);
  written(state.step, path, "checkpoint_blocking_s", seconds_since(t0), strprintf(", %d shard(s)", world));
}

void Checkpointer::finish(const TrainerState& state, bool final_wanted) {
  // The last checkpoint is written in place: nothing is left to overlap it.
  if (final_wanted) write(state, false);
  collect(true);
  // A run that ends without its final checkpoint, or with every checkpoint failed, lost work.
  unsaved_ =
      !error_.empty() && ((final_wanted && fs::path(last_).filename() != step_name(state.step)) || last_.empty());
}

}  // namespace tandem
