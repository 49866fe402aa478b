// core/fs.h: durable writes (the whole new content or the old file, never a temporary left behind),
// binary-exact reads, and the errors for paths that cannot be written or read.

#include "tandem/core/fs.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "../test_util.h"

namespace tandem {
namespace {

using test::error_of;
namespace fs = std::filesystem;

// The names in `dir`, sorted.
std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Every byte value, NUL and 0xFF included.
std::string all_bytes() {
  std::string s;
  for (int i = 0; i < 256; ++i) s.push_back(static_cast<char>(i));
  return s + s;
}

TEST(Fs, ReadFileReturnsTheBytesWrittenExactly) {
  test::TempDir dir;
  const std::string bytes = all_bytes();
  write_file_synced(dir.file("blob"), bytes);
  const std::string back = read_file(dir.file("blob"), "blob");
  ASSERT_EQ(back.size(), 512u);
  EXPECT_EQ(back, bytes);
  write_file_synced(dir.file("empty"), "");
  EXPECT_EQ(read_file(dir.file("empty"), "empty file"), "");
}

TEST(Fs, WriteFileSyncedReplacesALongerFile) {
  test::TempDir dir;
  write_file_synced(dir.file("f"), std::string(1000, 'x'));
  const char data[] = {'a', '\0', 'b'};
  write_file_synced(dir.file("f"), data, sizeof data);
  EXPECT_EQ(read_file(dir.file("f"), "f"), std::string("a\0b", 3)) << "truncated to the new content";
}

TEST(Fs, WriteFileAtomicReplacesTheFileAndLeavesNoTemporary) {
  test::TempDir dir;
  write_file_atomic(dir.file("state.json"), "old content, longer than the new");
  write_file_atomic(dir.file("state.json"), "new");
  EXPECT_EQ(read_file(dir.file("state.json"), "state"), "new");
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{"state.json"}));
}

TEST(Fs, ADurableFileIsRemovedUnlessCommitted) {
  test::TempDir dir;
  {
    DurableFile f(dir.file("kept"));
    f.append("ab", 2);
    f.append("", 0);
    const std::string big(3 << 20, 'z');  // larger than any single write the kernel takes at once
    f.append(big.data(), big.size());
    f.append("cd", 2);
    f.commit();
  }
  const std::string kept = read_file(dir.file("kept"), "kept");
  ASSERT_EQ(kept.size(), (3u << 20) + 4u);
  EXPECT_EQ(kept.substr(0, 3), "abz");
  EXPECT_EQ(kept.substr(kept.size() - 3), "zcd");
  {
    DurableFile f(dir.file("dropped"));
    f.append("half", 4);
  }  // never committed: an error path, or an exception thrown before commit
  EXPECT_FALSE(fs::exists(dir.file("dropped")));
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{"kept"}));
}

TEST(Fs, AFileInAMissingFolderIsAUserErrorNamingThePath) {
  test::TempDir dir;
  const std::string path = dir.file("no/such/folder/out.bin");
  const std::string direct = error_of([&] { DurableFile f(path); });
  EXPECT_NE(direct.find("cannot create '" + path + "': its folder '" + dir.file("no/such/folder") +
                        "' does not exist; create it or choose another path"),
            std::string::npos)
      << direct;
  // The atomic write names the file asked for, not its temporary.
  const std::string atomic = error_of([&] { write_file_atomic(path, "x"); });
  EXPECT_NE(atomic.find("cannot write '" + path + "': its folder '" + dir.file("no/such/folder") + "' does not exist"),
            std::string::npos)
      << atomic;
  EXPECT_EQ(atomic.find(".tmp"), std::string::npos) << atomic;
  EXPECT_NE(error_of([&] { write_file_synced(path, "x"); }).find(path), std::string::npos);
}

TEST(Fs, AnAtomicWriteOverAFolderFailsAndRemovesItsTemporary) {
  test::TempDir dir;
  fs::create_directories(dir.file("target"));
  const std::string msg = error_of([&] { write_file_atomic(dir.file("target"), "x"); });
  EXPECT_NE(msg.find("cannot rename '" + dir.file(".target.tmp") + "' to '" + dir.file("target") + "'"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(fs::is_directory(dir.file("target")));
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{"target"}));
}

TEST(Fs, ReadingAMissingFileNamesWhatAndWhere) {
  test::TempDir dir;
  const std::string msg = error_of([&] { read_file(dir.file("gone.yaml"), "run config"); });
  EXPECT_NE(msg.find("cannot read run config '" + dir.file("gone.yaml") + "'; check the path"), std::string::npos)
      << msg;
}

TEST(Fs, ReadingAFolderNamesItAndAsksForTheFileInIt) {
  test::TempDir dir;
  const std::string msg = error_of([&] { read_file(dir.path(), "model config"); });
  EXPECT_NE(msg.find("model config '" + dir.path() + "' is a folder; give the file in it"), std::string::npos) << msg;
}

TEST(Fs, EnsureWritableDirectoryCreatesParentsAndRefusesAFile) {
  test::TempDir dir;
  const std::string nested = dir.file("a/b/c");
  ensure_writable_directory(nested, "run directory");
  EXPECT_TRUE(fs::is_directory(nested));
  ensure_writable_directory(nested, "run directory");  // existing: fine
  write_file_synced(dir.file("plain"), "x");
  const std::string over_file = error_of([&] { ensure_writable_directory(dir.file("plain"), "output folder"); });
  EXPECT_NE(over_file.find("cannot create output folder '" + dir.file("plain") + "'"), std::string::npos) << over_file;
  EXPECT_NE(over_file.find("choose a writable location"), std::string::npos) << over_file;
  const std::string under_file = error_of([&] { ensure_writable_directory(dir.file("plain/sub"), "output folder"); });
  EXPECT_NE(under_file.find("cannot create output folder"), std::string::npos) << under_file;
}

TEST(Fs, EnsureWritableDirectoryRefusesAReadOnlyFolder) {
  if (::geteuid() == 0) GTEST_SKIP() << "root may write into any folder";
  test::TempDir dir;
  const std::string ro = dir.file("ro");
  fs::create_directories(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  const std::string msg = error_of([&] { ensure_writable_directory(ro, "checkpoint folder"); });
  fs::permissions(ro, fs::perms::owner_all);
  EXPECT_NE(msg.find("checkpoint folder '" + ro + "' is not writable"), std::string::npos) << msg;
}

TEST(Fs, FsyncDirectoryOfAMissingFolderIsHarmless) {
  test::TempDir dir;
  EXPECT_NO_THROW(fsync_directory(dir.file("missing")));
  EXPECT_NO_THROW(fsync_directory(dir.path()));
}

}  // namespace
}  // namespace tandem
