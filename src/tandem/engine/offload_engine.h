#pragma once
// The offload engine's step: gradients stream to the CPU Block by Block as backward completes
// them, the CPU updates each Block's fp32 master and states while backward goes on, and the new
// weights stream back; the update split's GPU-updated Blocks are updated on the device
// (ARCHITECTURE.md, "One training step, offload mode"; Note [Gradient streaming]).

#include <torch/torch.h>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tandem/engine/param_store.h"
#include "tandem/engine/split_tuner.h"
#include "tandem/monitor/chrome_trace.h"
#include "tandem/optim/cpu_update.h"
#include "tandem/optim/optimizer.h"

namespace tandem {

class CpuThreadPool;
class CpuUpdater;
class DeviceUpdater;
class OffloadTrace;
struct CpuUpdateJob;
struct Stamp;
struct StepStamps;
struct TransferStreams;

struct EngineOptions {
  AdamWOptions adam;
  double grad_clip = 1.0;  ///< global-norm clipping; 0 disables
  /// kAlways: start CPU updates as Blocks complete, with an undo log (Note [Speculative clipping]);
  /// kNever: wait for the global norm, then update the CPU Blocks in forward order (no undo memory;
  /// the updates overlap only the next forward); kAuto: speculate while it pays, i.e. when none of
  /// the last kSpeculationWindow steps clipped or overflowed.
  enum class Speculate { kAlways, kNever, kAuto } speculate = Speculate::kAuto;
  CpuThreadPool* pool = nullptr;  ///< CPU update threads; null = the global pool
  /// One-step delayed update (opt-in, Note [Delayed update]): the next forward does not wait for
  /// the CPU updates; a CPU-updated Block's new weights go up once the following backward is done
  /// with it, so its weights lag one update. Clipping stays exact (the norm is known first).
  bool delayed = false;
  /// With `delayed`: the first this many updates run exact, the rest delayed (as ZeRO-Offload
  /// starts its delayed parameter update after N steps); counted on the update count, so a resumed
  /// run switches at the same step.
  int64_t delayed_after = 0;
  /// Rounding of bf16 host states (ParamStoreOptions::host_state_dtype); seed 0 as CpuOptimizer.
  Rounding state_rounding = Rounding::kNearestEven;

  /// The update split (Note [Update split]): solved from measured times when `solve_split`.
  bool solve_split = false;
  std::optional<double> fixed_k;  ///< the user's k; nullopt = auto (the fastest predicted split)
  int64_t min_gpu_blocks = 0;     ///< the memory plan's range for the GPU-updated prefix (store Blocks)
  int64_t max_gpu_blocks = -1;    ///< -1 = every Block
  int64_t first_solve_step = 3;   ///< steps measured before the first solve
  int64_t resolve_every = 0;      ///< re-solve every N steps after that (0 = once)

  std::vector<int64_t> trace_steps;  ///< 1-based steps written to `trace_path` (Chrome trace JSON)
  std::string trace_path;
  /// A reading for the trace's counter tracks (monitor/chrome_trace.h).
  using CounterPoint = ::tandem::CounterPoint;
  /// Telemetry between two times (the traced steps), for counter tracks; unset = no counters.
  std::function<std::vector<CounterPoint>(std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point)>
      trace_counters;
  std::function<void(const std::string&)> log;  ///< one line per split decision and trace written
  /// Stale mirrors (Note [Block placement]): a CPU-updated Block's device copy is refreshed every
  /// this many updates, so a Block on the device computes with weights at most mirror_every - 1
  /// updates old; 1 = every update (exact).
  int64_t mirror_every = 1;
  /// Data parallel (Note [Data-parallel engine]): each Block's gradient is summed over the ranks as
  /// soon as backward completes it (all-reduce, or reduce-scatter with a sharded store). Null: one process.
  Comm* comm = nullptr;
};

/// The fewest host ring slots a delayed update runs with (Note [Delayed host ring]).
inline constexpr int64_t kDelayedRingSlots = 3;

/// What end_step() decided.
struct StepOutcome {
  double grad_norm = 0.0;    ///< global norm of the (unscaled) gradients, before clipping
  bool skipped = false;      ///< a non-finite gradient: nothing was updated
  bool rolled_back = false;  ///< the speculative CPU updates were undone (clipping or skip)
};

/// Cumulative counters of an engine.
struct EngineStats {
  int64_t steps = 0, skipped = 0, rollbacks = 0;
  int64_t speculative_steps = 0;  ///< steps whose CPU updates ran speculatively
  double cpu_update_s = 0.0;      ///< summed CPU update time (updater thread)
  /// Summed D2H and H2D stream time of CPU-updated Blocks' transfers (each counted once complete;
  /// delayed mode's uploads, issued by the step loop, are not counted).
  double transfer_s = 0.0;
  int64_t cpu_updated_params = 0;
  double nvme_wait_s = 0.0;  ///< Note [NVMe tier]: the updater waiting for states to be read
  int64_t nvme_read_bytes = 0, nvme_written_bytes = 0;
  int64_t delayed_steps = 0;     ///< steps whose CPU-updated weights lagged one update
  int64_t abandoned = 0;         ///< steps given up part-way (abandon_step)
  int64_t mirror_refreshes = 0;  ///< device copies refreshed when a Block came back from the CPU
  int64_t max_mirror_lag = 0;    ///< the most updates a device-run Block's weights have lagged its master
};

/// The facade of the offload step (Note [Gradient streaming]): it dispatches each Block as backward
/// completes it, decides clipping, speculation and rollback once the norm is known, and drives the
/// parts that own the rest: the CPU updater, the device side's update, the split tuner, the step
/// stamps and the trace; the Blocks' placement on the CPU (Note [Block placement]) is set here.
class OffloadEngine {
 public:
  OffloadEngine(BlockSequence& model, ParamStore& store, EngineOptions options);
  ~OffloadEngine();
  OffloadEngine(const OffloadEngine&) = delete;
  OffloadEngine& operator=(const OffloadEngine&) = delete;

  /// Starts a step at learning rate `lr`; gradients are divided by `loss_scale` (fp16).
  void begin_step(double lr, double loss_scale = 1.0);
  /// Before each micro-batch's backward: on the last one, Blocks are dispatched as they complete.
  void begin_micro(bool last);
  /// After the last backward: global norm, clipping and non-finite check (Note [Speculative
  /// clipping]), the GPU-updated Blocks' update, gradients zeroed. The next forward waits per Block.
  StepOutcome end_step();
  /// Gives up the step begun (an out-of-memory error part-way through it): nothing is updated,
  /// speculative CPU updates are undone, gradients are zeroed; counted in stats().abandoned.
  void abandon_step();
  /// Blocks until every update of the last step is in the working weights (for evaluation,
  /// checkpoints and the end of training).
  void wait_all();
  /// Writes the trace of a traced step that has ended (otherwise written when the next step
  /// begins): for the end of a run.
  void finish_trace();

  /// Note [Block placement]: the Blocks flagged run on the CPU from the next forward on, with the
  /// host copies of the ParamStore; the rest on the device. Between steps only. UserError for a
  /// Block that cannot run on the CPU (the embedding and head, GPU-updated Blocks) or an engine
  /// mode that does not allow it (host ring, delayed update, several ranks).
  void set_placement(const std::vector<bool>& on_host);
  const std::vector<bool>& placement() const { return host_run_; }
  /// Per Block, the last step's forward + backward seconds of its last micro-batch as the compute
  /// stream saw them (crossing copies included, the forward's wait for the next Block's weights not:
  /// Note [Step stamps]); 0 for the embedding and the head.
  std::vector<double> block_seconds() const;

  /// A consistent copy of the counters (the updater thread adds to them).
  EngineStats stats() const;
  const SplitStatus& split() const { return tuner_->status(); }
  /// Between steps: the most store Blocks the split may put on the device from the next solve on.
  void set_max_gpu_blocks(int64_t max_gpu_blocks);
  /// Optimizer state under FusedAdamW's names (for checkpoints), the step count as ".step".
  std::vector<NamedTensor> state() { return store_.state(step_tensor_); }
  /// Sets the states and the step count from a checkpoint's state() names (ParamStore::load_state).
  void load_state(const std::function<std::optional<torch::Tensor>(const std::string&)>& lookup,
                  const std::string& source) {
    store_.load_state(lookup, source, step_tensor_);
    sync_step_from_state();
  }
  /// Restores the step count after a checkpoint's state was copied into state().
  void sync_step_from_state() { stats_.steps = static_cast<int64_t>(step_tensor_.item<float>()); }
  /// Sets the update count (a sharded checkpoint's, Note [Sharded checkpoints]).
  void set_step_count(int64_t steps) {
    stats_.steps = steps;
    step_tensor_.fill_(static_cast<double>(steps));
  }

 private:
  void check_options() const;
  void on_param_ready(size_t block);
  void on_gradient_arriving(size_t block);
  void dispatch(size_t block);
  void dispatch_host_run(size_t block);
  void copy_down(size_t block, const torch::Tensor& grad, bool reduced_on_d2h);
  CpuUpdateJob job(size_t block, double grad_scale, bool undo, bool upload) const;
  torch::Tensor reduce_gradient(size_t block);  // Note [Data-parallel engine]; the gradient to use
  void before_block(size_t block);
  void refresh_mirror(size_t block);
  void wait_block(size_t block);
  StepOutcome finish_step(bool abandon);
  double clip_coefficient(StepOutcome& out);
  void queue_cpu_updates(double grad_scale);
  CpuUpdateJob ring_speculation(size_t i) const;
  void roll_back(bool skipped, double grad_scale);
  void zero_gradients(bool skipped);
  void sync_streams();
  void mark_on_compute(Stamp& st);
  void resolve_split();
  void start_delayed();
  void start_trace();
  void collect_trace();

  BlockSequence& model_;
  ParamStore& store_;
  const EngineOptions options_;
  const bool cuda_;
  const bool ring_;              // Note [Host ring]
  EngineStats stats_;            // the step loop's counters; the CPU updater keeps its own
  mutable std::mutex stats_mu_;  // stats_ between the step loop and a forward recomputed in backward
  torch::Tensor step_tensor_;    // 0-d fp32 host: the step count, shared by every ".step" entry

  // The step in progress.
  double lr_ = 0.0, loss_scale_ = 1.0;
  int64_t steps_begun_ = 0;
  bool last_micro_ = true;
  bool in_forward_ = false;
  bool speculate_now_ = true;
  bool delayed_now_ = false;           // Note [Delayed update]: options_.delayed, past delayed_after
  std::deque<bool> would_roll_back_;   // recent steps: clipped or non-finite
  std::vector<int64_t> remaining_;     // per Block: parameters whose gradient is not yet complete
  std::vector<char> dispatched_;       // char, not bool: the CPU and device autograd threads dispatch concurrently
  std::vector<torch::Tensor> sqnorm_;  // per Block: 0-d fp32 device, squared gradient norm
  std::vector<torch::Tensor> sqnorm_host_;  // host ring: per Block, 0-d fp32 pinned, sqnorm_ copied down (Note [Retraction])

  // Note [Delayed update]: the order this step's backward first reached the Blocks, and the order
  // the last CPU updates were queued in; with a ring, the Blocks whose next backward must wait for
  // the copy down of their gradient (Note [Delayed host ring]).
  std::vector<char> arrived_;
  std::vector<size_t> backward_order_, queued_order_;
  std::vector<char> await_gradient_taken_;
  std::vector<std::pair<torch::Tensor, unsigned>> gradient_prehooks_;  // removed by the destructor

  // Note [Block placement].
  std::vector<bool> host_run_;
  std::vector<bool> upload_now_;    // per Block, this step: its update goes up to the device copy
  std::vector<bool> zero_landing_;  // host-run Blocks: the landing buffer is cleared before this step's backward

  // The parts (constructed in this order, the updater thread last; destroyed in reverse).
  std::unique_ptr<TransferStreams> streams_;  // null with the CPU as the device
  std::unique_ptr<StepStamps> stamps_;
  std::unique_ptr<SplitTuner> tuner_;
  std::unique_ptr<OffloadTrace> trace_;
  std::unique_ptr<DeviceUpdater> device_updater_;
  std::unique_ptr<CpuUpdater> updater_;
};

}  // namespace tandem
