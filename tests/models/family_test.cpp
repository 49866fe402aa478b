// The decoder families' table (models/family.h, Note [Decoder families]): model_type both ways,
// each family's tensor names, and that the names agree with the parts the family computes
// (fused or separate projections, gate, learned positions, sandwich norms).

#include "tandem/models/family.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace tandem {
namespace {

const std::vector<Family> kAll = {Family::kLlama,  Family::kQwen2, Family::kMistral, Family::kGemma,
                                  Family::kGemma2, Family::kPhi3,  Family::kGpt2};

struct Named {
  Family family;
  const char* model_type;
  const char* architecture;
};

const Named kNamed[] = {
    {Family::kLlama, "llama", "LlamaForCausalLM"},       {Family::kQwen2, "qwen2", "Qwen2ForCausalLM"},
    {Family::kMistral, "mistral", "MistralForCausalLM"}, {Family::kGemma, "gemma", "GemmaForCausalLM"},
    {Family::kGemma2, "gemma2", "Gemma2ForCausalLM"},    {Family::kPhi3, "phi3", "Phi3ForCausalLM"},
    {Family::kGpt2, "gpt2", "GPT2LMHeadModel"}};

TEST(DecoderFamily, ModelTypeAndFamilyMapBothWays) {
  for (const Named& n : kNamed) {
    EXPECT_EQ(family_names(n.family).model_type, n.model_type);
    EXPECT_EQ(family_names(n.family).architecture, n.architecture);
    EXPECT_STREQ(to_string(n.family), n.model_type);
    Family found = n.family == Family::kLlama ? Family::kGpt2 : Family::kLlama;
    ASSERT_TRUE(family_of_model_type(n.model_type, found)) << n.model_type;
    EXPECT_EQ(found, n.family) << n.model_type << ": the table's order must follow the enum's";
  }
  EXPECT_EQ(supported_model_types(), "llama, qwen2, mistral, gemma, gemma2, phi3, gpt2");
}

TEST(DecoderFamily, AnUnknownModelTypeIsNotFoundAndLeavesTheFamilyAlone) {
  Family f = Family::kGemma2;
  EXPECT_FALSE(family_of_model_type("bert", f));
  EXPECT_FALSE(family_of_model_type("Llama", f)) << "model_type is matched exactly";
  EXPECT_FALSE(family_of_model_type("", f));
  EXPECT_FALSE(family_of_model_type("llama ", f));
  EXPECT_EQ(f, Family::kGemma2);
}

TEST(DecoderFamily, LlamaNamesAreSharedByQwen2MistralAndGemma) {
  const FamilyNames& l = family_names(Family::kLlama);
  EXPECT_EQ(l.base, "model.");
  EXPECT_EQ(l.embed, "embed_tokens");
  EXPECT_EQ(l.positions, "");
  EXPECT_EQ(l.layers, "layers");
  EXPECT_EQ(l.final_norm, "norm");
  EXPECT_EQ(l.attn_norm, "input_layernorm");
  EXPECT_EQ(l.ff_norm, "post_attention_layernorm");
  EXPECT_EQ(l.attn_out_norm, "");
  EXPECT_EQ(l.ff_out_norm, "");
  EXPECT_EQ(l.attn, "self_attn");
  EXPECT_EQ(l.q + l.k + l.v + l.o, "q_projk_projv_projo_proj");
  EXPECT_EQ(l.qkv, "");
  EXPECT_EQ(l.mlp, "mlp");
  EXPECT_EQ(l.gate + "," + l.up + "," + l.down, "gate_proj,up_proj,down_proj");
  EXPECT_EQ(l.gate_up, "");
  EXPECT_FALSE(l.input_major);
  for (Family f : {Family::kQwen2, Family::kMistral, Family::kGemma}) {
    const FamilyNames& n = family_names(f);
    for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{{n.base, l.base},
                                                                               {n.embed, l.embed},
                                                                               {n.layers, l.layers},
                                                                               {n.final_norm, l.final_norm},
                                                                               {n.attn_norm, l.attn_norm},
                                                                               {n.ff_norm, l.ff_norm},
                                                                               {n.attn, l.attn},
                                                                               {n.q, l.q},
                                                                               {n.k, l.k},
                                                                               {n.v, l.v},
                                                                               {n.o, l.o},
                                                                               {n.gate, l.gate},
                                                                               {n.up, l.up},
                                                                               {n.down, l.down}})
      EXPECT_EQ(a, b) << to_string(f);
  }
}

TEST(DecoderFamily, Gemma2PhiThreeAndGptTwoNameTheirOwnParts) {
  const FamilyNames& g2 = family_names(Family::kGemma2);
  EXPECT_EQ(g2.attn_out_norm, "post_attention_layernorm");
  EXPECT_EQ(g2.ff_norm, "pre_feedforward_layernorm");
  EXPECT_EQ(g2.ff_out_norm, "post_feedforward_layernorm");
  EXPECT_EQ(g2.attn_norm, "input_layernorm");

  const FamilyNames& phi3 = family_names(Family::kPhi3);
  EXPECT_EQ(phi3.qkv, "qkv_proj");
  EXPECT_EQ(phi3.q + phi3.k + phi3.v, "");
  EXPECT_EQ(phi3.gate_up, "gate_up_proj");
  EXPECT_EQ(phi3.gate + phi3.up, "");
  EXPECT_EQ(phi3.o, "o_proj");
  EXPECT_EQ(phi3.down, "down_proj");

  const FamilyNames& gpt2 = family_names(Family::kGpt2);
  EXPECT_EQ(gpt2.base, "transformer.");
  EXPECT_EQ(gpt2.embed, "wte");
  EXPECT_EQ(gpt2.positions, "wpe");
  EXPECT_EQ(gpt2.layers, "h");
  EXPECT_EQ(gpt2.final_norm, "ln_f");
  EXPECT_EQ(gpt2.attn_norm, "ln_1");
  EXPECT_EQ(gpt2.ff_norm, "ln_2");
  EXPECT_EQ(gpt2.attn, "attn");
  EXPECT_EQ(gpt2.qkv, "c_attn");
  EXPECT_EQ(gpt2.o, "c_proj");
  EXPECT_EQ(gpt2.mlp, "mlp");
  EXPECT_EQ(gpt2.up, "c_fc");
  EXPECT_EQ(gpt2.gate, "");
  EXPECT_EQ(gpt2.down, "c_proj");
  EXPECT_TRUE(gpt2.input_major);
}

// The names must describe the tensors the parts create: a fused or a separate q, k, v; a gate
// exactly when the feed-forward is gated; a position table exactly with learned positions.
TEST(DecoderFamily, NamesAgreeWithTheFamilysParts) {
  for (Family f : kAll) {
    const FamilyNames& n = family_names(f);
    const DecoderParts p = family_parts(f);
    const bool separate_qkv = !n.q.empty() && !n.k.empty() && !n.v.empty();
    EXPECT_NE(separate_qkv, !n.qkv.empty()) << to_string(f) << ": q, k, v separate or fused, not both";
    EXPECT_TRUE(separate_qkv || (n.q.empty() && n.k.empty() && n.v.empty())) << to_string(f);
    const bool has_gate = !n.gate.empty() || !n.gate_up.empty();
    EXPECT_EQ(has_gate, p.gated_ffn) << to_string(f);
    EXPECT_NE(n.up.empty(), n.gate_up.empty()) << to_string(f) << ": an up projection or a fused gate_up";
    EXPECT_EQ(!n.positions.empty(), p.learned_positions) << to_string(f);
    EXPECT_EQ(!n.attn_out_norm.empty(), p.sandwich_norms) << to_string(f);
    EXPECT_EQ(!n.ff_out_norm.empty(), p.sandwich_norms) << to_string(f);
    for (const std::string* name : {&n.base, &n.embed, &n.layers, &n.final_norm, &n.attn_norm, &n.ff_norm, &n.attn,
                                    &n.o, &n.mlp, &n.down, &n.architecture})
      EXPECT_FALSE(name->empty()) << to_string(f);
  }
}

TEST(DecoderFamily, PartsDifferFromLlamasOnlyWhereTheFamilyDoes) {
  const DecoderParts llama;
  const auto same_as_llama = [&](const DecoderParts& p) {
    return p.qkv_bias == llama.qkv_bias && p.o_bias == llama.o_bias && p.mlp_bias == llama.mlp_bias &&
           p.norm == llama.norm && p.gated_ffn == llama.gated_ffn && p.act == llama.act &&
           p.scale_embedding == llama.scale_embedding && p.learned_positions == llama.learned_positions &&
           p.sandwich_norms == llama.sandwich_norms && p.rotary_fraction == llama.rotary_fraction &&
           p.sliding_window == llama.sliding_window && p.attn_softcap == llama.attn_softcap &&
           p.final_softcap == llama.final_softcap && p.query_scale == llama.query_scale && p.head_dim == 0;
  };
  for (Family f : {Family::kLlama, Family::kMistral, Family::kPhi3})
    EXPECT_TRUE(same_as_llama(family_parts(f))) << to_string(f);

  DecoderParts qwen2 = family_parts(Family::kQwen2);
  EXPECT_TRUE(qwen2.qkv_bias);
  EXPECT_FALSE(qwen2.o_bias || qwen2.mlp_bias);
  qwen2.qkv_bias = false;
  EXPECT_TRUE(same_as_llama(qwen2)) << "qkv_bias is Qwen2's only difference";

  DecoderParts gemma = family_parts(Family::kGemma);
  EXPECT_EQ(gemma.norm, NormKind::kRmsPlusOne);
  EXPECT_EQ(gemma.act, Activation::kGeluTanh);
  EXPECT_TRUE(gemma.scale_embedding);
  EXPECT_FALSE(gemma.sandwich_norms);
  gemma.norm = llama.norm, gemma.act = llama.act, gemma.scale_embedding = false;
  EXPECT_TRUE(same_as_llama(gemma));

  DecoderParts gemma2 = family_parts(Family::kGemma2);
  EXPECT_EQ(gemma2.norm, NormKind::kRmsPlusOne);
  EXPECT_EQ(gemma2.act, Activation::kGeluTanh);
  EXPECT_TRUE(gemma2.scale_embedding && gemma2.sandwich_norms);
  gemma2.norm = llama.norm, gemma2.act = llama.act, gemma2.scale_embedding = gemma2.sandwich_norms = false;
  EXPECT_TRUE(same_as_llama(gemma2)) << "softcaps and windows come from config.json, not the family";

  DecoderParts gpt2 = family_parts(Family::kGpt2);
  EXPECT_TRUE(gpt2.qkv_bias && gpt2.o_bias && gpt2.mlp_bias);
  EXPECT_EQ(gpt2.norm, NormKind::kLayerNorm);
  EXPECT_FALSE(gpt2.gated_ffn);
  EXPECT_EQ(gpt2.act, Activation::kGeluTanh);
  EXPECT_TRUE(gpt2.learned_positions);
  EXPECT_FALSE(gpt2.scale_embedding || gpt2.sandwich_norms);
}

}  // namespace
}  // namespace tandem
