#pragma once
// Activation offload: what autograd saves inside chosen Blocks goes to pinned host memory during
// the forward and comes back for their backward, instead of being recomputed (checkpointing) or
// kept on the GPU (Note [Activation offload]).

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tandem/models/host_arena.h"

namespace tandem {

/// Makes tandem's autograd engine the process's default where LibTorch's base engine is (a C++
/// program): LibTorch's engine with one addition, the saved-tensor hooks of an
/// ActivationOffloadScope. Inside Python torch's own engine is the default and stays so. Returns
/// whether tandem's engine is the default now; Model::set_activation_offload calls it, so only a
/// program that offloads activations runs it.
bool use_tandem_autograd_engine();

/// One saved tensor's copy on the host, its events and its copy back (activation_offload.cpp).
struct HostCopy;

/// What one model's offloaded Blocks sent to the host, the streams they use and the copies back
/// that run ahead of the backward (Note [Activation prefetch]).
class ActivationOffload {
 public:
  struct Options {
    int64_t min_bytes = int64_t{1} << 20;  ///< smaller saved tensors stay where they are
    bool host_tensors = false;             ///< tests: CPU tensors are copied too (on a CPU-only machine)
    /// Makes the host slab the saved tensors are cut from (Note [Activation host arena]): the
    /// trainer passes memory/pinned.h's host_tensor; empty = LibTorch's pinned allocator
    /// (pageable with host_tensors).
    HostArena::Allocator host_slab;
    bool log = false;  ///< keep a line per taken tensor (saved_log): what made it, its dtype and shape
  };
  ActivationOffload() : ActivationOffload(Options{}) {}
  explicit ActivationOffload(Options o);

  /// Whether a tensor that autograd saves is sent to the host: a floating-point CUDA tensor (or a
  /// CPU one with host_tensors) of at least min_bytes that is neither a parameter nor one seen
  /// through casts and views (its autocast copy, its transpose for a matmul): those are on the
  /// device for the whole step anyway.
  bool takes(const at::Tensor& t) const;

  /// The stream the device-to-host copies of `device` run on (one from the pool, kept).
  c10::Stream copy_stream(const c10::Device& device) const;
  /// The stream the copies back to `device` run on, ahead of the backward.
  c10::Stream fetch_stream(const c10::Device& device) const;

  /// A tensor of Block `block` went to the host in `copy` (pack): its copy back starts when the
  /// backward reaches the Block after it, or this Block (Note [Activation prefetch]).
  void enlist(int64_t block, const std::shared_ptr<HostCopy>& copy) const;
  /// The device tensor of `copy` for its backward (unpack), on the calling thread's current stream.
  at::Tensor fetch(HostCopy& copy) const;
  /// A copy already made of this very tensor in this forward (Note [One copy per saved tensor]),
  /// now shared by one more saved tensor; null when there is none.
  std::shared_ptr<HostCopy> shared_copy(const at::Tensor& t) const;
  /// A copy made in this forward, for shared_copy to find.
  void remember(const std::shared_ptr<HostCopy>& copy) const;
  /// Saved tensors that shared an earlier copy instead of making their own.
  int64_t shared() const { return shared_.load(); }

  /// The forward has ended: the copies back of the last offloaded Block start now, for the
  /// backward reaches it first (Note [Activation prefetch]).
  void forward_ended() const;

  /// The host memory the saved tensors go to.
  HostArena& arena() const { return arena_; }

  int64_t tensors() const { return tensors_.load(); }
  /// With Options::log, a line per tensor taken so far: "<op that made it> <dtype> [sizes] <bytes>".
  std::vector<std::string> saved_log() const;
  /// Tensors whose copy back was issued before their Block's backward needed it.
  int64_t fetched_ahead() const { return ahead_.load(); }
  int64_t bytes() const { return bytes_.load(); }
  void count(const at::Tensor& t) const;

 private:
  Options options_;
  mutable HostArena arena_;
  // Copies back of a Block's tensors (with mu_ held): issued once, on fetch_stream.
  void prefetch_block(int64_t block, bool ahead) const;

  mutable std::mutex mu_;
  mutable std::optional<c10::Stream> stream_, fetch_stream_;  // of one CUDA device: a model trains on one
  mutable std::map<int64_t, std::vector<std::weak_ptr<HostCopy>>> waiting_;  // by Block, not yet fetched
  mutable std::vector<std::string> log_;
  static constexpr size_t kRecent = 32;
  mutable std::vector<std::weak_ptr<HostCopy>> recent_;  // this forward's last copies
  mutable std::atomic<int64_t> shared_{0};
  mutable std::atomic<int64_t> tensors_{0}, bytes_{0}, ahead_{0};
};

/// While alive, the tensors autograd saves on this thread go through `offload` (those it takes),
/// as tensors of Block `block`.
class ActivationOffloadScope {
 public:
  explicit ActivationOffloadScope(const ActivationOffload& offload, int64_t block = 0);
  ~ActivationOffloadScope();
  ActivationOffloadScope(const ActivationOffloadScope&) = delete;
  ActivationOffloadScope& operator=(const ActivationOffloadScope&) = delete;

 private:
  const ActivationOffload* outer_;
  int64_t outer_block_;
};

}  // namespace tandem
