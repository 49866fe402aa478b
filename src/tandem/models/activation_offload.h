#pragma once
// Activation offload: what autograd saves inside chosen Blocks goes to pinned host memory during
// the forward and comes back for their backward, instead of being recomputed (checkpointing) or
// kept on the GPU (Note [Activation offload]).

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>

namespace tandem {

/// Makes tandem's autograd engine the process's default: LibTorch's engine with one addition, the
/// saved-tensor hooks of an ActivationOffloadScope. Call once at program start, before any
/// backward (the CLI's and the test binary's main do). Not called inside Python, where torch's own
/// engine is the default and activation offload is refused.
void install_autograd_engine();

/// Whether install_autograd_engine's engine is the default, i.e. activation offload can run here.
bool activation_offload_available();

/// What one model's offloaded Blocks sent to the host, and the copy stream they use.
class ActivationOffload {
 public:
  struct Options {
    int64_t min_bytes = int64_t{1} << 20;  ///< smaller saved tensors stay where they are
    bool host_tensors = false;             ///< tests: CPU tensors are copied too (on a CPU-only machine)
  };
  ActivationOffload() = default;
  explicit ActivationOffload(Options o) : options_(o) {}

  /// Whether a tensor that autograd saves is sent to the host: a floating-point CUDA tensor (or a
  /// CPU one with host_tensors) of at least min_bytes that is neither a parameter nor a parameter's
  /// autocast copy (those are on the device for the whole step anyway).
  bool takes(const at::Tensor& t) const;

  /// The stream the device-to-host copies of `device` run on (one from the pool, kept).
  c10::Stream copy_stream(const c10::Device& device) const;

  int64_t tensors() const { return tensors_.load(); }
  int64_t bytes() const { return bytes_.load(); }
  void count(int64_t bytes) const {
    tensors_.fetch_add(1);
    bytes_.fetch_add(bytes);
  }

 private:
  Options options_;
  mutable std::mutex mu_;
  mutable std::optional<c10::Stream> stream_;  // of one CUDA device: a model trains on one
  mutable std::atomic<int64_t> tensors_{0}, bytes_{0};
};

/// While alive, the tensors autograd saves on this thread go through `offload` (those it takes).
class ActivationOffloadScope {
 public:
  explicit ActivationOffloadScope(const ActivationOffload& offload);
  ~ActivationOffloadScope();
  ActivationOffloadScope(const ActivationOffloadScope&) = delete;
  ActivationOffloadScope& operator=(const ActivationOffloadScope&) = delete;

 private:
  const ActivationOffload* outer_;
};

}  // namespace tandem
