#include "tandem/serve/layer_stream.h"

#include <c10/core/StreamGuard.h>

#include <algorithm>

#include "tandem/core/error.h"

namespace tandem {

// Note [Layer stream order]
// A forward pass acquires the streamed layers in ascending order and releases each once its work is
// queued; the slots are refilled in the same cyclic order, so when layer j is released its slot
// takes the streamed layer `slots` places later (wrapping into the next pass). The upload waits on
// the slot's `read` event (the compute stream is done with the old contents) and records `ready`;
// acquire makes the compute stream wait on `ready`. Neither waits on the host, so with two or three
// slots the bus carries layer j+1 (and j+2) while layer j computes. A pass that stops early (an
// error mid-step) leaves the order behind; the next acquire of a layer that is not in a slot
// restarts the cycle there.

LayerStream::LayerStream(std::vector<torch::Tensor> host, int64_t slots, c10::Device device)
    : host_(std::move(host)), device_(device) {
  int64_t numel = 0;
  torch::ScalarType dtype = torch::kFloat32;
  for (size_t i = 0; i < host_.size(); ++i) {
    if (!host_[i].defined()) continue;
    order_.push_back(static_cast<int64_t>(i));
    numel = std::max(numel, host_[i].numel());
    dtype = host_[i].scalar_type();
  }
  if (order_.empty()) return;
  TANDEM_ASSERT(slots >= 1, "a layer stream needs at least one slot");
  if (!device_.is_cpu()) {
    impl_.emplace(device_.type());
    h2d_ = impl_->getStreamFromGlobalPool(device_, /*isHighPriority=*/false);
  }
  for (int64_t s = 0; s < slots; ++s) {
    Slot slot;
    slot.flat = torch::empty({numel}, torch::TensorOptions().dtype(dtype).device(device_));  // (numel) dtype
    if (impl_) {
      slot.ready = std::make_unique<c10::Event>(device_.type());
      slot.read = std::make_unique<c10::Event>(device_.type());
    }
    slots_.push_back(std::move(slot));
  }
  refill();
}

LayerStream::~LayerStream() {
  try {
    synchronize();  // the host buffers must outlive the copies that read them
  } catch (...) {
  }
}

void LayerStream::synchronize() {
  if (impl_ && h2d_) impl_->synchronizeStream(*h2d_);
}

LayerStream::Slot* LayerStream::find(int64_t layer) {
  for (auto& s : slots_)
    if (s.layer == layer && s.state != SlotState::kEmpty) return &s;
  return nullptr;
}

void LayerStream::upload(Slot& slot, int64_t layer) {
  const auto& src = host_[static_cast<size_t>(layer)];
  auto dst = slot.flat.narrow(0, 0, src.numel());
  if (!impl_) {
    dst.copy_(src);
  } else {
    const c10::StreamGuard guard(*h2d_);
    h2d_->wait(*slot.read);  // the compute stream is done with the slot's previous layer
    dst.copy_(src, /*non_blocking=*/true);
    slot.ready->record(*h2d_);
  }
  slot.layer = layer;
  slot.state = SlotState::kLoaded;
  ++uploads_;
}

void LayerStream::refill() {
  if (order_.empty()) return;
  for (;;) {
    const int64_t layer = order_[next_];
    Slot* holder = find(layer);
    if (holder != nullptr && holder->state != SlotState::kConsumed) break;  // everything ahead is loaded
    if (holder != nullptr) {
      holder->state = SlotState::kLoaded;  // still there from its last use: no copy
    } else {
      auto it = std::find_if(slots_.begin(), slots_.end(), [](const Slot& s) {
        return s.state == SlotState::kEmpty || s.state == SlotState::kConsumed;
      });
      if (it == slots_.end()) break;
      upload(*it, layer);
    }
    next_ = (next_ + 1) % order_.size();
  }
}

void LayerStream::restart_at(int64_t layer) {
  const auto pos = std::find(order_.begin(), order_.end(), layer);
  TANDEM_ASSERT(pos != order_.end(), "layer ", layer, " is not streamed");
  for (auto& s : slots_) {
    if (s.state == SlotState::kEmpty || s.state == SlotState::kInUse) continue;  // a held layer stays
    if (impl_) s.read->record(impl_->getStream(device_));
    s.state = SlotState::kConsumed;
  }
  next_ = static_cast<size_t>(pos - order_.begin());
  refill();
}

torch::Tensor LayerStream::acquire(int64_t layer) {
  Slot* slot = find(layer);
  if (slot == nullptr) {
    restart_at(layer);
    slot = find(layer);
  }
  TANDEM_ASSERT(slot != nullptr, "layer ", layer, " was not uploaded: every slot holds a layer still acquired");
  if (impl_) impl_->getStream(device_).wait(*slot->ready);
  slot->state = SlotState::kInUse;
  return slot->flat.narrow(0, 0, host_[static_cast<size_t>(layer)].numel());
}

void LayerStream::release(int64_t layer) {
  Slot* slot = find(layer);
  TANDEM_ASSERT(slot != nullptr && slot->state == SlotState::kInUse, "layer ", layer, " released but not acquired");
  if (impl_) slot->read->record(impl_->getStream(device_));
  slot->state = SlotState::kConsumed;
  refill();
}

}  // namespace tandem
