#include "tandem/memory/nvme_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>

#include "tandem/core/error.h"
#include "tandem/core/fs.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"

#ifdef TANDEM_WITH_LIBURING
#include <liburing.h>
#endif

namespace tandem {

namespace {

constexpr unsigned kQueueDepth = 64;

std::string errno_text(int err) { return std::strerror(err); }

}  // namespace

#ifdef TANDEM_WITH_LIBURING
struct NvmeTier::Ring {
  io_uring ring{};
  unsigned in_flight = 0;
  std::map<int64_t, int64_t> pending;      // ticket -> requests not yet complete
  std::map<int64_t, std::string> failed;   // ticket -> the first error of its requests
  std::map<int64_t, int> file_of;          // ticket -> its file (for the error's words)
  ~Ring() { io_uring_queue_exit(&ring); }

  // Reaps one completion (waiting for it): counts it against its ticket.
  void reap_one() {
    io_uring_cqe* cqe = nullptr;
    int rc = 0;
    do rc = io_uring_wait_cqe(&ring, &cqe);
    while (rc == -EINTR);
    TANDEM_CHECK(rc == 0, "offload.nvme_path: waiting for the NVMe tier's I/O failed: ", errno_text(-rc));
    const auto data = io_uring_cqe_get_data64(cqe);
    const int64_t ticket = static_cast<int64_t>(data >> 24);
    const int64_t expected = static_cast<int64_t>(data & 0xffffff) * NvmeTier::kAlign;
    const int res = cqe->res;
    io_uring_cqe_seen(&ring, cqe);
    --in_flight;
    if (res < 0 && !failed.count(ticket))
      failed[ticket] = errno_text(-res);
    else if (res >= 0 && res != expected && !failed.count(ticket))
      failed[ticket] = strprintf("a short transfer (%d of %lld bytes)", res, static_cast<long long>(expected));
    --pending[ticket];
  }
};
#else
struct NvmeTier::Ring {
  std::map<int64_t, int64_t> pending;
  std::map<int64_t, std::string> failed;
  std::map<int64_t, int> file_of;
};
#endif

NvmeTier::NvmeTier(const std::string& dir, bool async) : dir_(dir) {
  ensure_writable_directory(dir, "offload.nvme_path");
  if (!async) return;
#ifdef TANDEM_WITH_LIBURING
  auto ring = std::make_unique<Ring>();
  const int rc = io_uring_queue_init(kQueueDepth, &ring->ring, 0);
  if (rc == 0)
    ring_ = std::move(ring);
  else
    log::warn(strprintf("offload.nvme_path: io_uring is refused here (%s); the NVMe tier reads and writes with "
                        "pread/pwrite on the updater's thread, without overlap",
                        errno_text(-rc).c_str()));
#else
  log::warn("offload.nvme_path: this build has no liburing (install liburing-dev and rebuild); the NVMe tier reads "
            "and writes with pread/pwrite on the updater's thread, without overlap");
#endif
}

NvmeTier::~NvmeTier() {
  for (const int fd : fds_) ::close(fd);
}

bool NvmeTier::async() const { return ring_ != nullptr; }

int NvmeTier::add_file(const std::string& name, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string path = dir_ + "/tandem-" + std::to_string(::getpid()) + "-" + name + ".states";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | (direct_ ? O_DIRECT : 0), 0600);
  if (fd < 0 && direct_ && errno == EINVAL) {  // tmpfs and some others refuse O_DIRECT
    log::warn(strprintf("offload.nvme_path: '%s' refuses O_DIRECT; the NVMe tier goes through the page cache",
                        dir_.c_str()));
    direct_ = false;
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  }
  TANDEM_CHECK(fd >= 0, "offload.nvme_path: cannot create '", path, "': ", errno_text(errno),
               "; choose a writable location");
  ::unlink(path.c_str());  // scratch: gone with the process (Note [NVMe tier])
  // Allocated now, so a full disk is found here and not mid-run.
  const int rc = ::posix_fallocate(fd, 0, aligned(bytes));
  if (rc != 0) {
    ::close(fd);
    TANDEM_FAIL("offload.nvme_path: cannot reserve ", aligned(bytes), " bytes in '", dir_, "': ", errno_text(rc),
                "; free space there, choose another offload.nvme_path, or lower offload.nvme_blocks");
  }
  fds_.push_back(fd);
  names_.push_back(name);
  return static_cast<int>(fds_.size()) - 1;
}

int64_t NvmeTier::read(int file, int64_t offset, void* dst, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t ticket = next_ticket_++;
  transfer(false, file, offset, dst, bytes, ticket);
  counters_.read_bytes += aligned(bytes);
  return ticket;
}

int64_t NvmeTier::write(int file, int64_t offset, const void* src, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t ticket = next_ticket_++;
  transfer(true, file, offset, const_cast<void*>(src), bytes, ticket);
  counters_.written_bytes += aligned(bytes);
  return ticket;
}

void NvmeTier::transfer(bool write, int file, int64_t offset, void* buf, int64_t bytes, int64_t ticket) {
  TANDEM_ASSERT(file >= 0 && file < static_cast<int>(fds_.size()), "NVMe tier file ", file);
  TANDEM_ASSERT(offset % kAlign == 0 && reinterpret_cast<uintptr_t>(buf) % kAlign == 0,
                "NVMe tier transfers are aligned to ", kAlign);
  bytes = aligned(bytes);
  if (!ring_) return complete_sync(write, file, offset, buf, bytes);
#ifdef TANDEM_WITH_LIBURING
  Ring& r = *ring_;
  r.file_of[ticket] = file;
  for (int64_t at = 0; at < bytes; at += kRequestBytes) {
    const int64_t n = std::min(kRequestBytes, bytes - at);
    if (r.in_flight >= kQueueDepth) {  // never more in flight than the completion queue holds
      io_uring_submit(&r.ring);
      r.reap_one();
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&r.ring);
    if (sqe == nullptr) {
      io_uring_submit(&r.ring);
      sqe = io_uring_get_sqe(&r.ring);
    }
    TANDEM_ASSERT(sqe != nullptr, "io_uring: no submission entry free");
    char* p = static_cast<char*>(buf) + at;
    if (write)
      io_uring_prep_write(sqe, fds_[static_cast<size_t>(file)], p, static_cast<unsigned>(n),
                          static_cast<uint64_t>(offset + at));
    else
      io_uring_prep_read(sqe, fds_[static_cast<size_t>(file)], p, static_cast<unsigned>(n),
                         static_cast<uint64_t>(offset + at));
    io_uring_sqe_set_data64(sqe, (static_cast<uint64_t>(ticket) << 24) | static_cast<uint64_t>(n / kAlign));
    ++r.pending[ticket];
    ++r.in_flight;
  }
  io_uring_submit(&r.ring);
#endif
}

void NvmeTier::complete_sync(bool write, int file, int64_t offset, void* buf, int64_t bytes) {
  const int fd = fds_[static_cast<size_t>(file)];
  for (int64_t at = 0; at < bytes;) {
    char* p = static_cast<char*>(buf) + at;
    const ssize_t n = write ? ::pwrite(fd, p, static_cast<size_t>(bytes - at), offset + at)
                            : ::pread(fd, p, static_cast<size_t>(bytes - at), offset + at);
    if (n < 0 && errno == EINTR) continue;
    TANDEM_CHECK(n > 0, "offload.nvme_path: ", write ? "writing" : "reading", " the states of ",
                 names_[static_cast<size_t>(file)], " in '", dir_, "' failed: ",
                 n < 0 ? errno_text(errno) : std::string("end of file"), "; check the disk, or unset offload.nvme_path");
    at += n;
  }
}

void NvmeTier::wait(int64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ring_) return;
  const auto t0 = std::chrono::steady_clock::now();
#ifdef TANDEM_WITH_LIBURING
  Ring& r = *ring_;
  auto it = r.pending.find(ticket);
  if (it == r.pending.end()) return;
  while (r.pending[ticket] > 0) r.reap_one();
  r.pending.erase(ticket);
  const int file = r.file_of[ticket];
  r.file_of.erase(ticket);
  const auto failed = r.failed.find(ticket);
  if (failed != r.failed.end()) {
    const std::string why = failed->second;
    r.failed.erase(failed);
    TANDEM_FAIL("offload.nvme_path: I/O on the states of ", names_[static_cast<size_t>(file)], " in '", dir_,
                "' failed: ", why, "; check the disk, or unset offload.nvme_path");
  }
#endif
  counters_.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

NvmeCounters NvmeTier::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

}  // namespace tandem
