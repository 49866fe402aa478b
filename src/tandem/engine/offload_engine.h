#pragma once
// The offload engine's step: gradients stream to the CPU Block by Block as backward completes
// them, the CPU updates each Block's fp32 master and states while backward goes on, and the new
// weights stream back; the update split's GPU-updated Blocks are updated on the device
// (ARCHITECTURE.md, "One training step, offload mode"; Note [Gradient streaming]).

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tandem/engine/param_store.h"
#include "tandem/optim/cpu_update.h"
#include "tandem/optim/optimizer.h"

namespace tandem {

class CpuThreadPool;
struct Stamp;  // a timing point on a stream (offload_engine.cpp)

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
  /// A reading for the trace's counter tracks (power, utilisation, memory).
  struct CounterPoint {
    std::chrono::steady_clock::time_point t;
    std::string track;  ///< e.g. "GPU power (W)"
    double value;
  };
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

/// The update split in force and what the solver said about it.
struct SplitStatus {
  int64_t gpu_blocks = 0;
  double k = 0;                 ///< gpu_blocks / Blocks
  double alpha = 0;             ///< GPU / CPU update cost per parameter, measured
  double predicted_step_s = 0;  ///< the model's step time for the split in force
  double measured_step_s = 0;   ///< median step time measured before the last solve (its split)
  double predicted_measured_s = 0;  ///< the model's time for that measured split
  bool solved = false;
};

/// What end_step() decided.
struct StepOutcome {
  double grad_norm = 0.0;  ///< global norm of the (unscaled) gradients, before clipping
  bool skipped = false;    ///< a non-finite gradient: nothing was updated
  bool rolled_back = false;  ///< the speculative CPU updates were undone (clipping or skip)
};

/// Cumulative counters of an engine.
struct EngineStats {
  int64_t steps = 0, skipped = 0, rollbacks = 0;
  int64_t speculative_steps = 0;  ///< steps whose CPU updates ran speculatively
  double cpu_update_s = 0.0;    ///< summed CPU update time (updater thread)
  /// Summed D2H and H2D stream time of CPU-updated Blocks' transfers (each counted once complete;
  /// delayed mode's uploads, issued by the step loop, are not counted).
  double transfer_s = 0.0;
  int64_t cpu_updated_params = 0;
  int64_t delayed_steps = 0;  ///< steps whose CPU-updated weights lagged one update
  int64_t abandoned = 0;      ///< steps given up part-way (abandon_step)
  int64_t mirror_refreshes = 0;  ///< device copies refreshed when a Block came back from the CPU
  int64_t max_mirror_lag = 0;    ///< the most updates a device-run Block's weights have lagged its master
};

class OffloadEngine {
 public:
  OffloadEngine(Model& model, ParamStore& store, EngineOptions options);
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

  /// Note [Block placement]: the Blocks flagged run on the CPU from the next forward on, with the
  /// host copies of the ParamStore; the rest on the device. Between steps only. UserError for a
  /// Block that cannot run on the CPU (the embedding and head, GPU-updated Blocks) or an engine
  /// mode that does not allow it (host ring, delayed update, several ranks).
  void set_placement(const std::vector<bool>& on_host);
  const std::vector<bool>& placement() const { return host_run_; }
  /// Per Block, the last step's forward + backward seconds of its last micro-batch as the compute
  /// stream saw them (crossing copies and waits included); 0 for the embedding and the head.
  std::vector<double> block_seconds() const;

  /// A consistent copy of the counters (the updater thread adds to them).
  EngineStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  const SplitStatus& split() const { return split_; }
  /// Optimizer state under FusedAdamW's names (for checkpoints), the step count as ".step".
  std::vector<NamedTensor> state() { return store_.state(step_tensor_); }
  /// Restores the step count after a checkpoint's state was copied into state().
  void sync_step_from_state() { stats_.steps = static_cast<int64_t>(step_tensor_.item<float>()); }
  /// Sets the update count (a sharded checkpoint's, Note [Sharded checkpoints]).
  void set_step_count(int64_t steps) {
    stats_.steps = steps;
    step_tensor_.fill_(static_cast<double>(steps));
  }

 private:
  struct Job {
    size_t block;
    double grad_scale, lr;
    int64_t step;  ///< 1-based update count (bias correction)
    bool undo;
    bool upload = true;  ///< false in delayed mode: the next backward's dispatch uploads
    int64_t slot = -1;   ///< host ring slot (Note [Host ring]); -1 = the Block's own buffers
    int64_t prev_owner = -1;  ///< host ring: the Block whose upload last read the slot's staging
    bool host = false;        ///< the Block ran on the CPU: its gradient was already on the host
  };
  struct CpuSpan {  // one CPU update, for the trace
    size_t block;
    double t0, t1;  // seconds since the trace reference
    bool undo;
  };
  void on_param_ready(size_t block);
  void dispatch(size_t block);
  void updater_loop();
  void run_cpu_update(const Job& job);
  void upload(size_t block, int64_t slot = -1);
  void wait_updated(size_t block);  // until Block's latest update is done (uploaded or enqueued); rethrows the updater's failure
  void wait_block(size_t block);
  void wait_cpu_jobs();
  std::vector<UpdateSpan> spans(size_t block, int64_t slot);  // the landing and staging buffers
  // The CPU kernel's spans over b's slice: `grad` read (fp32 or bf16), the new weights written into
  // `out` when it is bf16 (else the caller copies the master).
  static std::vector<UpdateSpan> block_spans(BlockStore& b, const torch::Tensor& grad, const torch::Tensor& out);
  void ring_d2h(Job& job);
  static std::vector<UndoLog> undo_logs(BlockStore& b);  // host ring: a slot, the gradient's D2H into it, the gradient zeroed
  UpdateHyper hyper(double lr, int64_t step, double grad_scale) const;
  void update_gpu_blocks(double grad_scale);
  void update_device_blocks_on_host(const std::vector<size_t>& blocks, double grad_scale);  // the CPU device
  torch::Tensor reduce_gradient(size_t block);  // Note [Data-parallel engine]; the gradient to use
  void before_block(size_t block);
  void upload_after_backward(size_t block);  // delayed mode: waits for the Block's update first
  void upload_pending(size_t block);         // delayed mode: staging up, behind the compute stream
  void sync_streams();
  StepOutcome finish_step(bool abandon);
  void resolve_split();
  void calibrate_costs(int64_t cpu_blocks_params, int64_t gpu_blocks_params);
  void start_trace();
  void collect_trace();
  double host_now() const;
  void mark_on_compute(Stamp& st);  // on the compute stream, or the host clock

  Model& model_;
  ParamStore& store_;
  EngineOptions options_;
  const bool cuda_;
  EngineStats stats_;
  torch::Tensor step_tensor_;  // 0-d fp32 host: the step count, shared by every ".step" entry
  double lr_ = 0.0, loss_scale_ = 1.0;
  bool last_micro_ = true;
  bool speculate_now_ = true;
  std::deque<bool> would_roll_back_;  // recent steps: clipped or non-finite
  std::vector<int64_t> remaining_;  // per Block: parameters whose gradient is not yet complete
  std::vector<char> dispatched_;    // char, not bool: the CPU and device autograd threads dispatch concurrently
  std::vector<bool> host_run_;      // Note [Block placement]
  std::vector<bool> upload_now_;    // per Block, this step: its update goes up to the device copy
  std::vector<bool> zero_landing_;  // host-run Blocks: the landing buffer is cleared before this step's backward
  std::vector<torch::Tensor> sqnorm_;  // per Block: 0-d fp32 device, squared gradient norm

  struct Streams;  // CUDA streams and events (Note [Gradient streaming])
  std::unique_ptr<Streams> streams_;
  struct Stamps;   // per-Block timing points on the compute, D2H and H2D streams
  std::unique_ptr<Stamps> stamps_;

  // Split solving and tracing (begin_step).
  SplitStatus split_;
  int64_t steps_begun_ = 0;
  bool in_forward_ = false;
  std::chrono::steady_clock::time_point last_begin_{}, epoch_ = std::chrono::steady_clock::now();
  std::vector<double> step_times_;  // since the last solve
  double cal_cpu_ = 0, cal_gpu_ = 0, cal_d2h_ = 0, cal_h2d_ = 0;  // calibrated per-parameter costs
  double live_cpu_s_ = 0;
  int64_t live_cpu_params_ = 0;
  std::vector<bool> pending_upload_;  // delayed mode: staging holds an update not yet uploaded
  const bool ring_;                   // Note [Host ring]
  int64_t next_slot_ = 0;             // updater thread only
  std::vector<int64_t> slot_owner_;   // per ring slot: the Block whose upload last read it, or -1
  bool tracing_ = false;
  int64_t traced_step_ = 0;
  double trace_ref_host_ = 0;
  std::vector<CpuSpan> cpu_spans_;
  std::vector<std::string> trace_events_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::vector<int> done_;  // per Block: 1 once its latest update is uploaded (or enqueued on H2D)
  int64_t in_flight_ = 0;
  bool stop_ = false;
  std::exception_ptr updater_error_;  // the updater thread's first failure, rethrown by the waits
  std::thread updater_;
};

}  // namespace tandem
