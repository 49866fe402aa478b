// Model specs: the presets' parameter counts worked out by hand from their shapes, padded sizes,
// validate_spec's refusals (upper bounds included) with their messages, resolve_model_spec's
// overrides, and the tensor-core alignment report.

#include "tandem/models/spec.h"

#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>

#include "../error_of.h"
#include "tandem/core/error.h"
#include "tandem/core/strings.h"

namespace tandem {
namespace {

using test::error_of;

// Parameter counts of the presets, by hand from their shapes (spec.cpp), as stored. Every
// vocabulary is a multiple of 64 and every LLaMA d_ff too, so stored and HF counts agree.
// LLaMA layer = q, o (d x d each) + k, v (d x kv_dim each) + gate, up, down (d x d_ff each)
//               + 2 norms (d); model = embedding (vocab x d) [+ lm_head (vocab x d)] + layers + final norm (d).
// tiny: L=4, d=128, 4 heads of 32, 2 kv heads (kv_dim 64), d_ff=384, vocab 256, tied.
//   layer = 2*16384 + 2*8192 + 3*49152 + 256 = 196864; model = 32768 + 4*196864 + 128
constexpr int64_t kTinyLayer = 196864;
constexpr int64_t kTinyParams = 820352;
// 125M: L=12, d=768, 12 heads (kv_dim 768), d_ff=2048, vocab 32000, tied.
//   layer = 4*589824 + 3*1572864 + 1536 = 7079424; model = 24576000 + 12*7079424 + 768
constexpr int64_t k125MLayer = 7079424;
constexpr int64_t k125MParams = 109529856;
// 1B: L=24, d=2048, 16 heads of 128, 8 kv heads (kv_dim 1024), d_ff=5632, untied.
//   layer = 2*4194304 + 2*2097152 + 3*11534336 + 4096 = 47190016; model = 2*65536000 + 24*47190016 + 2048
constexpr int64_t k1BLayer = 47190016;
constexpr int64_t k1BParams = 1263634432;
// 3B: L=28, d=3072, 24 heads of 128, 8 kv heads (kv_dim 1024), d_ff=8192, untied.
//   layer = 2*9437184 + 2*3145728 + 3*25165824 + 6144 = 100669440; model = 2*98304000 + 28*100669440 + 3072
constexpr int64_t k3BLayer = 100669440;
constexpr int64_t k3BParams = 3015355392;
// 7B: L=32, d=4096, 32 heads (no GQA), d_ff=11008, untied (LLaMA-2 7B, as tests/memory/plan_test.cpp).
//   layer = 4*16777216 + 3*45088768 + 8192 = 202383360; model = 2*131072000 + 32*202383360 + 4096
constexpr int64_t k7BLayer = 202383360;
constexpr int64_t k7BParams = 6738415616;
// 13B: L=40, d=5120, 40 heads (no GQA), d_ff=13824, untied (LLaMA-2 13B).
//   layer = 4*26214400 + 3*70778880 + 10240 = 317204480; model = 2*163840000 + 40*317204480 + 5120
constexpr int64_t k13BLayer = 317204480;
constexpr int64_t k13BParams = 13015864320;
// mlp: L=4, d=256, d_ff=1024, vocab 256, tied; layer = up (d x d_ff) + down (d_ff x d) + norm (d).
//   layer = 2*262144 + 256 = 524544; model = 65536 + 4*524544 + 256
constexpr int64_t kMlpLayer = 524544;
constexpr int64_t kMlpParams = 2163968;
// bk-tiny: L=4, d=128, 8 BK heads, 8 experts of d_ff=128, vocab 256, tied. Layer = in_proj (3h x d,
// bias 3h) + out_proj (d x 2h) + z_re, z_im (h each) + 2 norms (d) + router (e x d) + experts
// gate, up, down (e x d x d_ff each).
//   layer = 3072 + 24 + 2048 + 16 + 256 + 1024 + 393216 = 399656; model = 32768 + 4*399656 + 128
constexpr int64_t kBkTinyLayer = 399656;
constexpr int64_t kBkTinyParams = 1631520;
// amx-moe-tiny: L=4 (2 dense), d=128, d_ff=256, 8 experts, vocab 256, tied.
//   dense layer = 2*32768 + 128 = 65664; MoE layer = norm 128 + router 1024 + 3*8*32768 = 787584
//   model = 32768 + 2*65664 + 2*787584 + 128
constexpr int64_t kAmxTinyDense = 65664;
constexpr int64_t kAmxTinyMoe = 787584;
constexpr int64_t kAmxTinyParams = 1739392;
// amx-moe: L=6 (2 dense), d=1024, d_ff=2048, 8 experts, vocab 8192, tied.
//   dense layer = 2*2097152 + 1024 = 4195328; MoE layer = 1024 + 8192 + 3*8*2097152 = 50340864
//   model = 8388608 + 2*4195328 + 4*50340864 + 1024
constexpr int64_t kAmxDense = 4195328;
constexpr int64_t kAmxMoe = 50340864;
constexpr int64_t kAmxParams = 218143744;

TEST(Spec, PresetParameterCountsByHand) {
  struct Expected {
    const char* name;
    int64_t layer, params;
  };
  for (const auto& e :
       {Expected{"tiny", kTinyLayer, kTinyParams}, Expected{"125M", k125MLayer, k125MParams},
        Expected{"1B", k1BLayer, k1BParams}, Expected{"3B", k3BLayer, k3BParams}, Expected{"7B", k7BLayer, k7BParams},
        Expected{"13B", k13BLayer, k13BParams}, Expected{"mlp", kMlpLayer, kMlpParams},
        Expected{"bk-tiny", kBkTinyLayer, kBkTinyParams}, Expected{"amx-moe-tiny", kAmxTinyMoe, kAmxTinyParams},
        Expected{"amx-moe", kAmxMoe, kAmxParams}}) {
    const ModelSpec s = preset_spec(e.name);
    EXPECT_EQ(s.num_params(), e.params) << e.name;
    EXPECT_EQ(s.num_params_unpadded(), e.params) << e.name << ": no padding in any preset";
    EXPECT_EQ(s.params_per_layer(), e.layer) << e.name << ": the largest layer";
  }
  const ModelSpec amx = preset_spec("amx-moe");
  for (int64_t i = 0; i < amx.n_layer; ++i) EXPECT_EQ(amx.layer_params(i), i < 2 ? kAmxDense : kAmxMoe) << i;
  const ModelSpec amx_tiny = preset_spec("amx-moe-tiny");
  for (int64_t i = 0; i < amx_tiny.n_layer; ++i)
    EXPECT_EQ(amx_tiny.layer_params(i), i < 2 ? kAmxTinyDense : kAmxTinyMoe) << i;
  // Every layer of a uniform model is params_per_layer.
  const ModelSpec s7 = preset_spec("7B");
  for (int64_t i = 0; i < s7.n_layer; ++i) EXPECT_EQ(s7.layer_params(i), k7BLayer) << i;
}

// The presets of the other families count what their published checkpoints hold (the sum of the
// safetensors' tensor sizes of Qwen2.5-0.5B/1.5B/7B, Mistral-7B-v0.1 and gemma-2-2b).
TEST(Spec, FamilyPresetsCountThePublishedCheckpoints) {
  EXPECT_EQ(preset_spec("qwen2.5-0.5B").num_params_unpadded(), 494032768);
  EXPECT_EQ(preset_spec("qwen2.5-1.5B").num_params_unpadded(), 1543714304);
  EXPECT_EQ(preset_spec("qwen2.5-7B").num_params_unpadded(), 7615616512);
  EXPECT_EQ(preset_spec("mistral-7B").num_params_unpadded(), 7241732096);
  EXPECT_EQ(preset_spec("gemma2-2B").num_params_unpadded(), 2614341888);
  const ModelSpec g = preset_spec("gemma2-2B");
  EXPECT_EQ(g.head_dim(), 256);  // not d_model / n_head = 288
  EXPECT_EQ(g.window(0), 4096);
  EXPECT_EQ(g.window(1), 0);
  EXPECT_EQ(preset_spec("mistral-7B").window(31), 4096);
}

TEST(Spec, PresetNamesAreTheZooAndLookupIgnoresCase) {
  const std::vector<std::string> expected = {
      "tiny", "125M",    "1B",           "3B",           "7B",           "13B",        "bk-tiny",    "bk-125M",
      "mlp",  "amx-moe", "amx-moe-tiny", "qwen2.5-0.5B", "qwen2.5-1.5B", "qwen2.5-7B", "mistral-7B", "gemma2-2B"};
  EXPECT_EQ(preset_names(), expected);
  for (const auto& n : expected) EXPECT_EQ(preset_spec(n).name, n);
  EXPECT_EQ(preset_spec("BK-Tiny").name, "bk-tiny");
  EXPECT_EQ(preset_spec("7b").n_layer, 32);
  EXPECT_EQ(preset_spec("bk-125M").arch, Arch::kResNetBk);
  EXPECT_EQ(preset_spec("mlp").arch, Arch::kMlp);
  EXPECT_EQ(preset_spec("amx-moe").arch, Arch::kAmxMoe);
  EXPECT_EQ(preset_spec("13B").arch, Arch::kDecoder);
  EXPECT_STREQ(to_string(Arch::kDecoder), "decoder");
  EXPECT_EQ(preset_spec("Qwen2.5-7B").family, Family::kQwen2);
  EXPECT_STREQ(to_string(Arch::kMlp), "mlp");
  EXPECT_STREQ(to_string(Arch::kResNetBk), "resnet_bk");
  EXPECT_STREQ(to_string(Arch::kAmxMoe), "amx_moe");
  for (const auto& n : expected) EXPECT_NO_THROW(validate_spec(preset_spec(n))) << n;
}

TEST(Spec, PaddedSizesRoundUpToSixtyFour) {
  ModelSpec s = preset_spec("tiny");
  for (const auto& [vocab, padded] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 64}, {50, 64}, {63, 64}, {64, 64}, {65, 128}, {32000, 32000}, {50257, 50304}, {128256, 128256}}) {
    s.vocab_size = vocab;
    EXPECT_EQ(s.padded_vocab(), padded) << vocab;
  }
  for (const auto& [ff, padded] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 64}, {48, 64}, {300, 320}, {320, 320}, {11008, 11008}}) {
    s.d_ff = ff;
    s.arch = Arch::kDecoder;
    EXPECT_EQ(s.padded_d_ff(), padded) << ff;
    s.arch = Arch::kMlp;
    EXPECT_EQ(s.padded_d_ff(), padded) << ff;
    // Expert sizes are stored as they are.
    s.arch = Arch::kResNetBk;
    EXPECT_EQ(s.padded_d_ff(), ff) << ff;
    s.arch = Arch::kAmxMoe;
    EXPECT_EQ(s.padded_d_ff(), ff) << ff;
  }
  // Stored and HF counts differ by exactly the padding: vocabulary rows (embedding, and lm_head
  // when untied) and feed-forward units (gate, up rows and down columns per layer).
  ModelSpec p = preset_spec("tiny");
  p.n_layer = 3, p.d_model = 32, p.n_head = 4, p.n_kv_head = 2, p.vocab_size = 50, p.d_ff = 48;
  for (const bool tied : {true, false}) {
    p.tie_embeddings = tied;
    const int64_t vocab_pad = (64 - 50) * 32 * (tied ? 1 : 2), ff_pad = 3 * 3 * 32 * (64 - 48);
    EXPECT_EQ(p.num_params() - p.num_params_unpadded(), vocab_pad + ff_pad) << tied;
    EXPECT_EQ(p.params_per_layer(true) - p.params_per_layer(false), 3 * 32 * (64 - 48));
  }
  // By hand, unpadded and tied: layer = 2*32*32 (q, o) + 2*32*16 (k, v) + 3*32*48 + 2*32 = 7744.
  p.tie_embeddings = true;
  EXPECT_EQ(p.params_per_layer(false), 7744);
  EXPECT_EQ(p.num_params_unpadded(), 50 * 32 + 3 * 7744 + 32);
}

/// The message validate_spec gives for `s` after `change` ("" when it accepts it).
std::string refusal(ModelSpec s, const std::function<void(ModelSpec&)>& change) {
  change(s);
  return error_of([&] { validate_spec(s); });
}

TEST(Spec, ValidateSpecRefusesOutOfRangeSizesNamingTheBound) {
  const ModelSpec tiny = preset_spec("tiny");
  struct Case {
    const char* what;
    std::function<void(ModelSpec&)> change;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"no layers", [](ModelSpec& s) { s.n_layer = 0; }, "model.n_layer must be within 1 .. 16384, got 0"},
      {"too many layers", [](ModelSpec& s) { s.n_layer = kMaxLayers + 1; },
       "model.n_layer must be within 1 .. 16384, got 16385"},
      {"negative width", [](ModelSpec& s) { s.d_model = -128; }, "model.d_model must be within 1 .. 1048576, got -128"},
      {"too wide", [](ModelSpec& s) { s.d_model = kMaxWidth + 1; },
       "model.d_model must be within 1 .. 1048576, got 1048577"},
      {"no feed-forward", [](ModelSpec& s) { s.d_ff = 0; }, "model.d_ff must be within 1 .. 4194304, got 0"},
      {"feed-forward too wide", [](ModelSpec& s) { s.d_ff = 4 * kMaxWidth + 1; },
       "model.d_ff must be within 1 .. 4194304, got 4194305"},
      {"no vocabulary", [](ModelSpec& s) { s.vocab_size = 0; }, "model.vocab_size must be within 1 .. 16777216, got 0"},
      {"vocabulary too large", [](ModelSpec& s) { s.vocab_size = kMaxVocab + 1; },
       "model.vocab_size must be within 1 .. 16777216, got 16777217"},
      {"no sequence", [](ModelSpec& s) { s.max_seq_len = 0; }, "model.max_seq_len must be within 1 .. 16777216, got 0"},
      {"sequence too long", [](ModelSpec& s) { s.max_seq_len = kMaxSeqLen + 1; },
       "model.max_seq_len must be within 1 .. 16777216, got 16777217"},
      {"norm eps", [](ModelSpec& s) { s.norm_eps = 0; }, "model.norm_eps must be > 0, got 0"},
      {"heads divide", [](ModelSpec& s) { s.n_head = 3; }, "model.d_model (128) must be divisible by model.n_head (3)"},
      {"no heads", [](ModelSpec& s) { s.n_head = 0; }, "model.n_head must be within 1 .. 1048576, got 0"},
      {"odd head_dim", [](ModelSpec& s) { s.d_model = 12, s.n_head = 4, s.n_kv_head = 4; },
       "RoPE's dimension (head_dim 3 x partial_rotary_factor 1 = 3) must be even"},
      {"kv heads divide", [](ModelSpec& s) { s.n_kv_head = 3; },
       "model.n_head (4) must be divisible by model.n_kv_head (3)"},
      {"no kv heads", [](ModelSpec& s) { s.n_kv_head = 0; },
       "model.n_head (4) must be divisible by model.n_kv_head (0)"},
      {"rope theta", [](ModelSpec& s) { s.rope_theta = 0; }, "model.rope_theta must be > 0, got 0"},
  };
  for (const auto& c : cases) {
    const std::string msg = refusal(tiny, c.change);
    EXPECT_NE(msg.find(c.message), std::string::npos) << c.what << ": '" << msg << "'";
  }
  // The bounds themselves are accepted.
  for (const auto& change : std::vector<std::function<void(ModelSpec&)>>{
           [](ModelSpec& s) { s.n_layer = kMaxLayers; }, [](ModelSpec& s) { s.d_model = kMaxWidth; },
           [](ModelSpec& s) { s.d_ff = 4 * kMaxWidth; }, [](ModelSpec& s) { s.vocab_size = kMaxVocab; },
           [](ModelSpec& s) { s.max_seq_len = kMaxSeqLen; }})
    EXPECT_EQ(refusal(tiny, change), "");
}

TEST(Spec, ValidateSpecRefusesMoreThanMaxParamsBeforeAnyProduct) {
  // Each size within its own bound; together 16384 layers of 4 * 2^40 + 3 * 2^40 * 4 parameters.
  ModelSpec s = preset_spec("tiny");
  s.n_layer = kMaxLayers, s.d_model = kMaxWidth, s.d_ff = 4 * kMaxWidth, s.n_head = 1024, s.n_kv_head = 1024;
  const std::string msg = error_of([&] { validate_spec(s); });
  EXPECT_NE(msg.find("parameters, more than tandem plans for (" + format_count(static_cast<double>(kMaxParams)) + ")"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("check model.d_model, model.d_ff, model.n_layer and model.vocab_size"), std::string::npos) << msg;
  // At the bound: layers of d = d_ff = 2^19 hold 4 d^2 + 3 d d_ff = 7 * 2^38 parameters each, so
  // 2^46 / (7 * 2^38) = 36.6 of them fit.
  ModelSpec ok = s;
  ok.d_model = ok.d_ff = int64_t{1} << 19;
  ok.n_layer = 36;
  EXPECT_EQ(error_of([&] { validate_spec(ok); }), "");
  EXPECT_LE(ok.num_params(), kMaxParams);
  ok.n_layer = 37;
  EXPECT_NE(error_of([&] { validate_spec(ok); }).find("more than tandem plans for"), std::string::npos);
  // Experts multiply the feed-forward.
  ModelSpec bk = preset_spec("bk-tiny");
  bk.d_model = bk.d_ff = int64_t{1} << 17;
  bk.n_layer = 2;
  bk.n_experts = kMaxExperts;
  EXPECT_NE(error_of([&] { validate_spec(bk); }).find("more than tandem plans for"), std::string::npos);
  bk.n_experts = 8;
  EXPECT_EQ(error_of([&] { validate_spec(bk); }), "");
}

TEST(Spec, ValidateSpecRefusesInconsistentMixtureOfExperts) {
  const ModelSpec bk = preset_spec("bk-tiny"), amx = preset_spec("amx-moe-tiny");
  struct Case {
    const ModelSpec* base;
    std::function<void(ModelSpec&)> change;
    std::string message;
  };
  const std::vector<Case> cases = {
      {&bk, [](ModelSpec& s) { s.n_experts = 0; }, "model.n_experts must be within 1 .. 4096, got 0"},
      {&bk, [](ModelSpec& s) { s.n_experts = kMaxExperts + 1; }, "model.n_experts must be within 1 .. 4096, got 4097"},
      {&bk, [](ModelSpec& s) { s.top_k = 9; },
       "a ResNet-BK model needs 1 <= model.top_k <= model.n_experts, got 9 of 8"},
      {&bk, [](ModelSpec& s) { s.top_k = 0; },
       "a ResNet-BK model needs 1 <= model.top_k <= model.n_experts, got 0 of 8"},
      {&bk, [](ModelSpec& s) { s.n_head = 0; }, "model.n_head (BK heads) must be within 1 .. 1048576, got 0"},
      {&bk, [](ModelSpec& s) { s.capacity_factor = 0; }, "model.capacity_factor must be > 0, got 0"},
      {&bk, [](ModelSpec& s) { s.moe_aux_weight = -0.5; }, "model.moe_aux_weight must be >= 0, got -0.5"},
      {&amx, [](ModelSpec& s) { s.n_experts = kMaxExperts + 1; }, "model.n_experts must be within 1 .. 4096, got 4097"},
      {&amx, [](ModelSpec& s) { s.n_dense = 5; }, "model.n_dense must be within 0 .. model.n_layer (4), got 5"},
      {&amx, [](ModelSpec& s) { s.n_dense = -1; }, "model.n_dense must be within 0 .. model.n_layer (4), got -1"},
      {&amx, [](ModelSpec& s) { s.top_k = 9; },
       "an AMX+MoE model needs 1 <= model.top_k <= model.n_experts, got 9 of 8"},
      {&amx, [](ModelSpec& s) { s.capacity_factor = -1; }, "model.capacity_factor must be > 0, got -1"},
      {&amx, [](ModelSpec& s) { s.moe_aux_weight = -1; }, "model.moe_aux_weight must be >= 0, got -1"},
  };
  for (const auto& c : cases) {
    const std::string msg = refusal(*c.base, c.change);
    EXPECT_NE(msg.find(c.message), std::string::npos) << c.base->name << ": '" << msg << "'";
  }
  // The bounds of n_dense and top_k themselves are accepted; an MoE model's head count is free.
  EXPECT_EQ(refusal(amx, [](ModelSpec& s) { s.n_dense = 0; }), "");
  EXPECT_EQ(refusal(amx, [](ModelSpec& s) { s.n_dense = 4; }), "");
  EXPECT_EQ(refusal(bk, [](ModelSpec& s) { s.top_k = 8; }), "");
  EXPECT_EQ(refusal(bk, [](ModelSpec& s) { s.n_head = 7; }), "");
  // A LLaMA spec does not look at its expert fields.
  EXPECT_EQ(refusal(preset_spec("tiny"), [](ModelSpec& s) { s.n_experts = 0, s.top_k = 99, s.capacity_factor = 0; }),
            "");
}

TEST(Spec, ResolveModelSpecAppliesEveryOverride) {
  ModelConfig none;
  none.preset = "TINY";
  const ModelSpec plain = resolve_model_spec(none);
  EXPECT_EQ(plain.name, "tiny") << "no override keeps the preset's name";
  EXPECT_EQ(plain.num_params(), kTinyParams);

  ModelConfig c;
  c.preset = "tiny";
  c.n_layer = 3, c.d_model = 64, c.n_head = 8, c.n_kv_head = 4, c.d_ff = 100, c.vocab_size = 77, c.max_seq_len = 40;
  c.tie_embeddings = false, c.rope_theta = 500000.0, c.norm_eps = 1e-6;
  const ModelSpec s = resolve_model_spec(c);
  EXPECT_EQ(s.name, "tiny+custom");
  EXPECT_EQ(s.arch, Arch::kDecoder);
  EXPECT_EQ(s.n_layer, 3);
  EXPECT_EQ(s.d_model, 64);
  EXPECT_EQ(s.n_head, 8);
  EXPECT_EQ(s.n_kv_head, 4);
  EXPECT_EQ(s.d_ff, 100);
  EXPECT_EQ(s.vocab_size, 77);
  EXPECT_EQ(s.max_seq_len, 40);
  EXPECT_FALSE(s.tie_embeddings) << "an explicit false overrides the preset's true";
  EXPECT_EQ(s.rope_theta, 500000.0);
  EXPECT_EQ(s.norm_eps, 1e-6);

  // Fewer query heads than the preset's kv heads, without n_kv_head: kv heads follow (tiny has 2).
  ModelConfig mha;
  mha.n_head = 1;
  EXPECT_EQ(resolve_model_spec(mha).n_kv_head, 1);
  mha.n_head = 8;
  EXPECT_EQ(resolve_model_spec(mha).n_kv_head, 2) << "more query heads keep the preset's kv heads";
  // One override alone marks the spec custom.
  ModelConfig one;
  one.max_seq_len = 64;
  EXPECT_EQ(resolve_model_spec(one).name, "tiny+custom");
  EXPECT_EQ(resolve_model_spec(one).d_model, 128);
  // The result is validated.
  ModelConfig bad;
  bad.n_layer = kMaxLayers + 1;
  EXPECT_NE(error_of([&] { resolve_model_spec(bad); }).find("model.n_layer must be within 1 .. 16384"),
            std::string::npos);
  ModelConfig unknown;
  unknown.preset = "tiny2";
  EXPECT_NE(error_of([&] { resolve_model_spec(unknown); }).find("unknown model preset 'tiny2'"), std::string::npos);
}

TEST(Spec, ResolveModelSpecRefusesMixtureOfExpertsKeysOnOtherPresets) {
  const std::string moe_keys = "apply to MoE presets (bk-tiny, bk-125M, amx-moe, amx-moe-tiny); model.preset is ";
  for (const char* preset : {"tiny", "mlp", "7B"}) {
    for (const auto& set : std::vector<std::function<void(ModelConfig&)>>{
             [](ModelConfig& c) { c.n_experts = 4; }, [](ModelConfig& c) { c.top_k = 1; },
             [](ModelConfig& c) { c.capacity_factor = 2.0; }, [](ModelConfig& c) { c.moe_aux_weight = 0.1; }}) {
      ModelConfig c;
      c.preset = preset;
      set(c);
      const std::string msg = error_of([&] { resolve_model_spec(c); });
      EXPECT_NE(msg.find(moe_keys + preset_spec(preset).name), std::string::npos) << msg;
    }
  }
  for (const char* preset : {"tiny", "bk-tiny"}) {
    ModelConfig c;
    c.preset = preset;
    c.n_dense = 1;
    const std::string msg = error_of([&] { resolve_model_spec(c); });
    EXPECT_NE(msg.find("model.n_dense applies to the AMX+MoE presets (amx-moe, amx-moe-tiny); model.preset is " +
                       std::string(preset)),
              std::string::npos)
        << msg;
  }
  // On the AMX+MoE presets every MoE key applies.
  ModelConfig amx;
  amx.preset = "amx-moe-tiny";
  amx.n_dense = 3, amx.n_experts = 4, amx.top_k = 1, amx.capacity_factor = 2.0, amx.moe_aux_weight = 0.5;
  const ModelSpec s = resolve_model_spec(amx);
  EXPECT_EQ(s.name, "amx-moe-tiny+custom");
  EXPECT_EQ(s.n_dense, 3);
  EXPECT_EQ(s.n_experts, 4);
  EXPECT_EQ(s.top_k, 1);
  EXPECT_EQ(s.capacity_factor, 2.0);
  EXPECT_EQ(s.moe_aux_weight, 0.5);
  // 3 dense layers of 65664 and one MoE layer of 4 experts: 128 + 4*128 + 3*4*32768.
  EXPECT_EQ(s.num_params(), 32768 + 3 * kAmxTinyDense + (128 + 512 + 393216) + 128);
  amx.n_dense = 5;
  EXPECT_NE(error_of([&] { resolve_model_spec(amx); }).find("model.n_dense must be within 0 .. model.n_layer (4)"),
            std::string::npos);
}

TEST(Spec, MatrixShapesListEveryRoleOnce) {
  ModelSpec s = preset_spec("1B");
  const auto shapes = matrix_shapes(s);
  std::set<std::string> names;
  for (const auto& m : shapes) EXPECT_TRUE(names.insert(m.name).second) << m.name;
  ASSERT_EQ(shapes.size(), 8u);
  EXPECT_EQ(shapes[0].name, "embed_tokens");
  EXPECT_EQ(shapes[1].name, "lm_head") << "untied";
  EXPECT_EQ(shapes[4].name, "k_proj, v_proj");
  EXPECT_EQ(shapes[4].rows, 1024);  // 8 kv heads of 128
  EXPECT_EQ(shapes[4].cols, 2048);
  EXPECT_EQ(shapes[5].rows, 5632);
  s.tie_embeddings = true;
  EXPECT_EQ(matrix_shapes(s).size(), 7u) << "a tied head has no matrix of its own";
  ModelSpec odd = preset_spec("tiny");
  odd.vocab_size = 50, odd.d_ff = 300;
  // Stored sizes: vocabulary and feed-forward padded, so only the unpadded head_dim 32 can be named.
  EXPECT_EQ(matrix_shapes(odd)[0].rows, 64);
  EXPECT_TRUE(misaligned_dims(odd, 16).empty());
  EXPECT_EQ(misaligned_dims(odd, 64), std::vector<std::string>{"attention head_dim (32 x 32)"});
}

// Moved from tests/models/shapes_test.cpp.

TEST(Shapes, EveryPresetIsTensorCoreAligned) {
  for (const auto& name : preset_names()) {
    const ModelSpec s = preset_spec(name);
    EXPECT_TRUE(misaligned_dims(s, 8).empty()) << name;
    const auto bad16 = misaligned_dims(s, 16);
    if (s.arch != Arch::kResNetBk && s.arch != Arch::kAmxMoe) {
      EXPECT_TRUE(bad16.empty()) << name;
      continue;
    }
    // MoE presets: only the small matrices whose size is a count of experts or BK heads (router,
    // BK input projection) may miss fp8's 16, and inspect names them.
    for (const auto& m : bad16)
      EXPECT_TRUE(m.rfind("mlp.router", 0) == 0 || m.rfind("bk.in_proj", 0) == 0) << name << ": " << m;
  }
}

TEST(Shapes, MisalignedDimensionsAreNamed) {
  ModelConfig c;
  c.d_model = 120, c.n_head = 4, c.n_kv_head = 4, c.d_ff = 300;
  const auto bad = misaligned_dims(resolve_model_spec(c), 16);
  ASSERT_FALSE(bad.empty());
  EXPECT_NE(bad.front().find("120"), std::string::npos);
  EXPECT_EQ(resolve_model_spec(c).padded_d_ff(), 320);
}

// Moved from tests/models/llama_test.cpp.

TEST(Presets, UnknownPresetNamesClosest) {
  try {
    preset_spec("7b-chat");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown model preset '7b-chat'"), std::string::npos) << e.what();
  }
  try {
    preset_spec("tinny");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'tiny'"), std::string::npos) << e.what();
  }
}

TEST(Presets, SizesAreWhatTheirNamesSay) {
  EXPECT_NEAR(double(preset_spec("125M").num_params_unpadded()), 125e6, 20e6);
  EXPECT_NEAR(double(preset_spec("1B").num_params_unpadded()), 1.2e9, 0.2e9);
  EXPECT_NEAR(double(preset_spec("3B").num_params_unpadded()), 3.0e9, 0.3e9);
  EXPECT_NEAR(double(preset_spec("7B").num_params_unpadded()), 6.74e9, 0.05e9);  // LLaMA-2 7B
  EXPECT_NEAR(double(preset_spec("13B").num_params_unpadded()), 13.0e9, 0.1e9);  // LLaMA-2 13B
  for (const auto& n : preset_names()) {
    const auto s = preset_spec(n);
    EXPECT_EQ(s.padded_vocab() % 64, 0) << n;
    EXPECT_EQ(s.d_model % 64, 0) << n;
  }
  ModelConfig bad;
  bad.d_model = 100;
  bad.n_head = 3;
  EXPECT_THROW(resolve_model_spec(bad), UserError);
}

// Moved from tests/models/resnet_bk_test.cpp.

TEST(ResNetBk, MoeKeysOverrideThePresetAndAreCheckedUpFront) {
  ModelConfig c;
  c.preset = "bk-tiny";
  c.n_experts = 4;
  c.top_k = 1;
  const ModelSpec s = resolve_model_spec(c);
  EXPECT_EQ(s.n_experts, 4);
  EXPECT_EQ(s.top_k, 1);
  EXPECT_LT(s.num_params(), preset_spec("bk-tiny").num_params());
  c.top_k = 5;
  EXPECT_NE(test::error_of([&] { resolve_model_spec(c); }).find("1 <= model.top_k <= model.n_experts"),
            std::string::npos);
  ModelConfig l;
  l.n_experts = 4;  // preset tiny is LLaMA
  EXPECT_NE(test::error_of([&] { resolve_model_spec(l); }).find("apply to MoE presets"), std::string::npos);
}

}  // namespace
}  // namespace tandem
