#pragma once
// The states of the Blocks on the NVMe tier (Note [NVMe tier]): each such Block's m and v (and the
// scales of 8-bit states) in one file, laid out as in host memory with every buffer starting on a
// 4 KiB boundary. Between updates the Block holds no states (b.m undefined): the updater binds them
// to a pinned bounce slot for its update, and everything else that reads or writes them holds a
// ResidentStates for the time it does.

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tandem/memory/nvme_tier.h"

namespace tandem {

struct BlockStore;

class DiskStates {
 public:
  /// The tier in `dir`, for host states of `dtype`; `alloc(bytes)` gives the bounce slots (a 1-D
  /// uint8 host tensor, pinned where the device copies from it).
  DiskStates(const std::string& dir, torch::ScalarType dtype, std::function<torch::Tensor(int64_t)> alloc);
  /// Until every write is done.
  ~DiskStates();

  /// Gives CPU-updated Block b a file of zero states (its first time) and frees the states it
  /// holds in memory, written to the file first (a Block moved back from the GPU).
  void evict(BlockStore& b);

  /// The updater thread's side. prefetch: starts reading b's states into a free bounce slot (a
  /// no-op when they are already on their way). bind: until they are read (reading them now when
  /// not prefetched), then b's states are views of the slot. release: starts writing them back and
  /// unbinds them; the slot is reused once the write is done.
  void prefetch(BlockStore& b);
  void bind(BlockStore& b);
  void release(BlockStore& b);
  /// Until every write is done (before anything else reads the files).
  void drain();

  /// Between steps: reads b's states into plain host memory (b's states are views of it), and writes
  /// them back (when `write_back`) and frees them.
  void page_in(BlockStore& b);
  void page_out(BlockStore& b, bool write_back);

  /// Bytes of b's file (its states, each buffer aligned); b must have been evicted once.
  int64_t file_bytes(const BlockStore& b) const;
  const NvmeTier& tier() const { return tier_; }
  torch::ScalarType dtype() const { return dtype_; }

 private:
  struct Slot {
    torch::Tensor buffer;  // uint8, the largest file's bytes
    int owner = -1;  // the file of the Block whose states it holds (BlockStore::nvme_file), -1: none
    int64_t read_ticket = 0, write_ticket = 0;
    bool bound = false;
    int64_t released_at = 0;  // release order: the least recently released free slot goes first
  };
  Slot& take_slot(const BlockStore& b);
  Slot* slot_of(const BlockStore& b);
  void forget(const BlockStore& b);  // no slot holds b's states (its write done)
  /// Binds b's states as views of `buffer` laid out as in the file; returns the bytes used.
  int64_t carve(BlockStore& b, const torch::Tensor& buffer) const;
  static void unbind(BlockStore& b);

  NvmeTier tier_;
  torch::ScalarType dtype_;
  std::function<torch::Tensor(int64_t)> alloc_;
  std::vector<Slot> slots_;
  int64_t slot_bytes_ = 0;
  int64_t releases_ = 0;
  std::map<int, torch::Tensor> paged_;  // page_in's buffers, by file
  std::vector<int64_t> file_bytes_;     // by file
  std::mutex mu_;
};

/// Holds b's states in memory for the scope where it lives, where b is a CPU-updated Block on the
/// NVMe tier between updates (page_in; page_out at the end, without writing); otherwise nothing.
/// commit() writes them back and frees them (a UserError when the write fails).
class ResidentStates {
 public:
  ResidentStates(DiskStates* disk, BlockStore& b);
  ~ResidentStates();
  void commit();
  ResidentStates(const ResidentStates&) = delete;
  ResidentStates& operator=(const ResidentStates&) = delete;

 private:
  DiskStates* disk_ = nullptr;  // null: nothing to do
  BlockStore& b_;
};

}  // namespace tandem
