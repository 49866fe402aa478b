#pragma once
// The offload engine's CUDA streams beside the compute stream, and the per-Block events that order
// a CPU-updated Block's gradient down and its new weights up (Note [Gradient streaming]): G_i (the
// gradient is complete), D_i (it has landed on the host), U_i (the new weights are on the device).
// Owns the streams and those events only; the step's timing points are StepStamps'. Not used with
// the CPU as the device, whose streams are the calling thread.

#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <memory>
#include <vector>

namespace tandem {

/// The D2H and H2D streams and the events G_i, D_i, U_i of `blocks` Blocks on one CUDA device.
struct TransferStreams {
  TransferStreams(c10::Device device, size_t blocks);

  c10::impl::VirtualGuardImpl impl{c10::DeviceType::CUDA};
  c10::Device device;
  c10::Stream d2h, h2d;
  /// Per Block: G_i, D_i, U_i. Timing events, so the same events can be timed.
  std::vector<std::unique_ptr<c10::Event>> grad_ready, landed, uploaded;

  /// The current (compute) stream of the device.
  c10::Stream compute() const { return impl.getStream(device); }
  /// Blocks the host until the compute, D2H and H2D streams are idle.
  void synchronize() const;
};

}  // namespace tandem
