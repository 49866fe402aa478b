#pragma once
// Host memory for the tensors activation offload saves: one slab, handed out front to back during a
// step and reused from its start once every tensor of the step is gone (Note [Activation host arena]).

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

namespace tandem {

/// A step-scoped bump allocator of host memory: take() cuts tensors out of one slab; when none of
/// them is alive any more, the next take() starts again at the slab's front. What does not fit goes
/// to the fallback allocator, and the slab grows to the largest step seen when it next starts over.
class HostArena {
 public:
  /// Makes a 1-D byte tensor of at least n bytes: the slab (memory/pinned.h's host_tensor where the
  /// caller has it; LibTorch's pinned allocator otherwise).
  using Allocator = std::function<at::Tensor(int64_t bytes)>;
  /// `slab` makes slabs; `fallback` makes what does not fit (pinned or not as `pinned` says).
  HostArena(Allocator slab, bool pinned);
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  /// A host tensor of these sizes and strides and dtype, uninitialised. When the step starts over
  /// on the slab and `writer` is given, `writer` first waits for the device's copies in and out of
  /// the previous step's tensors (used_on), so a copy queued on it does not overwrite them early.
  at::Tensor take(at::IntArrayRef sizes, at::IntArrayRef strides, at::ScalarType dtype,
                  const std::optional<c10::Stream>& writer);

  /// Makes the slab `bytes` large now (when larger than it is), so that the first step need not
  /// go outside it: the plan's estimate. The first step seen still sets the slab's size.
  void reserve(int64_t bytes);

  /// A device copy into or out of `t` (a tensor take() made) was queued on `stream`: its memory is
  /// not handed out again before that copy ends.
  void used_on(const at::Tensor& t, const c10::Stream& stream);

  int64_t capacity() const;        ///< the slab's bytes
  int64_t fallback_bytes() const;  ///< bytes taken outside the slab, over the arena's life
  int64_t live() const;            ///< tensors taken and not yet freed

 private:
  struct State;
  std::shared_ptr<State> state_;  // shared with the taken tensors' deleters
};

}  // namespace tandem
