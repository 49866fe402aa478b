#pragma once
// The CPU side of the offload engine's update (Note [Gradient streaming]): one updater thread that
// takes CPU-updated Blocks' jobs in the order queued, waits until each gradient has landed on the
// host, runs the fused CPU kernel over the Block's fp32 master and states on the thread pool (with an
// undo log when speculating, rolled back on request: Note [Speculative clipping]) and sends the new
// weights up; without an undo log (a host ring) it takes a speculative update back by solving it
// back (Note [Retraction]). It also owns the host ring's slots and copies down (Note [Host ring])
// and the uploads a delayed update leaves pending (Note [Delayed update]). It decides nothing: the
// engine says which Blocks are updated, when, and with what scale.

#include <torch/torch.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "tandem/engine/param_store.h"
#include "tandem/engine/step_stamps.h"
#include "tandem/engine/transfer_streams.h"
#include "tandem/optim/cpu_update.h"

namespace tandem {

/// One CPU update of one Block.
struct CpuUpdateJob {
  size_t block = 0;
  double grad_scale = 1.0, lr = 0.0;
  int64_t step = 1;         ///< 1-based update count (bias correction)
  bool undo = false;        ///< keep an undo log (a speculative update)
  bool upload = true;       ///< false: the weights stay on the host (delayed mode, host-run Blocks, stale mirrors)
  int64_t slot = -1;        ///< host ring slot (Note [Host ring]); -1 = the Block's own buffers
  int64_t prev_owner = -1;  ///< host ring: the Block whose upload last read the slot's staging
  bool host = false;        ///< the Block ran on the CPU: its gradient was already on the host
  /// A speculative update through a host ring, which keeps no undo log (Note [Retraction]): the
  /// device gradient stays for a retraction (the step's end zeroes it), and the update runs only
  /// where the Block's squared gradient norm (square_norm, a device scalar, copied down with the
  /// gradient into the pinned square_norm_host) is finite, so what it writes can be solved back.
  bool keep_gradient = false;
  torch::Tensor square_norm, square_norm_host;
  /// > 0: first take back this step's speculative update of the Block, made with this gradient
  /// scale (cpu_retract), where it ran; then the update unless `update` is false (a skipped step).
  double retract_scale = 0.0;
  bool update = true;
  /// The parameter groups' hyper-parameters when the job was queued (Note [Parameter groups]).
  std::shared_ptr<const std::vector<GroupHyper>> groups;
};

struct CpuUpdaterOptions {
  /// Rule, betas, eps, weight decay and state rounding; each job sets lr, step and grad scale.
  UpdateHyper hyper;
  CpuThreadPool* pool = nullptr;  ///< the kernel's threads; null = the global pool
  bool delayed = false;           ///< Note [Delayed update]: updates go up after the next backward
};

/// What the updater thread has measured so far.
struct CpuUpdaterCounters {
  double cpu_update_s = 0.0;  ///< summed kernel time
  double transfer_s = 0.0;    ///< summed D2H and H2D time of the updated Blocks' completed copies
  int64_t cpu_updated_params = 0;
  double nvme_wait_s = 0.0;  ///< Note [NVMe tier]: waiting for Blocks' states to be read
};

/// One CPU update, for the trace: seconds since the step stamps' epoch.
struct CpuUpdateSpan {
  size_t block;
  double t0, t1;
  bool speculative;
};

class CpuUpdater {
 public:
  /// Starts the updater thread. `streams` is null with the CPU as the device.
  CpuUpdater(ParamStore& store, CpuUpdaterOptions options, TransferStreams* streams, StepStamps& stamps);
  /// Runs what is queued, then stops the thread.
  ~CpuUpdater();
  CpuUpdater(const CpuUpdater&) = delete;
  CpuUpdater& operator=(const CpuUpdater&) = delete;

  /// Queues `jobs` in order; each Block counts as not updated until its job has run. Any thread.
  void enqueue(const std::vector<CpuUpdateJob>& jobs);
  /// Until Block i's latest update is done (uploaded, or its upload queued on the H2D stream);
  /// rethrows the updater thread's first failure.
  void wait_updated(size_t i);
  /// Until no job is queued or running; rethrows the updater thread's first failure.
  /// Between steps, idle: updates go up after the next backward from now on (Note [Delayed update]).
  void set_delayed(bool delayed);
  void wait_idle();

  /// Restores Block i's master and states from its undo log, bit for bit, and its staging buffer
  /// from them (a speculative update undone). The updater must be idle.
  void roll_back(size_t i);
  /// Copies Block i's new weights (its staging buffer, or ring slot `slot`'s) into its slice of the
  /// working weights: on the H2D stream, recording U_i; all-gathered with a sharded store.
  void upload(size_t i, int64_t slot = -1);

  /// Delayed update: Block i's latest update is on the host and not yet uploaded.
  bool pending_upload(size_t i) const;
  /// Delayed update, from Block i's dispatch: waits for its update, then upload_pending(i).
  void upload_after_backward(size_t i);
  /// Delayed update: uploads Block i's pending update behind everything queued on the compute stream.
  void upload_pending(size_t i);

  /// Host ring with a delayed update (Note [Delayed host ring]): until the updater has queued the
  /// copy down of Block i's gradient of the last queued update (the next backward may then write
  /// the device gradient behind D_i); rethrows the updater thread's first failure.
  void wait_gradient_taken(size_t i);

  /// A consistent copy of the counters.
  CpuUpdaterCounters counters() const;
  /// Starts (true) or stops keeping a span per update; returns those kept since the start.
  std::vector<CpuUpdateSpan> trace(bool on);

 private:
  void loop();
  void run_job(CpuUpdateJob& job, CpuUpdateJob* next, int64_t next_on_disk);
  static bool on_disk(const BlockStore& b);
  bool ring_d2h(CpuUpdateJob& job, bool wait);
  int64_t free_slot(bool wait);
  void wait_for_buffers(const CpuUpdateJob& job);
  void count_transfer(const CpuUpdateJob& job);
  /// Whether it wrote the Block's new weights (a speculative update on a non-finite gradient does not).
  bool run_update(const CpuUpdateJob& job, int64_t next_on_disk);
  void release_slot(int64_t slot);

  ParamStore& store_;
  CpuUpdaterOptions options_;  // `delayed` changes only while idle (set_delayed)
  TransferStreams* const streams_;  // null: the CPU device
  StepStamps& stamps_;
  const bool ring_;                  // Note [Host ring]
  int64_t next_slot_ = 0;            // updater thread only
  std::vector<char> speculated_;     // updater thread only: Block i's last speculative ring update ran
  std::vector<int64_t> slot_owner_;  // per ring slot: the Block whose upload last read it, or -1; updater thread only

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::deque<CpuUpdateJob> queue_;
  std::vector<int> done_;              // per Block: 1 once its latest update is uploaded (or enqueued on H2D)
  std::vector<char> pending_upload_;   // delayed mode, per Block: updated on the host, not yet uploaded
  std::vector<int64_t> pending_slot_;  // delayed mode with a ring, per Block: the slot its new weights wait in
  std::vector<char> gradient_taken_;   // ring, per Block: the copy down of its queued update's gradient is issued
  std::vector<char> slot_free_;        // ring, per slot: no update's weights wait in its staging half
  int64_t in_flight_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;  // the updater thread's first failure, rethrown by the waits
  CpuUpdaterCounters counters_;
  bool tracing_ = false;
  std::vector<CpuUpdateSpan> spans_;
  std::thread thread_;  // last: started once everything above is ready
};

}  // namespace tandem
