#include "tandem/models/family.h"

#include <array>

#include "tandem/core/error.h"

namespace tandem {
namespace {

// Llama's names, which Qwen2, Mistral and Gemma share.
FamilyNames llama_names(std::string model_type, std::string architecture) {
  FamilyNames n;
  n.model_type = std::move(model_type);
  n.architecture = std::move(architecture);
  n.base = "model.";
  n.embed = "embed_tokens";
  n.layers = "layers";
  n.final_norm = "norm";
  n.attn_norm = "input_layernorm";
  n.ff_norm = "post_attention_layernorm";
  n.attn = "self_attn";
  n.q = "q_proj", n.k = "k_proj", n.v = "v_proj", n.o = "o_proj";
  n.mlp = "mlp";
  n.gate = "gate_proj", n.up = "up_proj", n.down = "down_proj";
  return n;
}

FamilyNames gemma2_names() {
  FamilyNames n = llama_names("gemma2", "Gemma2ForCausalLM");
  n.attn_out_norm = "post_attention_layernorm";
  n.ff_norm = "pre_feedforward_layernorm";
  n.ff_out_norm = "post_feedforward_layernorm";
  return n;
}

FamilyNames phi3_names() {
  FamilyNames n = llama_names("phi3", "Phi3ForCausalLM");
  n.q = n.k = n.v = "";
  n.qkv = "qkv_proj";
  n.gate = n.up = "";
  n.gate_up = "gate_up_proj";
  return n;
}

FamilyNames gpt2_names() {
  FamilyNames n;
  n.model_type = "gpt2";
  n.architecture = "GPT2LMHeadModel";
  n.base = "transformer.";
  n.embed = "wte";
  n.positions = "wpe";
  n.layers = "h";
  n.final_norm = "ln_f";
  n.attn_norm = "ln_1";
  n.ff_norm = "ln_2";
  n.attn = "attn";
  n.qkv = "c_attn";
  n.o = "c_proj";
  n.mlp = "mlp";
  n.up = "c_fc";
  n.down = "c_proj";
  n.input_major = true;
  return n;
}

const std::array<FamilyNames, 7>& all_names() {
  static const std::array<FamilyNames, 7> kNames = {llama_names("llama", "LlamaForCausalLM"),
                                                    llama_names("qwen2", "Qwen2ForCausalLM"),
                                                    llama_names("mistral", "MistralForCausalLM"),
                                                    llama_names("gemma", "GemmaForCausalLM"),
                                                    gemma2_names(),
                                                    phi3_names(),
                                                    gpt2_names()};
  return kNames;
}

}  // namespace

const FamilyNames& family_names(Family family) { return all_names().at(static_cast<size_t>(family)); }

bool family_of_model_type(const std::string& model_type, Family& family) {
  const auto& names = all_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i].model_type == model_type) {
      family = static_cast<Family>(i);
      return true;
    }
  return false;
}

std::string supported_model_types() {
  std::string out;
  for (const auto& n : all_names()) out += (out.empty() ? "" : ", ") + n.model_type;
  return out;
}

const char* to_string(Family f) { return family_names(f).model_type.c_str(); }

DecoderParts family_parts(Family family) {
  DecoderParts p;
  switch (family) {
    case Family::kLlama:
    case Family::kMistral:
    case Family::kPhi3:
      break;
    case Family::kQwen2:
      p.qkv_bias = true;
      break;
    case Family::kGemma:
      p.norm = NormKind::kRmsPlusOne;
      p.act = Activation::kGeluTanh;
      p.scale_embedding = true;
      break;
    case Family::kGemma2:
      p.norm = NormKind::kRmsPlusOne;
      p.act = Activation::kGeluTanh;
      p.scale_embedding = true;
      p.sandwich_norms = true;
      break;
    case Family::kGpt2:
      p.qkv_bias = p.o_bias = p.mlp_bias = true;
      p.norm = NormKind::kLayerNorm;
      p.gated_ffn = false;
      p.act = Activation::kGeluTanh;
      p.learned_positions = true;
      break;
  }
  return p;
}

}  // namespace tandem
