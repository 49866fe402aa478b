#pragma once
// The offload engine's third tier: files under offload.nvme_path holding the optimizer states of
// the Blocks the host cannot (Note [NVMe tier]), read and written asynchronously. Torch-free.
//
// Note [NVMe tier]
// With offload.nvme_path set, the Adam moments (and their scales, Note [8-bit states]) of the last
// offload.nvme_blocks CPU-updated Blocks live in one file each, not in host memory; their masters
// stay on the host. The updater reads a Block's states into a pinned bounce slot, runs the same
// kernel on it, and writes them back (engine/disk_states.h); it reads the next such Block while
// this one updates, so the disk's time hides under the updates of the others. The I/O goes through
// io_uring (liburing) with O_DIRECT, in requests of kRequestBytes, many in flight; where the kernel
// refuses io_uring (a container's seccomp profile) or the file system refuses O_DIRECT (tmpfs), it
// falls back to pread/pwrite, or to buffered I/O, and says so once. Each file is unlinked as soon as
// it is open: the states are scratch that lives as long as the run, and a killed run leaves nothing
// behind. Checkpoints hold the states as before (the tier is not in the format), so a run resumes
// with the tier on, off, or holding other Blocks.

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tandem {

/// What the tier has done so far.
struct NvmeCounters {
  int64_t read_bytes = 0, written_bytes = 0;
  double wait_s = 0.0;  ///< time spent waiting for I/O to complete
};

class NvmeTier {
 public:
  /// Alignment of every buffer, offset and length given to read() and write() (O_DIRECT's).
  static constexpr int64_t kAlign = 4096;
  /// One request's bytes; a transfer is cut into requests of this size, all in flight at once.
  static constexpr int64_t kRequestBytes = int64_t{4} << 20;

  /// Opens the tier in directory `dir` (created if missing). UserError when it cannot be created or
  /// written, naming offload.nvme_path. `async` false: pread/pwrite even where io_uring works.
  explicit NvmeTier(const std::string& dir, bool async = true);
  ~NvmeTier();
  NvmeTier(const NvmeTier&) = delete;
  NvmeTier& operator=(const NvmeTier&) = delete;

  /// A new zero-filled file of `bytes` (rounded up to kAlign) named after `name`; returns its index.
  int add_file(const std::string& name, int64_t bytes);
  /// Starts reading `bytes` at `offset` of file `file` into `dst` (all kAlign-aligned; bytes is
  /// rounded up). Returns a ticket for wait().
  int64_t read(int file, int64_t offset, void* dst, int64_t bytes);
  /// Starts writing `bytes` from `src` at `offset` of file `file`; the buffer must stay untouched
  /// until wait() returns.
  int64_t write(int file, int64_t offset, const void* src, int64_t bytes);
  /// Until the transfer of `ticket` is complete; UserError naming the file on an I/O error or a
  /// short transfer. Tickets already waited for return at once.
  void wait(int64_t ticket);

  /// True when the reads and writes go through io_uring; false: pread/pwrite.
  bool async() const;
  /// True when the files are opened with O_DIRECT.
  bool direct() const { return direct_; }
  const std::string& dir() const { return dir_; }
  NvmeCounters counters() const;

  /// `bytes` rounded up to kAlign.
  static int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

 private:
  struct Ring;  // io_uring and its requests in flight
  void transfer(bool write, int file, int64_t offset, void* buf, int64_t bytes, int64_t ticket);
  void complete_sync(bool write, int file, int64_t offset, void* buf, int64_t bytes);
  std::string dir_;
  bool direct_ = true;
  std::vector<int> fds_;
  std::vector<std::string> names_;
  std::unique_ptr<Ring> ring_;  // null: pread/pwrite
  mutable std::mutex mu_;
  int64_t next_ticket_ = 1;
  NvmeCounters counters_;
};

}  // namespace tandem
