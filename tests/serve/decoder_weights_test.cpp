// Generation's weights (serve/decoder_weights.h): per-family layouts stacked into each layer's views
// in the compute dtype, a tied head, streamed layers equal to resident ones, and bad tensors refused
// naming them.

#include "tandem/serve/decoder_weights.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../error_of.h"
#include "tandem/core/error.h"
#include "tandem/models/family.h"
#include "tandem/models/spec.h"
#include "tandem/serve/residency_plan.h"

namespace tandem {
namespace {

using test::error_of;
using Tensors = std::map<std::string, torch::Tensor>;

// d_model 8, 2 heads of 4, 1 key/value head (q 8 rows, k and v 4 each), feed-forward 12, vocabulary
// 10, 16 positions.
ModelSpec spec_of(Family family, int64_t layers, bool tied) {
  ModelSpec s = preset_spec("tiny");
  s.family = family;
  s.parts = family_parts(family);
  s.n_layer = layers, s.d_model = 8, s.n_head = 2, s.n_kv_head = 1, s.d_ff = 12;
  s.vocab_size = 10, s.max_seq_len = 16, s.tie_embeddings = tied;
  if (family == Family::kGpt2) s.n_kv_head = 2;
  return s;
}

torch::Tensor random(std::vector<int64_t> shape) { return torch::randn(shape, torch::kFloat32); }

// A Llama folder's tensors (separate projections) or, with `fused`, a Phi-3 folder's.
Tensors llama_tensors(const ModelSpec& s, bool fused) {
  torch::manual_seed(11);
  Tensors t;
  t["model.embed_tokens.weight"] = random({10, 8});
  t["model.norm.weight"] = random({8});
  if (!s.tie_embeddings) t["lm_head.weight"] = random({10, 8});
  for (int64_t i = 0; i < s.n_layer; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    if (fused) {
      t[p + "self_attn.qkv_proj.weight"] = random({16, 8});
      t[p + "mlp.gate_up_proj.weight"] = random({24, 8});
    } else {
      t[p + "self_attn.q_proj.weight"] = random({8, 8});
      t[p + "self_attn.k_proj.weight"] = random({4, 8});
      t[p + "self_attn.v_proj.weight"] = random({4, 8});
      t[p + "mlp.gate_proj.weight"] = random({12, 8});
      t[p + "mlp.up_proj.weight"] = random({12, 8});
    }
    t[p + "self_attn.o_proj.weight"] = random({8, 8});
    t[p + "mlp.down_proj.weight"] = random({8, 12});
    t[p + "input_layernorm.weight"] = random({8});
    t[p + "post_attention_layernorm.weight"] = random({8});
  }
  return t;
}

// A GPT-2 folder's tensors: Conv1D matrices stored (in, out).
Tensors gpt2_tensors(const ModelSpec& s) {
  torch::manual_seed(12);
  Tensors t;
  t["transformer.wte.weight"] = random({10, 8});
  t["transformer.wpe.weight"] = random({16, 8});
  t["transformer.ln_f.weight"] = random({8});
  t["transformer.ln_f.bias"] = random({8});
  for (int64_t i = 0; i < s.n_layer; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    t[p + "attn.c_attn.weight"] = random({8, 24});
    t[p + "attn.c_attn.bias"] = random({24});
    t[p + "attn.c_proj.weight"] = random({8, 8});
    t[p + "attn.c_proj.bias"] = random({8});
    t[p + "mlp.c_fc.weight"] = random({8, 12});
    t[p + "mlp.c_fc.bias"] = random({12});
    t[p + "mlp.c_proj.weight"] = random({12, 8});
    t[p + "mlp.c_proj.bias"] = random({8});
    for (const char* n : {"ln_1", "ln_2"}) {
      t[p + n + ".weight"] = random({8});
      t[p + n + ".bias"] = random({8});
    }
  }
  return t;
}

TensorLookup lookup_of(const Tensors& tensors) {
  auto held = std::make_shared<Tensors>(tensors);
  return [held](const std::string& name) -> std::optional<torch::Tensor> {
    const auto it = held->find(name);
    if (it == held->end()) return std::nullopt;
    return it->second;
  };
}

WeightPlacement placement(const ModelSpec& s, torch::ScalarType dtype = torch::kFloat32, int64_t budget = -1) {
  WeightPlacement p;
  p.dtype = dtype;
  p.plan = plan_residency(s, dtype, budget, 1);
  return p;
}

void expect_same(const torch::Tensor& got, const torch::Tensor& want, torch::ScalarType dtype,
                 const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.scalar_type(), dtype) << what;
  EXPECT_TRUE(torch::equal(got, want.to(dtype))) << what;
}

// Note [Norms in fp32]: a norm's scale in fp32 holding the compute dtype's value of `want`.
void expect_norm(const torch::Tensor& got, const torch::Tensor& want, torch::ScalarType dtype, const std::string& what) {
  expect_same(got, want.to(dtype).to(torch::kFloat32), torch::kFloat32, what);
}

TEST(DecoderWeights, LlamaLayersStackQkvAndGateUpInTheComputeDtypeAndKeepNormsInFp32) {
  const ModelSpec s = spec_of(Family::kLlama, 2, false);
  const Tensors t = llama_tensors(s, false);
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    DecoderWeights w(s, placement(s, dtype), lookup_of(t), "folder");
    expect_same(w.embed(), t.at("model.embed_tokens.weight"), dtype, "embed");
    expect_same(w.lm_head(), t.at("lm_head.weight"), dtype, "lm_head");
    expect_norm(w.final_norm(), t.at("model.norm.weight"), dtype, "final norm");
    EXPECT_FALSE(w.positions().defined());
    EXPECT_FALSE(w.final_norm_bias().defined());
    for (int64_t i = 0; i < 2; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      const LayerWeights l = w.acquire(i);
      expect_same(l.qkv,
                  torch::cat({t.at(p + "self_attn.q_proj.weight"), t.at(p + "self_attn.k_proj.weight"),
                              t.at(p + "self_attn.v_proj.weight")}),
                  dtype, p + "qkv");
      expect_same(l.o, t.at(p + "self_attn.o_proj.weight"), dtype, p + "o");
      expect_same(l.gate_up, torch::cat({t.at(p + "mlp.gate_proj.weight"), t.at(p + "mlp.up_proj.weight")}), dtype,
                  p + "gate_up");
      expect_same(l.down, t.at(p + "mlp.down_proj.weight"), dtype, p + "down");
      expect_norm(l.attn_norm, t.at(p + "input_layernorm.weight"), dtype, p + "attn_norm");
      expect_norm(l.ff_norm, t.at(p + "post_attention_layernorm.weight"), dtype, p + "ff_norm");
      for (const auto* absent : {&l.qkv_bias, &l.o_bias, &l.gate_up_bias, &l.down_bias, &l.attn_norm_bias,
                                 &l.ff_norm_bias, &l.attn_out_norm, &l.ff_out_norm})
        EXPECT_FALSE(absent->defined()) << p;
      // One flat buffer a layer for the matrices; the norms apart, in fp32, converted once.
      EXPECT_TRUE(l.qkv.storage().is_alias_of(l.down.storage())) << p;
      EXPECT_FALSE(l.qkv.storage().is_alias_of(l.ff_norm.storage())) << p;
      EXPECT_TRUE(w.acquire(i).ff_norm.is_same(l.ff_norm)) << p << ": the same tensor at every acquire";
      w.release(i);
      w.release(i);
    }
    EXPECT_EQ(w.uploads(), 0);
  }
}

TEST(DecoderWeights, PhiThreesFusedProjectionsFillTheStackedParts) {
  const ModelSpec s = spec_of(Family::kPhi3, 1, false);
  const Tensors t = llama_tensors(s, /*fused=*/true);
  DecoderWeights w(s, placement(s), lookup_of(t), "folder");
  const LayerWeights l = w.acquire(0);
  expect_same(l.qkv, t.at("model.layers.0.self_attn.qkv_proj.weight"), torch::kFloat32, "qkv");
  expect_same(l.gate_up, t.at("model.layers.0.mlp.gate_up_proj.weight"), torch::kFloat32, "gate_up");
  w.release(0);
}

TEST(DecoderWeights, ATiedHeadIsTheEmbeddingAndNeedsNoTensorOfItsOwn) {
  const ModelSpec s = spec_of(Family::kLlama, 1, true);
  const Tensors t = llama_tensors(s, false);
  ASSERT_EQ(t.count("lm_head.weight"), 0u);
  DecoderWeights w(s, placement(s), lookup_of(t), "folder");
  EXPECT_EQ(w.lm_head().data_ptr(), w.embed().data_ptr());
  // Untied, the head is required.
  const ModelSpec untied = spec_of(Family::kLlama, 1, false);
  const std::string e = error_of([&] { DecoderWeights(untied, placement(untied), lookup_of(t), "folder"); });
  EXPECT_NE(e.find("folder: tensor 'lm_head.weight' is missing"), std::string::npos) << e;
}

TEST(DecoderWeights, GptTwosInputMajorMatricesAreTransposedAndItsBiasesAndPositionsRead) {
  const ModelSpec s = spec_of(Family::kGpt2, 2, true);
  const Tensors t = gpt2_tensors(s);
  DecoderWeights w(s, placement(s), lookup_of(t), "folder");
  const auto f32 = torch::kFloat32;
  expect_same(w.positions(), t.at("transformer.wpe.weight"), f32, "positions");
  expect_same(w.final_norm(), t.at("transformer.ln_f.weight"), f32, "final norm");
  expect_same(w.final_norm_bias(), t.at("transformer.ln_f.bias"), f32, "final norm bias");
  EXPECT_EQ(w.lm_head().data_ptr(), w.embed().data_ptr());
  for (int64_t i = 0; i < 2; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    const LayerWeights l = w.acquire(i);
    expect_same(l.qkv, t.at(p + "attn.c_attn.weight").t(), f32, p + "qkv");  // (24, 8)
    expect_same(l.qkv_bias, t.at(p + "attn.c_attn.bias"), f32, p + "qkv bias");
    expect_same(l.o, t.at(p + "attn.c_proj.weight").t(), f32, p + "o");
    expect_same(l.o_bias, t.at(p + "attn.c_proj.bias"), f32, p + "o bias");
    expect_same(l.gate_up, t.at(p + "mlp.c_fc.weight").t(), f32, p + "up");  // (12, 8): ungated, up alone
    expect_same(l.gate_up_bias, t.at(p + "mlp.c_fc.bias"), f32, p + "up bias");
    expect_same(l.down, t.at(p + "mlp.c_proj.weight").t(), f32, p + "down");  // (8, 12)
    expect_same(l.down_bias, t.at(p + "mlp.c_proj.bias"), f32, p + "down bias");
    expect_same(l.attn_norm, t.at(p + "ln_1.weight"), f32, p + "ln_1");
    expect_same(l.attn_norm_bias, t.at(p + "ln_1.bias"), f32, p + "ln_1 bias");
    expect_same(l.ff_norm, t.at(p + "ln_2.weight"), f32, p + "ln_2");
    expect_same(l.ff_norm_bias, t.at(p + "ln_2.bias"), f32, p + "ln_2 bias");
    w.release(i);
  }
}

// 4 layers, room for 1 beside 2 slots: layers 1 .. 3 pass through the slots, each pass uploading all three.
TEST(DecoderWeights, StreamedLayersReadAsResidentOnes) {
  const ModelSpec s = spec_of(Family::kLlama, 4, false);
  const Tensors t = llama_tensors(s, false);
  DecoderWeights resident(s, placement(s), lookup_of(t), "folder");
  const int64_t layer = decoder_layer_numel(s) * 4, fixed = decoder_fixed_numel(s) * 4;
  DecoderWeights streamed(s, placement(s, torch::kFloat32, fixed + 3 * layer), lookup_of(t), "folder");
  ASSERT_EQ(streamed.placement().plan.resident(), 1);
  ASSERT_EQ(streamed.placement().plan.slots, 2);
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t i = 0; i < 4; ++i) {
      const LayerWeights a = resident.acquire(i), b = streamed.acquire(i);
      const std::string what = "pass " + std::to_string(pass) + ", layer " + std::to_string(i);
      for (const auto part : {&LayerWeights::qkv, &LayerWeights::o, &LayerWeights::gate_up, &LayerWeights::down,
                              &LayerWeights::attn_norm, &LayerWeights::ff_norm})
        expect_same(b.*part, a.*part, torch::kFloat32, what);
      resident.release(i);
      streamed.release(i);
    }
  }
  EXPECT_EQ(streamed.uploads(), 2 + 3 * 2);
  EXPECT_EQ(resident.uploads(), 0);
}

TEST(DecoderWeights, ATensorOfTheWrongShapeOrKindIsNamedWithTheFolder) {
  const ModelSpec gpt2 = spec_of(Family::kGpt2, 1, true);
  Tensors t = gpt2_tensors(gpt2);
  t["transformer.h.0.attn.c_attn.weight"] = random({24, 8});  // (out, in): not GPT-2's layout
  std::string e = error_of([&] { DecoderWeights(gpt2, placement(gpt2), lookup_of(t), "gpt2-folder"); });
  EXPECT_NE(e.find("gpt2-folder: tensor 'transformer.h.0.attn.c_attn.weight' has shape [24, 8] but config.json "
                   "implies [8, 24]"),
            std::string::npos)
      << e;

  t = gpt2_tensors(gpt2);
  t.erase("transformer.wpe.weight");
  e = error_of([&] { DecoderWeights(gpt2, placement(gpt2), lookup_of(t), "gpt2-folder"); });
  EXPECT_NE(e.find("tensor 'transformer.wpe.weight' is missing"), std::string::npos) << e;

  const ModelSpec llama = spec_of(Family::kLlama, 1, false);
  Tensors l = llama_tensors(llama, false);
  l["model.layers.0.input_layernorm.weight"] = torch::ones({8}, torch::kInt64);
  e = error_of([&] { DecoderWeights(llama, placement(llama), lookup_of(l), "f"); });
  EXPECT_NE(e.find("tensor 'model.layers.0.input_layernorm.weight' has dtype"), std::string::npos) << e;
  EXPECT_NE(e.find("expected floating-point weights"), std::string::npos) << e;
  // bf16 and fp16 tensors are weights like fp32 ones.
  l = llama_tensors(llama, false);
  l["model.layers.0.mlp.down_proj.weight"] = l["model.layers.0.mlp.down_proj.weight"].to(torch::kHalf);
  DecoderWeights w(llama, placement(llama), lookup_of(l), "f");
  expect_same(w.acquire(0).down, l["model.layers.0.mlp.down_proj.weight"], torch::kFloat32, "fp16 down");
  w.release(0);
}

}  // namespace
}  // namespace tandem
