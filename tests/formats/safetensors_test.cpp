#include "tandem/formats/safetensors.h"

#include <gtest/gtest.h>

#include <fstream>

#include "../test_util.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

std::string error_of(const std::string& path) {
  return test::error_of([&] { SafetensorsFile f(path); });
}

TEST(Safetensors, RoundTripEveryDtypeAndMetadata) {
  test::TempDir dir;
  std::vector<std::pair<std::string, torch::Tensor>> ts = {
      {"f32", torch::randn({3, 5})},
      {"bf16", torch::randn({4}).to(torch::kBFloat16)},
      {"f16", torch::randn({2, 2}).to(torch::kFloat16)},
      {"f64", torch::randn({1}, torch::kFloat64)},
      {"i64", torch::arange(7, torch::kInt64)},
      {"u8", torch::randint(0, 255, {9}, torch::kUInt8)},
      {"scalar", torch::tensor(3.5f).reshape({})},
      {"empty", torch::empty({0, 4})},
      {"strided", torch::randn({6, 6}).t()},  // non-contiguous input
  };
  write_safetensors(dir.file("a.safetensors"), ts, {{"format", "pt"}, {"note", "x"}});
  SafetensorsFile f(dir.file("a.safetensors"));
  EXPECT_EQ(f.metadata().at("note"), "x");
  for (const auto& [name, t] : ts) {
    auto back = f.tensor(name);
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(back, t.contiguous())) << name;
  }
  EXPECT_EQ(f.entry("bf16").dtype, "BF16");
}

// A file assembled byte by byte from the format's specification: 8-byte little-endian header
// size, JSON header, then raw little-endian data at the stated offsets.
TEST(Safetensors, ReadsAFileBuiltFromTheSpecification) {
  test::TempDir dir;
  const std::string header =
      R"({"__metadata__":{"writer":"by hand"},"b":{"dtype":"I32","shape":[2],"data_offsets":[12,20]},)"
      R"("a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})";
  std::string data;
  const float a[3] = {1.5f, -2.0f, 1e-3f};
  const int32_t b[2] = {-7, 123456};
  data.append(reinterpret_cast<const char*>(a), 12);
  data.append(reinterpret_cast<const char*>(b), 8);
  write_raw(dir.file("hand.safetensors"), le64(header.size()) + header + data);
  SafetensorsFile f(dir.file("hand.safetensors"));
  EXPECT_EQ(f.metadata().at("writer"), "by hand");
  auto ta = f.tensor("a");
  ASSERT_EQ(ta.sizes(), (std::vector<int64_t>{3}));
  EXPECT_FLOAT_EQ(ta[0].item<float>(), 1.5f);
  EXPECT_FLOAT_EQ(ta[2].item<float>(), 1e-3f);
  auto tb = f.tensor("b");
  EXPECT_EQ(tb.scalar_type(), torch::kInt32);
  EXPECT_EQ(tb[1].item<int32_t>(), 123456);

  // And the writer produces exactly this layout: header length, JSON, 8-byte aligned data.
  write_safetensors(dir.file("w.safetensors"), {{"a", torch::tensor({1.5f, -2.0f, 1e-3f})}});
  std::ifstream in(dir.file("w.safetensors"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 12);
  EXPECT_EQ(bytes.substr(8 + n), data.substr(0, 12));
}

TEST(Safetensors, CorruptHeadersAreRefusedWithTheCause) {
  test::TempDir dir;
  const auto file = [&](const std::string& name, const std::string& header, size_t data_bytes) {
    write_raw(dir.file(name), le64(header.size()) + header + std::string(data_bytes, '\0'));
    return dir.file(name);
  };
  write_raw(dir.file("short"), "abc");
  EXPECT_NE(error_of(dir.file("short")).find("truncated"), std::string::npos);
  write_raw(dir.file("biglen"), le64(1000) + "{}");
  EXPECT_NE(error_of(dir.file("biglen")).find("header length 1000 exceeds"), std::string::npos);
  EXPECT_NE(error_of(file("json", "{not json", 0)).find("not valid JSON"), std::string::npos);
  EXPECT_NE(
      error_of(file("outside", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8)).find("truncated"),
      std::string::npos);
  EXPECT_NE(
      error_of(
          file(
              "overlap",
              R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
              12))
          .find("overlap"),
      std::string::npos);
  EXPECT_NE(error_of(file("dtype", R"({"a":{"dtype":"F12","shape":[1],"data_offsets":[0,4]}})", 4))
                .find("unknown dtype 'F12'"),
            std::string::npos);
  EXPECT_NE(error_of(file("size", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)).find("need 12"),
            std::string::npos);
  EXPECT_NE(error_of(file("neg", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4)).find("negative"),
            std::string::npos);
  EXPECT_NE(error_of(file("order", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8)).find("after end"),
            std::string::npos);
  EXPECT_NE(error_of(file("fields", R"({"a":{"dtype":"F32"}})", 0)).find("needs dtype, shape and data_offsets"),
            std::string::npos);
  EXPECT_NE(error_of(dir.file("nope")).find("cannot open"), std::string::npos);
}

}  // namespace
}  // namespace tandem
