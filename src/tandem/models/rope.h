#pragma once
// Rotary position embeddings: the cos/sin tables of a model's RoPE (its scaling included) and their
// application to queries and keys in HF's rotate-half convention.

#include <torch/torch.h>

#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "tandem/models/spec.h"

namespace tandem {

/// RoPE cos/sin tables (T, rotary_dim), built in fp64, kept in fp32 on the CPU and cached per device
/// and dtype. Scaling follows HF's rope_type: linear divides the frequencies by the factor; llama3
/// scales long wavelengths and blends the middle ones; yarn blends interpolated and extrapolated
/// frequencies over a correction range and scales cos and sin by its attention factor; dynamic
/// (NTK) raises the base for a sequence longer than the original length, so its table depends on
/// the sequence's length T.
class RopeTable {
 public:
  explicit RopeTable(const ModelSpec& spec);
  /// cos and sin for positions [0, T) of a sequence of T tokens, on `device` in `dtype`.
  std::pair<torch::Tensor, torch::Tensor> get(int64_t T, const torch::Device& device, torch::ScalarType dtype);
  /// Whether the table of a sequence depends on its length (dynamic scaling beyond the original).
  bool depends_on_length() const { return scaling_.type == RopeType::kDynamic; }

 private:
  torch::Tensor inv_freq(int64_t T) const;  // (rotary_dim / 2) fp64
  std::pair<torch::Tensor, torch::Tensor> table(int64_t T) const;

  int64_t dim_, max_len_;
  double base_;
  RopeScaling scaling_;
  torch::Tensor cos_, sin_;  // (max_len, rotary_dim) fp32 on the CPU, for sequences up to the original length
  std::mutex mutex_;
  std::map<std::tuple<std::string, int, int64_t>, std::pair<torch::Tensor, torch::Tensor>> cache_;
};

/// Rotates the first cos.size(-1) dimensions of x (..., hd) by cos and sin (broadcast against x),
/// leaving the others as they are (partial RoPE).
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace tandem
