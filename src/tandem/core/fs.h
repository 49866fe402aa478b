#pragma once
// Durable file writes: write to a temporary name, fsync, rename, fsync the directory, so a crash
// leaves either the old file or the complete new one, never a half-written file that looks valid.

#include <string>

namespace tandem {

/// A file written sequentially and committed with fsync; removed if not committed.
class DurableFile {
 public:
  explicit DurableFile(std::string path);
  ~DurableFile();
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;
  void append(const void* data, size_t size);
  /// fsyncs and closes; UserError (and the file removed) when the data cannot reach the disk.
  void commit();

 private:
  std::string path_;
  int fd_ = -1;
};

/// Writes `bytes` to `path` durably (temporary sibling, fsync, rename, fsync of the directory).
void write_file_atomic(const std::string& path, const std::string& bytes);

/// Writes `bytes` to `path` and fsyncs it (for files inside a directory that is renamed as a whole).
void write_file_synced(const std::string& path, const void* data, size_t size);
void write_file_synced(const std::string& path, const std::string& bytes);

/// fsyncs a directory so renames and creations inside it are durable.
void fsync_directory(const std::string& dir);

/// Reads a whole file; UserError when missing or unreadable.
std::string read_file(const std::string& path, const std::string& what);

/// Creates a directory and its parents; UserError (with the fix) when it cannot be created or written.
void ensure_writable_directory(const std::string& dir, const std::string& what);

}  // namespace tandem
