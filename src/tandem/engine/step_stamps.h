#pragma once
// The timing points of one offload step (Note [Step stamps]): per Block, when the forward arrived
// at it and when it started (after waiting for its weights) and when its backward ended on the
// compute stream, when its gradient's copy down and its weights' copy up started and ended on the
// D2H and H2D streams; when the device side's update started and ended;
// and a reference point for the trace. CUDA timing events on a GPU, the host clock with the CPU as
// the device. Owns the points and the clock they are read against, nothing else: the split tuner
// turns them into times, the trace draws them, and they order no work (the events that do are
// TransferStreams').

#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <chrono>
#include <memory>
#include <vector>

namespace tandem {

/// A point in time on a stream: a timing CUDA event, or the host clock when the device is the CPU
/// (its "streams" are the calling thread).
struct Stamp {
  std::unique_ptr<c10::Event> ev;  ///< null with the CPU as the device
  double host = -1;                ///< seconds since the stamps' epoch (CPU device; the trace's reference)
  bool set = false;                ///< recorded since the last clear()
};

/// Seconds from `a` to `b`, both recorded and complete; 0 while either is unset.
double between(const Stamp& a, const Stamp& b);
/// As between(), but 0 while `b` is still pending on its stream (never waits).
double completed_between(const Stamp& a, const Stamp& b);

/// Every timing point of a step (Note [Step stamps]).
struct StepStamps {
  /// `blocks` Blocks; CUDA timing events when `cuda`, the host clock otherwise.
  StepStamps(size_t blocks, bool cuda);

  // Per Block: forward arrival and start, backward end (compute stream); D2H and H2D start and end.
  std::vector<Stamp> arrive, fwd, bwd, d2h0, d2h1, h2d0, h2d1;
  Stamp gpu0, gpu1;  ///< the device side's update (compute stream)
  Stamp ref;         ///< a traced step's reference: host clock and, on a GPU, an event at the same time
  /// The host clock's zero; the trace's timestamps count from it.
  const std::chrono::steady_clock::time_point epoch = std::chrono::steady_clock::now();

  /// Records `st` on `stream` (a GPU), or reads the host clock (the CPU device: `stream` unused).
  void mark(Stamp& st, const c10::Stream* stream);
  /// Seconds since `epoch`.
  double host_now() const;
  /// Unsets every stamp but `ref` (a traced step draws only what it recorded).
  void clear();

  /// Block i's forward: from its start to the forward's arrival at Block i+1, without the wait for
  /// Block i+1's weights; to Block i+1's start where no arrival is stamped (i + 1 < Blocks).
  double forward_s(size_t i) const { return between(fwd[i], arrive[i + 1].set ? arrive[i + 1] : fwd[i + 1]); }
  /// Block i's backward: from Block i+1's gradients to Block i's (i + 1 < Blocks).
  double backward_s(size_t i) const { return between(bwd[i + 1], bwd[i]); }
  /// The last Block's forward, loss and backward.
  double last_block_s() const { return between(fwd.back(), bwd.back()); }
  /// Block i's gradient copy down and weights copy up.
  double d2h_s(size_t i) const { return between(d2h0[i], d2h1[i]); }
  double h2d_s(size_t i) const { return between(h2d0[i], h2d1[i]); }
  /// The device side's update.
  double device_update_s() const { return between(gpu0, gpu1); }
  /// Per Block, forward + backward; 0 for the first and the last (embedding and head).
  std::vector<double> block_seconds() const;
};

}  // namespace tandem
