#pragma once
// The decoder families tandem reads and writes: each one's HF model_type and tensor names.
//
// Note [Decoder families]
// Llama, Qwen2, Mistral, Gemma, Gemma2, Phi-3 and GPT-2 are one decoder (models/decoder.h) whose
// parts differ: q/k/v biases (Qwen2), a sliding window over the keys (Mistral; every other layer
// in Gemma2), embeddings scaled by sqrt(d_model), (1 + w) RMSNorm and GeGLU (Gemma), norms around
// the attention's and the feed-forward's outputs, soft-capped scores and logits and a query scale
// of its own (Gemma2), partial RoPE (Phi-3's partial_rotary_factor), learned positions, LayerNorm,
// biases everywhere and an ungated GELU feed-forward (GPT-2). Those are DecoderParts, read from
// config.json (io/hf_config.cpp), each a named switch of the one decoder rather than a copy of it.
// What is only a matter of storage is the family's: the names of its tensors, whether q, k, v (and
// gate, up) are one fused tensor (Phi-3, GPT-2's c_attn), and whether weights are stored input-major
// (GPT-2's Conv1D). The model registers its parameters under these names, so tandem's checkpoints
// are the family's own folders, which transformers loads as they are.

#include <string>

#include "tandem/models/spec.h"

namespace tandem {

/// The HF names of a family's tensors: the model's prefix, then each part's module name.
struct FamilyNames {
  std::string model_type;     ///< config.json's model_type: "llama"
  std::string architecture;   ///< config.json's architectures[0]: "LlamaForCausalLM"
  std::string base;           ///< "model." (GPT-2: "transformer.")
  std::string embed;          ///< "embed_tokens" (GPT-2: "wte")
  std::string positions;      ///< the learned position table: "wpe"; "" without
  std::string layers;         ///< "layers" (GPT-2: "h")
  std::string final_norm;     ///< "norm" (GPT-2: "ln_f")
  std::string attn_norm;      ///< before the attention: "input_layernorm" (GPT-2: "ln_1")
  std::string attn_out_norm;  ///< on the attention's output (sandwich norms): Gemma2's "post_attention_layernorm"
  std::string ff_norm;  ///< before the feed-forward: "post_attention_layernorm" (Gemma2: "pre_feedforward_layernorm")
  std::string ff_out_norm;   ///< on the feed-forward's output (sandwich norms): "post_feedforward_layernorm"
  std::string attn;          ///< "self_attn" (GPT-2: "attn")
  std::string q, k, v;       ///< separate projections; "" when fused
  std::string qkv;           ///< the fused projection: Phi-3's "qkv_proj", GPT-2's "c_attn"; "" when separate
  std::string o;             ///< "o_proj" (GPT-2: "c_proj")
  std::string mlp;           ///< "mlp"
  std::string gate, up;      ///< separate projections (GPT-2: up is "c_fc", no gate); "" when fused
  std::string gate_up;       ///< Phi-3's fused "gate_up_proj"; "" when separate
  std::string down;          ///< "down_proj" (GPT-2: "c_proj")
  bool input_major = false;  ///< weights stored (in, out) (GPT-2's Conv1D); else (out, in)
};

/// The names of `family`.
const FamilyNames& family_names(Family family);

/// The family of an HF model_type, or false when tandem does not read it.
bool family_of_model_type(const std::string& model_type, Family& family);

/// Every family's model_type, for messages.
std::string supported_model_types();

const char* to_string(Family f);

/// What `family` computes unless its config.json says otherwise (DecoderParts' defaults for it).
DecoderParts family_parts(Family family);

}  // namespace tandem
