#include "tandem/formats/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "tandem/core/error.h"
#include "tandem/core/fs.h"

namespace tandem {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit

const std::vector<std::pair<std::string, torch::ScalarType>>& dtype_table() {
  static const std::vector<std::pair<std::string, torch::ScalarType>> kTable = {
      {"F64", torch::kFloat64},        {"F32", torch::kFloat32},
      {"F16", torch::kFloat16},        {"BF16", torch::kBFloat16},
      {"I64", torch::kInt64},          {"I32", torch::kInt32},
      {"I16", torch::kInt16},          {"I8", torch::kInt8},
      {"U8", torch::kUInt8},           {"BOOL", torch::kBool},
      {"U16", torch::kUInt16},         {"U32", torch::kUInt32},
      {"U64", torch::kUInt64},         {"F8_E4M3", torch::kFloat8_e4m3fn},
      {"F8_E5M2", torch::kFloat8_e5m2}};
  return kTable;
}

}  // namespace

std::string safetensors_dtype(torch::ScalarType t) {
  for (const auto& [name, st] : dtype_table())
    if (st == t) return name;
  TANDEM_FAIL("dtype ", t, " cannot be stored in safetensors");
}

torch::ScalarType scalar_type_from_safetensors(const std::string& dtype, const std::string& context) {
  for (const auto& [name, st] : dtype_table())
    if (name == dtype) return st;
  TANDEM_FAIL(context, ": unknown dtype '", dtype, "'; the file is corrupt or uses a dtype tandem does not read");
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  using nlohmann::json;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TANDEM_CHECK(fd >= 0, "cannot open safetensors file '", path, "': ", std::strerror(errno), "; check the path");
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    TANDEM_FAIL("'", path, "' is not a regular file");
  }
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < 8) {
    ::close(fd);
    TANDEM_FAIL("safetensors file '", path, "' is truncated (", file_bytes,
                " bytes, shorter than its 8-byte header length)");
  }
  map_ = mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  TANDEM_CHECK(map_ != MAP_FAILED, "cannot map '", path, "': ", std::strerror(err));
  map_bytes_ = file_bytes;
  try {
    parse_header();
  } catch (...) {
    munmap(map_, map_bytes_);  // the destructor does not run for a constructor that throws
    map_ = nullptr;
    throw;
  }
}

void SafetensorsFile::parse_header() {
  using nlohmann::json;
  const std::string& path = path_;
  const uint64_t file_bytes = map_bytes_;
  const auto* bytes = static_cast<const unsigned char*>(map_);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  const auto fail = [&](const auto&... parts) {
    const std::string msg = detail::concat("safetensors file '", path, "' is corrupt: ", parts...);
    throw UserError(msg);
  };
  if (header_len > kMaxHeaderBytes || header_len > file_bytes - 8)
    fail("header length ", header_len, " exceeds the file size ", file_bytes, " (truncated or not safetensors)");
  json header;
  try {
    header = json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const json::exception& e) {  // parse errors, and numbers out of range
    fail("header is not valid JSON (", e.what(), ")");
  }
  if (!header.is_object()) fail("header is not a JSON object");
  const uint64_t data_bytes = file_bytes - 8 - header_len;
  data_ = bytes + 8 + header_len;

  std::vector<std::pair<std::pair<uint64_t, uint64_t>, std::string>> ranges;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail("__metadata__ is not an object");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) fail("__metadata__ value of '", k, "' is not a string");
        metadata_[k] = s.get<std::string>();
      }
      continue;
    }
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      fail("entry '", name, "' needs dtype, shape and data_offsets");
    if (!v["dtype"].is_string()) fail("entry '", name, "' has a non-string dtype");
    SafetensorsEntry e;
    e.dtype = v["dtype"].get<std::string>();
    e.scalar_type = scalar_type_from_safetensors(e.dtype, "safetensors file '" + path + "', tensor '" + name + "'");
    if (!v["shape"].is_array()) fail("entry '", name, "' has a non-list shape");
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) fail("entry '", name, "' has a negative or non-integer dimension");
      const uint64_t x = d.get<uint64_t>();
      if (x != 0 && numel > (1ull << 62) / x) fail("entry '", name, "' has an impossibly large shape");
      numel *= x;
      e.shape.push_back(static_cast<int64_t>(x));
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail("entry '", name, "' needs data_offsets [begin, end] of non-negative integers");
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.begin > e.end) fail("entry '", name, "' has begin ", e.begin, " after end ", e.end);
    if (e.end > data_bytes)
      fail("entry '", name, "' ends at byte ", e.end, " but the data section has ", data_bytes,
           " bytes (truncated file)");
    const uint64_t expect = numel * torch::elementSize(e.scalar_type);
    if (e.end - e.begin != expect)
      fail("entry '", name, "' holds ", e.end - e.begin, " bytes but dtype ", e.dtype, " and its shape need ", expect);
    ranges.push_back({{e.begin, e.end}, name});
    entries_.emplace(name, std::move(e));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first.first < ranges[i - 1].first.second)
      fail("tensors '", ranges[i - 1].second, "' and '", ranges[i].second, "' overlap");
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ && map_ != MAP_FAILED) munmap(map_, map_bytes_);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : entries_) out.push_back(k);
  return out;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  TANDEM_CHECK(it != entries_.end(), "tensor '", name, "' not found in '", path_, "'");
  return it->second;
}

torch::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const auto& e = entry(name);
  auto t = torch::empty(e.shape, torch::TensorOptions().dtype(e.scalar_type));
  if (e.end > e.begin) std::memcpy(t.data_ptr(), data_ + e.begin, e.end - e.begin);
  return t;
}

torch::Tensor SafetensorsFile::slice(const std::string& name, int64_t offset, int64_t n) const {
  const auto& e = entry(name);
  const int64_t size = static_cast<int64_t>(c10::elementSize(e.scalar_type));
  const int64_t total = static_cast<int64_t>(e.end - e.begin) / size;
  TANDEM_CHECK(offset >= 0 && n >= 0 && offset + n <= total, path_, ": '", name, "' has ", total,
               " elements; elements ", offset, " .. ", offset + n, " were asked for");
  auto t = torch::empty({n}, torch::TensorOptions().dtype(e.scalar_type));
  if (n > 0) std::memcpy(t.data_ptr(), data_ + e.begin + offset * size, static_cast<size_t>(n * size));
  return t;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  using nlohmann::json;
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> cpu;
  cpu.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    TANDEM_ASSERT(!header.contains(name), "duplicate tensor name ", name);
    auto c = t.detach().to(torch::kCPU).contiguous();
    const uint64_t n = c.numel() * c.element_size();
    header[name] = {{"dtype", safetensors_dtype(c.scalar_type())},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
    cpu.push_back(std::move(c));
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // data section 8-byte aligned, as the reference writer does
  unsigned char len[8];
  uint64_t hl = h.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(hl >> (8 * i));
  DurableFile w(path);
  w.append(len, 8);
  w.append(h.data(), h.size());
  for (const auto& c : cpu) w.append(c.data_ptr(), c.numel() * c.element_size());
  w.commit();
}

}  // namespace tandem
