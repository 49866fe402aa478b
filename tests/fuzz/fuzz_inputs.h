#pragma once
// One fuzz input through one parser, shared by the libFuzzer targets (tests/fuzz/*_fuzz.cpp) and
// the regression test that replays tests/data/fuzz/<parser>/ in the normal suite. A parser may
// accept an input or refuse it with a UserError; anything else (another exception, a crash, a
// sanitizer report) is a defect.

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "tandem/core/error.h"

namespace tandem::fuzz {

/// The bytes as a file: a memfd, named by its /proc path; closed at scope exit.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) : fd_(memfd_create("tandem-fuzz", 0)) {
    size_t off = 0;
    while (fd_ >= 0 && off < size) {
      const ssize_t n = ::write(fd_, data + off, size - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
  }
  ~MemFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

/// Runs `parse`; true when it accepted the input, false when it refused it with a UserError.
template <class F>
bool accepts(F&& parse) {
  try {
    parse();
    return true;
  } catch (const UserError&) {
    return false;
  }
}

}  // namespace tandem::fuzz
