#include "tandem/core/fs.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tandem/core/error.h"

namespace fs = std::filesystem;

namespace tandem {

DurableFile::DurableFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err = errno;
  TANDEM_CHECK(fd_ >= 0 || err != ENOENT, "cannot create '", path_, "': its folder '",
               fs::path(path_).parent_path().string(), "' does not exist; create it or choose another path");
  TANDEM_CHECK(fd_ >= 0, "cannot create '", path_, "': ", std::strerror(err), "; check permissions and free space");
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(path_.c_str());  // never committed: leave nothing half-written behind
  }
}

void DurableFile::append(const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, std::min<size_t>(size, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    TANDEM_CHECK(n > 0, "cannot write '", path_, "': ", std::strerror(errno), "; check free space");
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void DurableFile::commit() {
  const bool ok = ::fsync(fd_) == 0;
  const int err = errno;
  ::close(fd_);
  fd_ = -1;
  if (!ok) {
    ::unlink(path_.c_str());
    TANDEM_FAIL("cannot flush '", path_, "' to disk: ", std::strerror(err));
  }
}

void write_file_synced(const std::string& path, const void* data, size_t size) {
  DurableFile f(path);
  f.append(data, size);
  f.commit();
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
  // The temporary beside the file is an implementation detail: a missing folder is named for the file.
  std::error_code ec;
  const fs::path folder = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  TANDEM_CHECK(fs::is_directory(folder, ec), "cannot write '", path, "': its folder '", folder.string(),
               "' does not exist; create it or choose another path");
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
  std::error_code ec;
  TANDEM_CHECK(!fs::is_directory(path, ec), what, " '", path, "' is a folder; give the file in it");
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
