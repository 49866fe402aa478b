#pragma once
// Decoder layers' weights streamed from host memory through a few device buffers, each upload on a
// side stream ahead of the compute that needs it (Note [Streamed layers], Note [Layer stream order]).
// Device-neutral: streams and events are c10's, so this compiles without CUDA headers; with the CPU
// as the device the uploads are plain copies on the calling thread.

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <vector>

namespace tandem {

/// The device buffers ("slots") and the upload order of the streamed layers.
class LayerStream {
 public:
  /// `host[i]` holds decoder layer i's flat weights in (pinned) host memory, or is undefined for a
  /// resident layer; `slots` device buffers of the largest such layer's size are allocated on
  /// `device`, and the first `slots` streamed layers start uploading at once.
  LayerStream(std::vector<torch::Tensor> host, int64_t slots, c10::Device device);
  ~LayerStream();
  LayerStream(const LayerStream&) = delete;
  LayerStream& operator=(const LayerStream&) = delete;

  /// The device copy of streamed layer `layer`; work queued on the device's current stream after
  /// this call sees it complete. Layers are acquired in ascending order, pass after pass; any other
  /// order still works, waiting for uploads it did not prefetch.
  torch::Tensor acquire(int64_t layer);
  /// The current stream's work reading `layer` is queued: its slot may take the next streamed layer
  /// once that work is done.
  void release(int64_t layer);

  /// Layers copied to the device so far (for tests and statistics).
  int64_t uploads() const { return uploads_; }
  int64_t slots() const { return static_cast<int64_t>(slots_.size()); }
  /// Blocks the host until every upload issued has landed.
  void synchronize();

 private:
  enum class SlotState { kEmpty, kLoaded, kInUse, kConsumed };
  struct Slot {
    torch::Tensor flat;  // (max layer numel) on the device
    int64_t layer = -1;
    SlotState state = SlotState::kEmpty;
    std::unique_ptr<c10::Event> ready, read;  // the upload landed; compute finished reading (device only)
  };

  void refill();
  void upload(Slot& slot, int64_t layer);
  Slot* find(int64_t layer);
  void restart_at(int64_t layer);

  std::vector<torch::Tensor> host_;
  std::vector<int64_t> order_;  // streamed layers, ascending
  size_t next_ = 0;             // index into order_ of the next layer to upload
  std::vector<Slot> slots_;
  c10::Device device_;
  std::optional<c10::impl::VirtualGuardImpl> impl_;  // device streams; empty with the CPU as the device
  std::optional<c10::Stream> h2d_;
  int64_t uploads_ = 0;
};

}  // namespace tandem
