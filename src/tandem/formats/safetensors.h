#pragma once
// The safetensors format: 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then
// the tensor bytes (offsets relative to the end of the header). Readers validate every field.

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tandem {

/// One tensor entry of a safetensors header.
struct SafetensorsEntry {
  std::string dtype;  // "F32", "BF16", ...
  torch::ScalarType scalar_type;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
};

/// A memory-mapped safetensors file with a validated header.
class SafetensorsFile {
 public:
  /// Opens and validates; UserError naming the file and the defect otherwise.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  std::vector<std::string> names() const;
  const SafetensorsEntry& entry(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// A CPU tensor holding a copy of the named tensor's data.
  torch::Tensor tensor(const std::string& name) const;
  /// Elements [offset, offset + n) of the named tensor, flattened: a 1-D CPU copy of just those.
  torch::Tensor slice(const std::string& name, int64_t offset, int64_t n) const;

 private:
  void parse_header();  // validates the mapped file, fills entries_ and metadata_
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char* data_ = nullptr;  // start of the data section
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// Writes tensors (any device; copied to the CPU, made contiguous) and string metadata to `path`,
/// fsynced. Names must be unique.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// safetensors dtype string for a torch dtype (and back); UserError for unsupported ones.
std::string safetensors_dtype(torch::ScalarType t);
torch::ScalarType scalar_type_from_safetensors(const std::string& dtype, const std::string& context);

}  // namespace tandem
