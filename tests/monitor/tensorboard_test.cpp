// The TensorBoard writer against a reader written here from the TFRecord and protobuf wire-format
// specifications: record framing, both masked CRC-32Cs (computed bit by bit, not with the writer's
// table), and the Event / Summary / Value fields.

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "tandem/monitor/tensorboard.h"
#include "../test_util.h"

namespace tandem {
namespace {

uint32_t crc32c_bitwise(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (const unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}
uint32_t mask(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xA282EAD8u; }

struct Reader {  // protobuf wire format, the few types an Event uses
  const std::string& b;
  size_t i = 0;
  bool done() const { return i >= b.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      EXPECT_LT(i, b.size());
      const uint8_t x = static_cast<uint8_t>(b[i++]);
      v |= uint64_t(x & 0x7F) << shift;
      if (!(x & 0x80)) return v;
    }
  }
  std::string bytes() {
    const size_t n = varint();
    std::string s = b.substr(i, n);
    i += n;
    return s;
  }
  template <class T>
  T fixed() {
    T v;
    std::memcpy(&v, b.data() + i, sizeof v);
    i += sizeof v;
    return v;
  }
};

struct Event {
  double wall_time = 0;
  int64_t step = -1;
  std::string file_version;
  std::map<std::string, float> values;
};

Event parse_event(const std::string& payload) {
  Event e;
  Reader r{payload};
  while (!r.done()) {
    const uint64_t key = r.varint();
    switch (key) {
      case (1 << 3) | 1: e.wall_time = r.fixed<double>(); break;
      case (2 << 3) | 0: e.step = static_cast<int64_t>(r.varint()); break;
      case (3 << 3) | 2: e.file_version = r.bytes(); break;
      case (5 << 3) | 2: {
        const std::string summary = r.bytes();
        Reader sr{summary};
        while (!sr.done()) {
          EXPECT_EQ(sr.varint(), (1u << 3) | 2) << "Summary.value";
          const std::string value = sr.bytes();
          Reader vr{value};
          std::string tag;
          float v = 0;
          while (!vr.done()) {
            const uint64_t vk = vr.varint();
            if (vk == ((1 << 3) | 2)) tag = vr.bytes();
            else if (vk == ((2 << 3) | 5)) v = vr.fixed<float>();
            else ADD_FAILURE() << "unexpected Value field key " << vk;
          }
          e.values[tag] = v;
        }
        break;
      }
      default: ADD_FAILURE() << "unexpected Event field key " << key; return e;
    }
  }
  return e;
}

std::vector<Event> read_event_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<Event> out;
  size_t i = 0;
  while (i < data.size()) {
    EXPECT_LE(i + 12, data.size()) << "truncated record header at " << i;
    const std::string len_bytes = data.substr(i, 8);
    uint64_t len;
    uint32_t len_crc, data_crc;
    std::memcpy(&len, len_bytes.data(), 8);
    std::memcpy(&len_crc, data.data() + i + 8, 4);
    EXPECT_EQ(len_crc, mask(crc32c_bitwise(len_bytes))) << "length CRC of the record at " << i;
    EXPECT_LE(i + 12 + len + 4, data.size()) << "truncated record at " << i;
    const std::string payload = data.substr(i + 12, len);
    std::memcpy(&data_crc, data.data() + i + 12 + len, 4);
    EXPECT_EQ(data_crc, mask(crc32c_bitwise(payload))) << "data CRC of the record at " << i;
    out.push_back(parse_event(payload));
    i += 12 + len + 4;
  }
  return out;
}

TEST(TensorBoard, Crc32cMatchesTheStandardCheckValue) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);  // the CRC-32C check value (RFC 3720)
  EXPECT_EQ(crc32c(""), 0u);
  const std::string s = "tandem event payload with bytes \x01\xff";
  EXPECT_EQ(crc32c(s), crc32c_bitwise(s));
  EXPECT_EQ(masked_crc32c(s), mask(crc32c_bitwise(s)));
}

TEST(TensorBoard, EventFileReadsBackWithFramingChecksumsAndValues) {
  test::TempDir dir;
  std::string path;
  {
    TensorBoardWriter w(dir.file("tb"));
    path = w.path();
    EXPECT_NE(std::filesystem::path(path).filename().string().find("events.out.tfevents."), std::string::npos);
    w.scalars(1, {{"train/loss", 5.25}, {"gpu/gpu_power_w", 612.5}}, 1700000000.5);
    w.scalars(2, {{"train/loss", 4.75}}, 1700000001.0);
    w.scalars(300000, {{"train/loss", 1.0 / 3.0}}, 1700000002.0);  // multi-byte varint step
  }
  const auto events = read_event_file(path);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_EQ(events[1].step, 1);
  EXPECT_DOUBLE_EQ(events[1].wall_time, 1700000000.5);
  ASSERT_EQ(events[1].values.size(), 2u);
  EXPECT_FLOAT_EQ(events[1].values.at("train/loss"), 5.25f);
  EXPECT_FLOAT_EQ(events[1].values.at("gpu/gpu_power_w"), 612.5f);
  EXPECT_EQ(events[2].step, 2);
  EXPECT_FLOAT_EQ(events[2].values.at("train/loss"), 4.75f);
  EXPECT_EQ(events[3].step, 300000);
  EXPECT_FLOAT_EQ(events[3].values.at("train/loss"), static_cast<float>(1.0 / 3.0));
}

TEST(TensorBoard, UnwritableDirectoryIsAUserError) {
  const std::string err = test::error_of([] { TensorBoardWriter w("/proc/tandem-no-tb-here"); });
  EXPECT_NE(err.find("monitor.tensorboard=false"), std::string::npos) << err;
}

}  // namespace
}  // namespace tandem
