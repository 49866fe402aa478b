#pragma once
// All of a run's checkpoint writing and reading (Note [Checkpoint layout], io/checkpoint.h): the
// resume at start, a checkpoint every train.checkpoint_every steps, written in the background
// when asked (Note [Asynchronous checkpoints]), sharded by rank with the offload engine's ZeRO
// (Note [Sharded checkpoints]), failures that do not stop the run (Note [Checkpoint failures]),
// the final checkpoint, and the Optimizer adapter over the offload engine's states.

#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <future>
#include <optional>
#include <string>

#include "tandem/io/checkpoint.h"
#include "tandem/optim/optimizer.h"

namespace tandem {

class Model;
class OffloadEngine;
class ParamStore;
struct RunContext;

/// The Optimizer interface over the offload engine, for checkpoint code: state() and load_state()
/// reach the engine's masters' states; the update itself is driven by the step loop.
class EngineOptimizer : public Optimizer {
 public:
  /// `sharded_state`: the state lives in per-rank shard files (Note [Sharded checkpoints]), not here.
  EngineOptimizer(OffloadEngine& e, bool sharded_state) : engine_(e), sharded_state_(sharded_state) {}
  void step(double, const std::optional<torch::Tensor>&) override;
  void zero_grad() override {}
  std::vector<NamedTensor> state() override;
  void load_state(const std::function<std::optional<torch::Tensor>(const std::string&)>& lookup,
                  const std::string& source) override;

 private:
  OffloadEngine& engine_;
  bool sharded_state_;
};

/// Where a checkpoint's outcome goes: metrics rows and progress lines.
struct CheckpointReports {
  std::function<void(const nlohmann::json&)> publish;
  std::function<void(const std::string&)> message;
};

class Checkpointer {
 public:
  /// Checkpoints of a run with config `cfg` go to <run_dir>/checkpoints. `store` and `engine` are
  /// null without the offload engine.
  Checkpointer(const Config& cfg, const std::string& run_dir, const RunContext& ctx, CheckpointModel model,
               Optimizer& optimizer, ParamStore* store, OffloadEngine* engine, CheckpointReports reports);
  ~Checkpointer();

  /// The state to start from: checkpoint `dir` loaded into the model, the optimizer (or the
  /// store's shards), the RNG; a fresh state when `dir` is empty.
  TrainerState resume(const std::string& dir);
  /// Runs fn with the fp32 masters bound to the model when the engine holds them.
  void with_weights(const std::function<void()>& fn);
  /// Called on every rank before each checkpoint, with the weights bound (a pipeline's gather,
  /// Note [Pipeline checkpoints]).
  void set_before_write(std::function<void()> fn) { before_write_ = std::move(fn); }

  /// A checkpoint of `state` (between steps); in the background when `allow_async` and
  /// train.async_checkpoint and the host holds a snapshot. A failure is reported, not thrown.
  void write(const TrainerState& state, bool allow_async);
  /// Collects a background write (waits for it with `wait`).
  void collect(bool wait);
  /// The end of the run: the final checkpoint when `final_wanted`, the last write collected, and
  /// whether the run's end is unsaved.
  void finish(const TrainerState& state, bool final_wanted);

  const std::string& last() const { return last_; }    ///< the newest checkpoint written ("" = none)
  const std::string& error() const { return error_; }  ///< the last failure ("" = none)
  bool unsaved() const { return unsaved_; }            ///< set by finish()

 private:
  void failed(int64_t step, const std::string& why);
  void written(int64_t step, const std::string& path, const char* time_key, double seconds, const std::string& how);
  void write_sharded(const TrainerState& state);

  const Config& cfg_;
  const RunContext& ctx_;
  CheckpointModel model_;
  Optimizer& optimizer_;
  ParamStore* store_;
  OffloadEngine* engine_;
  CheckpointReports reports_;
  const std::string parent_;  // <run_dir>/checkpoints
  const bool sharded_;
  struct PendingWrite {
    std::future<std::string> result;
    int64_t step;
    std::chrono::steady_clock::time_point started;
  };
  std::optional<PendingWrite> pending_;
  bool said_sync_ = false;
  std::function<void()> before_write_;
  std::string last_, error_;
  bool unsaved_ = false;
};

}  // namespace tandem
