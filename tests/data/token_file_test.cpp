#include "tandem/data/token_file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "../test_util.h"
#include "tandem/core/error.h"
#include "tandem/data/dataset.h"
#include "tandem/data/synthetic.h"

namespace tandem {
namespace {

void write_bytes(const std::string& path, const void* data, size_t n) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
}

std::vector<char> llmc_file(int32_t magic, int32_t version, int32_t count, const std::vector<uint32_t>& tokens,
                            int bpt) {
  std::vector<char> buf(1024, 0);
  int32_t header[256] = {};
  header[0] = magic, header[1] = version, header[2] = count;
  std::memcpy(buf.data(), header, sizeof header);
  for (uint32_t t : tokens) {
    const char* p = reinterpret_cast<const char*>(&t);
    buf.insert(buf.end(), p, p + bpt);  // little-endian
  }
  return buf;
}

using test::error_of;

TEST(TokenFile, NanoGptRawUint16) {
  test::TempDir dir;
  std::vector<uint16_t> toks{1, 2, 65535, 40000, 7};
  write_bytes(dir.file("a.bin"), toks.data(), toks.size() * 2);
  auto b = TokenBuffer::open(dir.file("a.bin"));
  ASSERT_EQ(b.size(), 5);
  EXPECT_EQ(b.at(2), 65535);
  std::vector<int64_t> out(3);
  b.read(1, 3, out.data());
  EXPECT_EQ(out, (std::vector<int64_t>{2, 65535, 40000}));
  EXPECT_EQ(b.slice(3, 5).at(0), 40000);
  EXPECT_EQ(b.max_token(), 65535);
}

TEST(TokenFile, LlmcUint16AndUint32) {
  test::TempDir dir;
  auto f16 = llmc_file(kLlmcMagicU16, kLlmcVersionU16, 4, {10, 20, 30, 50256}, 2);
  write_bytes(dir.file("gpt2.bin"), f16.data(), f16.size());
  auto a = TokenBuffer::open(dir.file("gpt2.bin"));
  ASSERT_EQ(a.size(), 4);
  EXPECT_EQ(a.at(3), 50256);
  EXPECT_EQ(a.bytes_per_token(), 2);
  auto f32 = llmc_file(kLlmcMagicU32, kLlmcVersionU32, 3, {128000, 5, 70000}, 4);
  write_bytes(dir.file("llama3.bin"), f32.data(), f32.size());
  auto b = TokenBuffer::open(dir.file("llama3.bin"), TokenFormat::kLlmc);
  ASSERT_EQ(b.size(), 3);
  EXPECT_EQ(b.at(0), 128000);
  EXPECT_EQ(b.at(2), 70000);
}

TEST(TokenFile, TruncatedFilesAreRefusedWithTheNumbers) {
  test::TempDir dir;
  auto f = llmc_file(kLlmcMagicU16, kLlmcVersionU16, 100, {1, 2, 3}, 2);  // header says 100 tokens, 3 present
  write_bytes(dir.file("t.bin"), f.data(), f.size());
  const std::string msg = error_of([&] { TokenBuffer::open(dir.file("t.bin")); });
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("100 tokens"), std::string::npos) << msg;
  write_bytes(dir.file("short.bin"), f.data(), 500);  // shorter than the header
  EXPECT_NE(error_of([&] { TokenBuffer::open(dir.file("short.bin"), TokenFormat::kLlmc); }).find("truncated"),
            std::string::npos);
  const char odd[3] = {1, 2, 3};
  write_bytes(dir.file("odd.bin"), odd, 3);
  EXPECT_NE(error_of([&] { TokenBuffer::open(dir.file("odd.bin")); }).find("truncated"), std::string::npos);
  EXPECT_NE(error_of([&] { TokenBuffer::open(dir.file("missing.bin")); }).find("cannot open"), std::string::npos);
}

TEST(TokenFile, WrongMagicAndVersion) {
  test::TempDir dir;
  auto f = llmc_file(12345678, 1, 3, {1, 2, 3}, 2);
  write_bytes(dir.file("m.bin"), f.data(), f.size());
  const std::string msg = error_of([&] { TokenBuffer::open(dir.file("m.bin"), TokenFormat::kLlmc); });
  EXPECT_NE(msg.find("magic 12345678"), std::string::npos) << msg;
  auto g = llmc_file(20240999, 1, 3, {1, 2, 3}, 2);  // looks like llm.c, unknown magic
  write_bytes(dir.file("g.bin"), g.data(), g.size());
  EXPECT_NE(error_of([&] { TokenBuffer::open(dir.file("g.bin")); }).find("not an llm.c magic"), std::string::npos);
  auto v = llmc_file(kLlmcMagicU16, 7, 3, {1, 2, 3}, 2);
  write_bytes(dir.file("v.bin"), v.data(), v.size());
  EXPECT_NE(error_of([&] { TokenBuffer::open(dir.file("v.bin")); }).find("version 7"), std::string::npos);
}

TEST(TokenFile, TextIsByteLevel) {
  test::TempDir dir;
  write_bytes(dir.file("t.txt"), "héllo", 6);
  auto b = TokenBuffer::open(dir.file("t.txt"));
  ASSERT_EQ(b.size(), 6);
  EXPECT_EQ(b.at(0), 'h');
  EXPECT_EQ(b.at(1), 0xC3);
  std::vector<int64_t> all(6);
  b.read(0, 6, all.data());
  EXPECT_EQ(byte_detokenize(all), "héllo");
}

TEST(Synthetic, CorpusIsDeterministicAndStructured) {
  const auto a = generate_corpus_text(5000, 3), b = generate_corpus_text(5000, 3);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 5000u);
  EXPECT_NE(a.find(" = "), std::string::npos);
  EXPECT_NE(a.find("count:"), std::string::npos);
  DataConfig dc;
  dc.synthetic_bytes = 10000;
  auto splits = open_data(dc);
  EXPECT_EQ(splits.train.size() + splits.val.size(), 10000);
  EXPECT_EQ(splits.val.size(), 500);
}

}  // namespace
}  // namespace tandem
