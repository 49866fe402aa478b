#include "tandem/io/fs.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tandem/core/error.h"

namespace fs = std::filesystem;

namespace tandem {

void write_file_synced(const std::string& path, const void* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TANDEM_CHECK(fd >= 0, "cannot create '", path, "': ", std::strerror(errno), "; check permissions and free space");
  const char* p = static_cast<const char*>(data);
  size_t left = size;
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(path.c_str());
      TANDEM_FAIL("cannot write '", path, "': ", std::strerror(err), "; check free space");
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    TANDEM_FAIL("cannot flush '", path, "' to disk: ", std::strerror(err));
  }
}

void write_file_synced(const std::string& path, const std::string& bytes) {
  write_file_synced(path, bytes.data(), bytes.size());
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const fs::path p(path);
  const std::string tmp = (p.parent_path() / ("." + p.filename().string() + ".tmp")).string();
  write_file_synced(tmp, bytes);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    TANDEM_FAIL("cannot rename '", tmp, "' to '", path, "': ", std::strerror(err));
  }
  fsync_directory(p.parent_path().empty() ? "." : p.parent_path().string());
}

std::string read_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  TANDEM_CHECK(in.good(), "cannot read ", what, " '", path, "'; check the path");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void ensure_writable_directory(const std::string& dir, const std::string& what) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TANDEM_CHECK(!ec, "cannot create ", what, " '", dir, "': ", ec.message(), "; choose a writable location");
  TANDEM_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, what, " '", dir,
               "' is not writable; choose a writable location or fix its permissions");
}

}  // namespace tandem
