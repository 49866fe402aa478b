#pragma once
// Model architecture descriptions and the preset zoo.

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/core/config.h"

namespace tandem {

/// Which kind of network a model is.
/// kDecoder: the transformer decoder of every Family (Note [Decoder families]).
/// kAmxMoe (seed 000's model): n_dense dense MLP layers ("AMX" layers, meant for the CPU's matrix
/// units) feeding n_layer - n_dense Mixture-of-Experts layers (meant for the GPU).
enum class Arch { kDecoder, kMlp, kResNetBk, kAmxMoe };

/// The Hugging Face family of a decoder: its config.json's model_type and its tensors' names
/// (models/family.h). What the families compute differently is in DecoderParts.
enum class Family { kLlama, kQwen2, kMistral, kGemma, kGemma2, kPhi3, kGpt2 };

enum class NormKind {
  kRms,         ///< x / rms(x) * w (Llama)
  kRmsPlusOne,  ///< x / rms(x) * (1 + w), the scale stored as w (Gemma)
  kLayerNorm,   ///< (x - mean) / std * w + b (GPT-2)
};

enum class Activation { kSilu, kGelu, kGeluTanh };

/// How RoPE's frequencies are scaled, as HF's rope_type.
enum class RopeType { kDefault, kLinear, kDynamic, kYarn, kLlama3 };

/// RoPE frequency scaling as in HF's rope_parameters (rope_scaling in transformers 4.x).
struct RopeScaling {
  RopeType type = RopeType::kDefault;
  double factor = 0.0;                   ///< linear, dynamic, yarn, llama3
  double low_freq_factor = 1.0;          ///< llama3
  double high_freq_factor = 4.0;         ///< llama3
  int64_t original_max_position = 8192;  ///< llama3, yarn; dynamic: the length beyond which it scales
  double beta_fast = 32, beta_slow = 1;  ///< yarn
  double attention_factor = 0;           ///< yarn's cos/sin scale; 0: from factor, mscale and mscale_all_dim
  double mscale = 0, mscale_all_dim = 0;
  bool truncate = true;  ///< yarn: round the correction range outwards
};

/// Where decoder families differ (Note [Decoder families]); the defaults are Llama's.
struct DecoderParts {
  int64_t head_dim = 0;   ///< 0: d_model / n_head
  bool qkv_bias = false;  ///< biases on q, k, v (Qwen2, GPT-2, Llama's attention_bias)
  bool o_bias = false;    ///< a bias on the attention output (GPT-2, Llama's attention_bias)
  bool mlp_bias = false;  ///< biases in the feed-forward (GPT-2, Llama's mlp_bias)
  NormKind norm = NormKind::kRms;
  bool gated_ffn = true;  ///< down(act(gate(x)) * up(x)); false: down(act(up(x))) (GPT-2)
  Activation act = Activation::kSilu;
  bool scale_embedding = false;      ///< embeddings times sqrt(d_model) (Gemma)
  bool learned_positions = false;    ///< a position table added to the embeddings, no RoPE (GPT-2)
  double rotary_fraction = 1.0;      ///< RoPE on the first fraction of each head (partial_rotary_factor)
  int64_t sliding_window = 0;        ///< a query attends to this many latest keys, itself included; 0: all
  std::vector<bool> sliding_layers;  ///< the layers that slide; empty: every one (with a window)
  bool sandwich_norms = false;       ///< norms on the attention's and the feed-forward's outputs too (Gemma2)
  double attn_softcap = 0;           ///< scores become cap * tanh(scores / cap) (Gemma2); 0: none
  double final_softcap = 0;          ///< the same on the logits (Gemma2); 0: none
  double query_scale = 0;            ///< the scores' scale; 0: 1 / sqrt(head_dim) (Gemma2: query_pre_attn_scalar^-1/2)
};

/// Every number that fixes a model's shapes.
struct ModelSpec {
  std::string name;  ///< preset name, or "custom"
  Arch arch = Arch::kDecoder;
  Family family = Family::kLlama;  ///< kDecoder only
  int64_t n_layer = 0, d_model = 0, n_head = 0, n_kv_head = 0, d_ff = 0;
  int64_t vocab_size = 0;  ///< the real vocabulary (tokens the data may contain)
  int64_t max_seq_len = 0;
  bool tie_embeddings = false;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  RopeScaling rope_scaling;
  DecoderParts parts;  ///< kDecoder only
  /// config.json's bos_token_id, eos_token_id and pad_token_id as read (a JSON object), written back
  /// as they were: a family's defaults must not replace an absent id (Phi-3's pad 32000); "" = none.
  std::string token_ids;
  // ResNet-BK: n_head is the number of BK heads; the feed-forward is a Mixture of Experts of
  // n_experts SwiGLU experts of size d_ff, top_k per token.
  // AMX+MoE: the first n_dense layers are dense (hidden d_ff), the rest MoE (experts of hidden d_ff).
  int64_t n_experts = 0, top_k = 0;
  int64_t n_dense = 0;
  double capacity_factor = 1.25;
  double moe_aux_weight = 0.01;  ///< weight of the load-balance loss in the training loss

  int64_t head_dim() const { return parts.head_dim > 0 ? parts.head_dim : d_model / n_head; }
  /// The leading dimensions of each head RoPE rotates (even); 0 with learned positions.
  int64_t rotary_dim() const;
  /// Layer i's window (DecoderParts::sliding_window), 0 when it attends to every earlier key.
  int64_t window(int64_t layer) const;
  /// Vocabulary rounded up to a multiple of 64 (tensor-core friendly); extra rows never win the loss.
  int64_t padded_vocab() const { return (vocab_size + 63) / 64 * 64; }
  /// Feed-forward size as stored, rounded up to a multiple of 64: the extra units start at zero
  /// and stay zero (Note [Zero padding keeps the function]), so the model is unchanged.
  /// Families whose checkpoints fuse gate and up (Phi-3) are not padded.
  int64_t padded_d_ff() const;
  /// Parameters as stored (padded vocabulary rows included).
  int64_t num_params() const;
  /// Parameters of the real model (as an HF checkpoint counts them).
  int64_t num_params_unpadded() const;
  /// Parameters of one norm (LayerNorm has a bias), and of the learned position table (GPT-2).
  int64_t norm_params() const;
  int64_t position_params() const;
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

/// A model folder's architecture (`folder`, from its config.json) with the model.* keys the user set
/// (Note [Folder overrides]): max_seq_len, rope_theta and norm_eps apply; a larger vocab_size grows
/// the vocabulary (the new rows start from the initialisation, said in the log); any other key that
/// differs from the folder's is refused (UserError naming both values): the folder's weights fix
/// the architecture. `source`: the folder, for messages.
ModelSpec spec_with_folder_overrides(ModelSpec folder, const ModelConfig& c, const std::string& source);

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
