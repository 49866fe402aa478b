#include "tandem/monitor/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"

namespace tandem {
namespace {

std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli
    t[i] = c;
  }
  return t;
}

// Note [TensorBoard event files]
// A TFRecord file is a sequence of records: the payload's length as a little-endian uint64, the
// masked CRC-32C of those 8 bytes, the payload, the masked CRC-32C of the payload. Each payload is
// an Event message: wall_time (field 1, double), step (field 2, varint) and either file_version
// (field 3, string; the first record says "brain.Event:2") or summary (field 5), a Summary of
// Values, each a tag (field 1, string) and simple_value (field 2, float). The protocol buffer wire
// format is simple enough for these five fields to be written directly.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
void put_tag(std::string& out, int field, int wire) { put_varint(out, (uint64_t(field) << 3) | uint64_t(wire)); }
void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}
template <class T>
void put_fixed(std::string& out, int field, T v) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  put_tag(out, field, sizeof(T) == 8 ? 1 : 5);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, AArch64)
  out.append(b, sizeof(T));
}

std::string event_header(double wall_time, int64_t step) {
  std::string e;
  put_fixed(e, 1, wall_time);
  put_tag(e, 2, 0);
  put_varint(e, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  static const auto table = make_crc_table();
  uint32_t c = 0xFFFFFFFFu;
  for (const unsigned char b : data) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  path_ = (std::filesystem::path(dir) / strprintf("events.out.tfevents.%lld.%s.%d.tandem", static_cast<long long>(now),
                                                  host, static_cast<int>(getpid())))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  TANDEM_CHECK(file_ != nullptr, "cannot write the TensorBoard event file '", path_, "' (", std::strerror(errno),
               "); check the run directory or set monitor.tensorboard=false");
  std::string e = event_header(now, 0);
  put_bytes(e, 3, "brain.Event:2");
  record(e);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values,
                                double wall_time_s) {
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;
    put_bytes(value, 1, tag);
    put_fixed(value, 2, static_cast<float>(v));
    put_bytes(summary, 1, value);
  }
  std::string e = event_header(wall_time_s, step);
  put_bytes(e, 5, summary);
  record(e);
}

void TensorBoardWriter::record(const std::string& event) {
  char len[8];
  const uint64_t n = event.size();
  std::memcpy(len, &n, 8);
  const uint32_t len_crc = masked_crc32c(std::string_view(len, 8)), data_crc = masked_crc32c(event);
  // A failed write (full disk) costs TensorBoard its view, never the run: errors are not fatal.
  std::fwrite(len, 1, 8, file_);
  std::fwrite(&len_crc, 1, 4, file_);
  std::fwrite(event.data(), 1, event.size(), file_);
  std::fwrite(&data_crc, 1, 4, file_);
  std::fflush(file_);
}

}  // namespace tandem
