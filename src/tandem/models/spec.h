#pragma once
// Model architecture descriptions and the preset zoo.

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/core/config.h"

namespace tandem {

/// Which family a model belongs to.
/// kAmxMoe (seed 000's model): n_dense dense MLP layers ("AMX" layers, meant for the CPU's matrix
/// units) feeding n_layer - n_dense Mixture-of-Experts layers (meant for the GPU).
enum class Arch { kLlama, kMlp, kResNetBk, kAmxMoe };

/// RoPE frequency scaling as in HF's rope_scaling {"rope_type": "llama3", ...}; factor 0 = none.
struct RopeScaling {
  double factor = 0.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
};

/// Every number that fixes a model's shapes.
struct ModelSpec {
  std::string name;  ///< preset name, or "custom"
  Arch arch = Arch::kLlama;
  int64_t n_layer = 0, d_model = 0, n_head = 0, n_kv_head = 0, d_ff = 0;
  int64_t vocab_size = 0;  ///< the real vocabulary (tokens the data may contain)
  int64_t max_seq_len = 0;
  bool tie_embeddings = false;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  RopeScaling rope_scaling;
  // ResNet-BK: n_head is the number of BK heads; the feed-forward is a Mixture of Experts of
  // n_experts SwiGLU experts of size d_ff, top_k per token.
  // AMX+MoE: the first n_dense layers are dense (hidden d_ff), the rest MoE (experts of hidden d_ff).
  int64_t n_experts = 0, top_k = 0;
  int64_t n_dense = 0;
  double capacity_factor = 1.25;
  double moe_aux_weight = 0.01;  ///< weight of the load-balance loss in the training loss

  int64_t head_dim() const { return d_model / n_head; }
  /// Vocabulary rounded up to a multiple of 64 (tensor-core friendly); extra rows never win the loss.
  int64_t padded_vocab() const { return (vocab_size + 63) / 64 * 64; }
  /// Feed-forward size as stored, rounded up to a multiple of 64: the extra units start at zero
  /// and stay zero (Note [Zero padding keeps the function]), so the model is unchanged.
  int64_t padded_d_ff() const {
    return arch == Arch::kResNetBk || arch == Arch::kAmxMoe ? d_ff : (d_ff + 63) / 64 * 64;
  }
  /// Parameters as stored (padded vocabulary rows included).
  int64_t num_params() const;
  /// Parameters of the real model (as an HF checkpoint counts them).
  int64_t num_params_unpadded() const;
  /// Parameters of one decoder block (as stored, or as in an HF checkpoint); the largest layer's
  /// when layers differ (AMX+MoE).
  int64_t params_per_layer(bool padded = true) const;
  /// Parameters of decoder layer i.
  int64_t layer_params(int64_t i, bool padded = true) const;
};

/// Names of the built-in presets.
std::vector<std::string> preset_names();

/// A preset by name; UserError naming the closest preset if unknown.
ModelSpec preset_spec(const std::string& name);

/// The preset with the config's overrides applied, validated.
ModelSpec resolve_model_spec(const ModelConfig& cfg);

/// Bounds validate_spec enforces: far beyond any trained model, they keep every size in int64.
inline constexpr int64_t kMaxLayers = int64_t{1} << 14;
inline constexpr int64_t kMaxWidth = int64_t{1} << 20;
inline constexpr int64_t kMaxVocab = int64_t{1} << 24;
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 24;
inline constexpr int64_t kMaxExperts = int64_t{1} << 12;
inline constexpr int64_t kMaxParams = int64_t{1} << 46;  ///< about 70 trillion

/// Checks shapes for consistency (heads divide d_model, ...); UserError with the fix.
void validate_spec(const ModelSpec& spec);

const char* to_string(Arch a);

/// One weight matrix of the model as stored: name pattern and (rows, cols).
struct MatrixShape {
  std::string name;
  int64_t rows, cols;
};
/// Every distinct weight matrix shape of `spec` as stored (one entry per role, not per layer).
std::vector<MatrixShape> matrix_shapes(const ModelSpec& spec);
/// Lines naming each matrix dimension that is not a multiple of `multiple` (8 for bf16/fp16
/// tensor cores, 16 for fp8); empty when all are aligned.
std::vector<std::string> misaligned_dims(const ModelSpec& spec, int64_t multiple);

}  // namespace tandem
