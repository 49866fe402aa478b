#include "tandem/engine/disk_states.h"

#include <algorithm>

#include "tandem/core/error.h"
#include "tandem/engine/host_states.h"
#include "tandem/engine/param_store.h"
#include "tandem/memory/pinned.h"

namespace tandem {

namespace {

// One slot being read for the next Block, one bound to the Block being updated, one being written
// back from the Block before: the disk works while the CPU updates.
constexpr size_t kSlots = 3;

}  // namespace

DiskStates::DiskStates(const std::string& dir, torch::ScalarType dtype, std::function<torch::Tensor(int64_t)> alloc)
    : tier_(dir), dtype_(dtype), alloc_(std::move(alloc)), slots_(kSlots) {}

DiskStates::~DiskStates() {
  try {
    drain();
  } catch (...) {  // the run is ending: the files are scratch
  }
}

int64_t DiskStates::carve(BlockStore& b, const torch::Tensor& buffer) const {
  int64_t off = 0;
  allocate_host_states(b, dtype_, [&](int64_t n, torch::ScalarType t) {
    const int64_t bytes = n * static_cast<int64_t>(c10::elementSize(t));
    torch::Tensor out = buffer.defined() ? buffer.narrow(0, off, bytes).view(t) : torch::Tensor();
    off += NvmeTier::aligned(bytes);
    return out;
  });
  return off;
}

void DiskStates::unbind(BlockStore& b) { b.m = b.v = b.m_scale = b.v_scale = torch::Tensor(); }

int64_t DiskStates::file_bytes(const BlockStore& b) const {
  TANDEM_ASSERT(b.nvme_file >= 0 && b.nvme_file < static_cast<int>(file_bytes_.size()), "block ", b.name,
                " has no file on the NVMe tier");
  return file_bytes_[static_cast<size_t>(b.nvme_file)];
}

void DiskStates::evict(BlockStore& b) {
  std::lock_guard<std::mutex> lock(mu_);
  if (b.nvme_file < 0) {  // the layout, measured once: carve() without a buffer binds nothing
    const auto keep = std::make_tuple(b.m, b.v, b.m_scale, b.v_scale);
    const int64_t bytes = carve(b, torch::Tensor());
    std::tie(b.m, b.v, b.m_scale, b.v_scale) = keep;
    if (bytes > slot_bytes_) {  // between steps: no slot is in use; grown here, not on the updater's path
      slot_bytes_ = bytes;
      for (auto& s : slots_) {
        tier_.wait(s.write_ticket);
        s = Slot{alloc_(slot_bytes_)};
      }
    }
    b.nvme_file = tier_.add_file(b.name, bytes);
    file_bytes_.resize(static_cast<size_t>(b.nvme_file) + 1, 0);
    file_bytes_[static_cast<size_t>(b.nvme_file)] = bytes;
  }
  const int64_t bytes = file_bytes(b);
  forget(b);
  if (!b.m.defined()) return;  // nothing in memory: the new file's zeros are the states
  const torch::Tensor m = b.m, v = b.v, ms = b.m_scale, vs = b.v_scale;
  auto buffer = host_tensor(NvmeTier::aligned(bytes), torch::kUInt8, HostMemory::kPageable);
  carve(b, buffer);
  torch::NoGradGuard no_grad;
  b.m.copy_(m);
  b.v.copy_(v);
  if (ms.defined()) {
    b.m_scale.copy_(ms);
    b.v_scale.copy_(vs);
  }
  tier_.wait(tier_.write(b.nvme_file, 0, buffer.data_ptr(), bytes));
  unbind(b);
}

DiskStates::Slot* DiskStates::slot_of(const BlockStore& b) {
  if (b.nvme_file < 0) return nullptr;
  for (auto& s : slots_)
    if (s.owner == b.nvme_file) return &s;
  return nullptr;
}

void DiskStates::forget(const BlockStore& b) {
  if (Slot* s = slot_of(b)) {
    TANDEM_ASSERT(!s->bound && s->read_ticket == 0, "block ", b.name, "'s states are in use");
    tier_.wait(s->write_ticket);
    s->write_ticket = 0;
    s->owner = -1;
  }
}

DiskStates::Slot& DiskStates::take_slot(const BlockStore& b) {
  Slot* best = nullptr;
  for (auto& s : slots_)
    if (!s.bound && s.read_ticket == 0 && (best == nullptr || s.released_at < best->released_at)) best = &s;
  TANDEM_ASSERT(best != nullptr, "the NVMe tier's bounce slots are all busy (block ", b.name, ")");
  tier_.wait(best->write_ticket);  // its last Block's states are on disk before they are overwritten
  best->write_ticket = 0;
  best->owner = b.nvme_file;
  return *best;
}

// A slot keeps the states of the Block it last held until another Block takes it: binding that
// Block again reads nothing (the file holds the same bytes once the slot's write is done).
void DiskStates::prefetch(BlockStore& b) {
  std::lock_guard<std::mutex> lock(mu_);
  TANDEM_ASSERT(b.nvme_file >= 0, "block ", b.name, " is not on the NVMe tier");
  if (slot_of(b) != nullptr) return;
  Slot& s = take_slot(b);
  s.read_ticket = tier_.read(b.nvme_file, 0, s.buffer.data_ptr(), file_bytes(b));
}

void DiskStates::bind(BlockStore& b) {
  TANDEM_ASSERT(!b.m.defined(), "block ", b.name, "'s states are already in memory");
  prefetch(b);
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = *slot_of(b);
  tier_.wait(s.read_ticket);
  tier_.wait(s.write_ticket);  // its own last write, from this slot: done before the slot changes
  s.read_ticket = s.write_ticket = 0;
  s.bound = true;
  carve(b, s.buffer);
}

void DiskStates::release(BlockStore& b) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot* s = slot_of(b);
  TANDEM_ASSERT(s != nullptr && s->bound, "block ", b.name, " is not bound to a bounce slot");
  s->write_ticket = tier_.write(b.nvme_file, 0, s->buffer.data_ptr(), file_bytes(b));
  s->bound = false;
  s->released_at = ++releases_;
  unbind(b);
}

void DiskStates::drain() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : slots_) {
    tier_.wait(s.write_ticket);
    s.write_ticket = 0;
  }
}

void DiskStates::page_in(BlockStore& b) {
  drain();
  std::lock_guard<std::mutex> lock(mu_);
  TANDEM_ASSERT(b.nvme_file >= 0 && !b.m.defined(), "block ", b.name, " cannot be paged in");
  forget(b);  // page_out may write the file: no slot keeps the older bytes
  const int64_t bytes = file_bytes(b);
  auto buffer = host_tensor(NvmeTier::aligned(bytes), torch::kUInt8, HostMemory::kPageable);
  tier_.wait(tier_.read(b.nvme_file, 0, buffer.data_ptr(), bytes));
  carve(b, buffer);
  paged_[b.nvme_file] = buffer;
}

void DiskStates::page_out(BlockStore& b, bool write_back) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = paged_.find(b.nvme_file);
  TANDEM_ASSERT(it != paged_.end(), "block ", b.name, " was not paged in");
  if (write_back) tier_.wait(tier_.write(b.nvme_file, 0, it->second.data_ptr(), file_bytes(b)));
  paged_.erase(it);
  unbind(b);
}

ResidentStates::ResidentStates(DiskStates* disk, BlockStore& b) : b_(b) {
  if (disk == nullptr || b.nvme_file < 0 || b.side != UpdateSide::kCpu || b.m.defined()) return;
  disk->page_in(b);
  disk_ = disk;
}

void ResidentStates::commit() {
  if (disk_ == nullptr) return;
  DiskStates* disk = disk_;
  disk_ = nullptr;
  disk->page_out(b_, /*write_back=*/true);
}

ResidentStates::~ResidentStates() {
  if (disk_ == nullptr) return;
  try {
    disk_->page_out(b_, /*write_back=*/false);
  } catch (...) {  // frees memory only; nothing to report from a destructor
  }
}

}  // namespace tandem
