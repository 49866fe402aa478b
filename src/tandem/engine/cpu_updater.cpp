#include "tandem/engine/cpu_updater.h"

#include <c10/core/StreamGuard.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <stdexcept>

#include "tandem/core/error.h"
#include "tandem/engine/update_spans.h"
#include "tandem/optim/cpu_retract.h"

namespace tandem {
namespace {

// The retraction of the speculative update a Block got (when `retract`) and its update with this
// step's coefficient (when `update`); a retraction followed by an update without an undo log runs
// as one pass (Note [Retraction]). Returns the seconds the retraction took: not the update's time,
// which the split solver reads per parameter.
double retract_and_update(const std::vector<UpdateSpan>& sp, const CpuUpdaterOptions& options, const CpuUpdateJob& job,
                          std::vector<UndoLog>* logs, bool retract, bool update) {
  using Clock = std::chrono::steady_clock;
  const UpdateHyper back = update_hyper(options.hyper, job.lr, job.step, job.retract_scale);
  const UpdateHyper now = update_hyper(options.hyper, job.lr, job.step, job.grad_scale);
  const auto t0 = Clock::now();
  if (retract && update && logs == nullptr) {
    const RetractAndUpdate r = cpu_retract_and_update(sp, back, now, options.pool);
    return r.retract_share * std::chrono::duration<double>(Clock::now() - t0).count();
  }
  double retract_s = 0.0;
  if (retract) {
    cpu_retract(sp, back, options.pool);
    retract_s = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  if (update) cpu_update(sp, now, logs, options.pool);
  return retract_s;
}

}  // namespace

CpuUpdater::CpuUpdater(ParamStore& store, CpuUpdaterOptions options, TransferStreams* streams, StepStamps& stamps)
    : store_(store),
      options_(options),
      streams_(streams),
      stamps_(stamps),
      ring_(store.options().ring_slots > 0),
      speculated_(store.blocks().size(), 0),
      slot_owner_(static_cast<size_t>(store.options().ring_slots), -1),
      done_(store.blocks().size(), 1),
      pending_upload_(store.blocks().size(), 0),
      pending_slot_(store.blocks().size(), -1),
      gradient_taken_(store.blocks().size(), 1),
      slot_free_(static_cast<size_t>(store.options().ring_slots), 1) {
  thread_ = std::thread([this] { loop(); });
}

CpuUpdater::~CpuUpdater() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CpuUpdater::enqueue(const std::vector<CpuUpdateJob>& jobs) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& job : jobs) {
      done_[job.block] = 0;
      ++in_flight_;
      queue_.push_back(job);
      if (options_.delayed) pending_upload_[job.block] = 1;  // goes up after the next backward
      if (ring_) gradient_taken_[job.block] = 0;
    }
  }
  cv_.notify_all();
}

void CpuUpdater::wait_updated(size_t i) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_[i] != 0; });
  if (error_) std::rethrow_exception(error_);
}

void CpuUpdater::set_delayed(bool delayed) {
  std::lock_guard<std::mutex> lock(mu_);
  TANDEM_ASSERT(in_flight_ == 0, "the delayed mode changes between steps");
  options_.delayed = delayed;
}

void CpuUpdater::wait_idle() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return in_flight_ == 0; });
  if (error_) std::rethrow_exception(error_);
}

bool CpuUpdater::pending_upload(size_t i) const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_upload_[i] != 0;
}

void CpuUpdater::wait_gradient_taken(size_t i) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return gradient_taken_[i] != 0; });
  if (error_) std::rethrow_exception(error_);
}

CpuUpdaterCounters CpuUpdater::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

std::vector<CpuUpdateSpan> CpuUpdater::trace(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  tracing_ = on;
  std::vector<CpuUpdateSpan> out;
  out.swap(spans_);
  return out;
}

void CpuUpdater::roll_back(size_t i) {
  auto& b = store_.blocks()[i];
  const auto sp = block_update_spans(b, store_.landing(i, -1), store_.staging(i, -1));
  cpu_rollback(sp, block_undo_logs(b), options_.pool);
  if (!sp.empty() && sp[0].bf16_out == nullptr) b.staging.copy_(b.master);
}

void CpuUpdater::upload(size_t i, int64_t slot) {
  auto& b = store_.blocks()[i];
  const auto staging = store_.staging(i, slot);
  auto mine = b.working.narrow(0, b.shard_offset, b.shard_numel);
  // The updater thread gathers on its own group (Note [Process groups]).
  const int lane = std::this_thread::get_id() == thread_.get_id() ? 1 : 0;
  torch::NoGradGuard no_grad;
  const c10::Stream* h2d = streams_ != nullptr ? &streams_->h2d : nullptr;
  std::optional<c10::StreamGuard> guard;
  if (h2d != nullptr) guard.emplace(*h2d);
  stamps_.mark(stamps_.h2d0[i], h2d);
  mine.copy_(staging, /*non_blocking=*/h2d != nullptr);
  if (store_.sharded()) store_.gather_working(i, lane);  // behind the copy, on the H2D stream
  if (h2d != nullptr) streams_->uploaded[i]->record(*h2d);
  stamps_.mark(stamps_.h2d1[i], h2d);
  if (slot >= 0) release_slot(slot);  // it may take the next Block (its staging is read by this upload, U_i)
}

// Note [Delayed update]
// With offload.delayed_update the CPU updates of step t are queued once step t's norm is known
// (exact clipping, no undo log) but their new weights are not awaited by step t+1's forward: a
// CPU-updated Block's staging buffer goes up when step t+1's backward is done with that Block (its
// dispatch), so step t+1 computes with the weights of step t-1 for those Blocks and step t+2 sees
// step t's update. The CPU update then overlaps a whole forward and backward instead of the
// backward's tail and the next forward; what it costs is convergence: the gradient of step t+1 is
// taken at weights one update old (the one-step staleness of ZeRO-Offload's delayed parameter
// update), measured against the exact engine in docs/benchmarks.md. GPU-updated Blocks are never
// delayed. The dispatch waits on the host for the Block's previous update before anything else:
// that update reads the landing buffer the new gradient is about to overwrite, and its upload must
// follow the backward. The updates are therefore queued in the order the backward reached the
// Blocks (OffloadEngine::queue_cpu_updates), so the backward's first dispatches find their Blocks
// updated first and the CPU's work hides under the whole next forward and backward whenever it is
// shorter than them. wait_all() (evaluation, checkpoints, split solves, traced steps, the
// end) uploads what is pending, so checkpoints hold consistent weights and a resumed run repeats
// the uninterrupted one. With offload.delayed_after = N the first N updates run exact (speculating
// as the exact engine does; the store keeps its undo log for them) and the engine switches between
// steps once the update count reaches N (OffloadEngine::start_delayed), as ZeRO-Offload starts its
// delayed parameter update after a warm-up; the count comes from the checkpoint, so a resumed run
// switches at the same update.
void CpuUpdater::upload_after_backward(size_t i) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_[i] != 0; });
  }
  upload_pending(i);
}

void CpuUpdater::upload_pending(size_t i) {
  int64_t slot = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    slot = ring_ ? pending_slot_[i] : -1;
    pending_upload_[i] = 0;
  }
  if (streams_ != nullptr) {
    auto& s = *streams_;
    s.grad_ready[i]->record(s.compute());  // nothing queued before may still read the old weights
    s.h2d.wait(*s.grad_ready[i]);
  }
  upload(i, slot);
}

// Note [Delayed host ring]
// A delayed update with a host ring (Note [Host ring]) keeps each CPU-updated Block's new weights
// in the staging half of its slot until the next backward is done with the Block, so a slot is
// busy from its Block's copy down to that upload, and the updater takes whichever slot is free
// (not strictly the next one: a slot whose Block waits longer, such as an embedding tied to the
// head, is skipped). The gradient stays in the device's gradient buffer until the updater copies
// it down, and the next backward must not add to that buffer before: each parameter's gradient
// pre-hook (OffloadEngine::on_gradient_arriving) waits until the copy down is queued and makes the
// compute stream wait for D_i. The updates are queued in the order the backward first reaches the
// Blocks, so those waits and the slots follow the backward; the CPU can run ahead of the backward
// by as many Blocks as the ring has slots. A Block the backward reaches early and completes late
// (the embedding tied to the head) holds its slot through the whole backward, and a layer may
// still be completing when the next one is reached, so the ring needs three slots at least
// (kDelayedRingSlots) to always have one for the next Block. The slots are freed by the last
// micro-batch's backward while the first one's needs every gradient copied down, so a delayed ring
// takes one micro-batch per step (train.grad_accum = 1). The result is the per-Block delayed update's, bit for
// bit: the same kernel on the same gradients, uploaded at the same point of the step.

// Note [Host ring]
// Per-Block landing and staging buffers cost 2 x the CPU-updated parameters in the compute dtype
// of pinned memory (about 48 GB at 13B) for buffers that are busy a fraction of the step. With
// offload.host_ring = N the CPU-updated Blocks share N slots instead, each the size of the largest
// Block. The updates then start once the norm is known (no speculation), in forward order (a
// delayed update: Note [Delayed host ring]), and the gradient stays in the device's gradient buffer until the updater
// takes a slot for it, queues the D2H behind that Block's backward (G_i), zeroes the device gradient on the same stream
// and records D_i after the zeroing, and queues the D2H of the next Block before running this one's update, so copies
// down overlap updates; the update waits for the upload of the slot's previous Block (its staging half) only when it is
// about to write it. The next backward writes Block i's gradient only after the forward waited for U_i, which follows
// D_i (the host waited for it), so the zeroing. The cost is the overlap with backward that speculation would give; the
// CPU update is the same kernel on the same data, so the result is identical to the per-Block buffers.
int64_t CpuUpdater::free_slot(bool wait) {
  const auto n = static_cast<int64_t>(slot_free_.size());
  std::unique_lock<std::mutex> lock(mu_);
  int64_t found = -1;
  const auto search = [&] {
    for (int64_t k = 0; k < n && found < 0; ++k)
      if (slot_free_[static_cast<size_t>((next_slot_ + k) % n)] != 0) found = (next_slot_ + k) % n;
    return found >= 0 || stop_;
  };
  if (wait)
    cv_.wait(lock, search);
  else
    search();
  if (found < 0) {
    if (wait) throw std::runtime_error("the CPU updater stopped while waiting for a host ring slot");
    return -1;
  }
  slot_free_[static_cast<size_t>(found)] = 0;
  next_slot_ = found + 1;
  return found;
}

// Returns false (nothing done) when `wait` is false and no slot is free.
bool CpuUpdater::ring_d2h(CpuUpdateJob& job, bool wait) {
  const size_t i = job.block;
  job.slot = free_slot(wait);
  if (job.slot < 0) return false;
  // The slot's landing half was last read by its previous Block's CPU update, already done; its
  // staging half may still be going up: wait_for_buffers waits for that upload (job.prev_owner).
  auto& owner = slot_owner_[static_cast<size_t>(job.slot)];
  job.prev_owner = owner;
  owner = static_cast<int64_t>(i);
  auto& b = store_.blocks()[i];
  auto landing = store_.landing(i, job.slot);
  const torch::Tensor& grad = store_.sharded() ? b.grad_shard : b.grad;
  torch::NoGradGuard no_grad;
  if (streams_ != nullptr) {
    auto& s = *streams_;
    s.d2h.wait(*s.grad_ready[i]);
    const c10::StreamGuard guard(s.d2h);
    stamps_.mark(stamps_.d2h0[i], &s.d2h);
    landing.copy_(grad, /*non_blocking=*/true);
    if (job.square_norm.defined()) job.square_norm_host.copy_(job.square_norm, /*non_blocking=*/true);
    stamps_.mark(stamps_.d2h1[i], &s.d2h);
    if (!job.keep_gradient) b.grad.zero_();
    s.landed[i]->record(s.d2h);  // after the zeroing: U_i follows it, and the next backward U_i
  } else {
    stamps_.mark(stamps_.d2h0[i], nullptr);
    landing.copy_(grad);
    if (job.square_norm.defined()) job.square_norm_host.copy_(job.square_norm);
    stamps_.mark(stamps_.d2h1[i], nullptr);
    if (!job.keep_gradient) b.grad.zero_();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    gradient_taken_[i] = 1;
  }
  cv_.notify_all();
  return true;
}

void CpuUpdater::loop() {
  for (;;) {
    CpuUpdateJob job;
    CpuUpdateJob* next = nullptr;
    int64_t next_on_disk = -1;  // the next queued Block whose states are on the NVMe tier
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_ && queue_.empty()) return;
      job = queue_.front();
      queue_.pop_front();
      // Only this thread pops or edits queued jobs; push_back keeps references to the others valid.
      // With one slot the next Block has nowhere to land before this update is uploaded.
      if (ring_ && slot_owner_.size() > 1 && !queue_.empty() && queue_.front().slot < 0) next = &queue_.front();
      if (store_.disk() != nullptr)
        for (const auto& q : queue_)
          if (on_disk(store_.blocks()[q.block])) {
            next_on_disk = static_cast<int64_t>(q.block);
            break;
          }
    }
    // A failure here (a peer rank gone in the all-gather, a CUDA error) must not end the process
    // from this thread: it is kept and rethrown on the step loop's next wait.
    try {
      run_job(job, next, next_on_disk);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_[job.block] = 1;
      gradient_taken_[job.block] = 1;  // also after a failure: nothing waits for it forever
      --in_flight_;
    }
    cv_.notify_all();
  }
}

void CpuUpdater::run_job(CpuUpdateJob& job, CpuUpdateJob* next, int64_t next_on_disk) {
  if (ring_) {
    if (job.slot < 0) ring_d2h(job, /*wait=*/true);
    if (next != nullptr) ring_d2h(*next, /*wait=*/false);  // its copy down overlaps this update
  }
  wait_for_buffers(job);
  count_transfer(job);
  const bool wrote = run_update(job, next_on_disk);
  if (job.upload && wrote) {
    upload(job.block, job.slot);
  } else if (ring_ && !wrote) {  // nothing new to send up (Note [Retraction])
    release_slot(job.slot);
  } else if (ring_) {  // Note [Delayed host ring]: the weights wait in the slot
    std::lock_guard<std::mutex> lock(mu_);
    pending_slot_[job.block] = job.slot;
  }
}

void CpuUpdater::release_slot(int64_t slot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    slot_free_[static_cast<size_t>(slot)] = 1;
  }
  cv_.notify_all();
}

void CpuUpdater::wait_for_buffers(const CpuUpdateJob& job) {
  if (streams_ == nullptr) return;  // the CPU device's copies are done when issued
  streams_->landed[job.block]->synchronize();
  // Delayed mode: the previous update's upload must have read staging before it is rewritten.
  if (options_.delayed && !ring_) streams_->uploaded[job.block]->synchronize();
  // Host ring: the slot's previous Block must have gone up before staging is rewritten (its upload
  // was issued when the slot was freed).
  if (job.prev_owner >= 0) streams_->uploaded[static_cast<size_t>(job.prev_owner)]->synchronize();
}

void CpuUpdater::count_transfer(const CpuUpdateJob& job) {
  // This Block's gradient copy has landed; its previous upload finished before the forward that
  // preceded this gradient. Delayed mode's uploads are issued by the step loop: not read.
  const size_t i = job.block;
  const auto& st = stamps_;
  const double xfer = job.host ? 0.0
                               : completed_between(st.d2h0[i], st.d2h1[i]) +
                                     (options_.delayed ? 0.0 : completed_between(st.h2d0[i], st.h2d1[i]));
  std::lock_guard<std::mutex> lock(mu_);
  counters_.transfer_s += xfer;
}

bool CpuUpdater::on_disk(const BlockStore& b) { return b.nvme && b.side == UpdateSide::kCpu; }

// Note [NVMe tier]: a Block's states come from its bounce slot (read while the Block before was
// updated), the next such Block's read starts, and the states go back to the file behind the update.
bool CpuUpdater::run_update(const CpuUpdateJob& job, int64_t next_on_disk) {
  const size_t i = job.block;
  auto& b = store_.blocks()[i];
  DiskStates* const disk = on_disk(b) ? store_.disk() : nullptr;
  const auto t_io = std::chrono::steady_clock::now();
  if (disk != nullptr) disk->bind(b);
  if (next_on_disk >= 0) store_.disk()->prefetch(store_.blocks()[static_cast<size_t>(next_on_disk)]);
  const auto t0 = std::chrono::steady_clock::now();
  const auto sp = block_update_spans(b, store_.landing(i, job.slot), store_.staging(i, job.slot), job.groups.get());
  std::vector<UndoLog> logs;
  if (job.undo) {
    TANDEM_ASSERT(b.undo_master.defined(), "block ", b.name, " has no undo buffers");
    logs = block_undo_logs(b);
  }
  // Note [Retraction]: a speculative update without an undo log runs only on a finite gradient, and
  // only one that ran is taken back.
  const bool speculative = job.keep_gradient && job.retract_scale == 0.0;
  TANDEM_ASSERT(!speculative || job.square_norm_host.defined(), "a speculative ring update of ", b.name,
                " came without its gradient norm");
  const bool update = job.update && (!speculative || std::isfinite(job.square_norm_host.item<float>()));
  const bool retract = job.retract_scale > 0.0 && speculated_[i] != 0;
  speculated_[i] = speculative && update ? 1 : 0;
  const double retract_s = retract_and_update(sp, options_, job, job.undo ? &logs : nullptr, retract, update);
  if (!sp.empty() && sp[0].bf16_out == nullptr) store_.staging(i, job.slot).copy_(b.master);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (disk != nullptr) disk->release(b);
  std::lock_guard<std::mutex> lock(mu_);
  counters_.cpu_update_s += dt - retract_s;
  counters_.nvme_wait_s += std::chrono::duration<double>(t0 - t_io).count();
  if (update) counters_.cpu_updated_params += b.shard_numel;
  if (tracing_) {
    const double end = stamps_.host_now();
    spans_.push_back({i, end - dt, end, job.undo || job.keep_gradient});
  }
  return update || retract;
}

}  // namespace tandem
