// SHA-256 of files for checkpoint manifests (formats/digest.h): the published test vectors, a file
// longer than one read buffer, and files that cannot be read.

#include "tandem/formats/digest.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "../error_of.h"
#include "../test_util.h"

namespace tandem {
namespace {

void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

TEST(Digest, Sha256OfTheStandardVectorsInLowerCaseHex) {
  test::TempDir dir;
  write_bytes(dir.file("empty"), "");
  write_bytes(dir.file("abc"), "abc");
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes.push_back(static_cast<char>(b));
  write_bytes(dir.file("bytes"), all_bytes);
  EXPECT_EQ(sha256_file(dir.file("empty")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_file(dir.file("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // Every byte value, NUL included: the file is read as binary, not as text.
  EXPECT_EQ(sha256_file(dir.file("bytes")), "40aff2e9d2d8922e47afd4648e6967497158785fbd1da870e7110266bf944880");
}

// The file is read in 8 MiB pieces: 3 bytes past the first piece must still count, in order.
TEST(Digest, AFileLongerThanOneReadIsHashedWhole) {
  test::TempDir dir;
  std::string data((size_t{8} << 20) + 3, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 131 + 7) % 251);
  write_bytes(dir.file("big"), data);
  EXPECT_EQ(sha256_file(dir.file("big")), "f6e5beee8619866287cb195dd27f15055ac34f455af614db36284d0c5d700d28");
  // One byte changed in the tail changes the digest.
  data.back() = static_cast<char>(data.back() ^ 1);
  write_bytes(dir.file("big"), data);
  EXPECT_NE(sha256_file(dir.file("big")), "f6e5beee8619866287cb195dd27f15055ac34f455af614db36284d0c5d700d28");
}

TEST(Digest, AMissingFileOrADirectoryIsAUserErrorNamingThePath) {
  test::TempDir dir;
  const std::string missing = test::error_of([&] { sha256_file(dir.file("gone.safetensors")); });
  EXPECT_NE(missing.find("cannot read '" + dir.file("gone.safetensors") + "' to check its SHA-256"), std::string::npos)
      << missing;
  EXPECT_NE(missing.find("No such file"), std::string::npos) << missing;
  std::filesystem::create_directories(dir.file("sub"));
  const std::string directory = test::error_of([&] { sha256_file(dir.file("sub")); });
  EXPECT_NE(directory.find(dir.file("sub")), std::string::npos) << directory;
}

}  // namespace
}  // namespace tandem
