// HF config.json <-> ModelSpec (io/hf_config.h) beyond hf_test.cpp: each family's defaults for absent
// keys, sliding-window layouts, dynamic/linear/yarn RoPE and their round trip, GPT-2's keys, token
// ids kept as they were, files that are not a config object.

#include "tandem/io/hf_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../error_of.h"
#include "../test_util.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using test::error_of;

// The keys every Llama-named family requires, and nothing else: the rest take their defaults.
json minimal(const std::string& model_type, json extra = json::object()) {
  json j = {{"model_type", model_type}, {"hidden_size", 64},        {"intermediate_size", 128},
            {"num_hidden_layers", 4},   {"num_attention_heads", 4}, {"vocab_size", 256}};
  j.update(extra);
  return j;
}

ModelSpec read(const json& j) { return spec_from_hf_config_text(j.dump(), "cfg/config.json"); }
std::string refusal(const json& j) {
  return error_of([&] { read(j); });
}

TEST(HfConfig, LlamaDefaultsForAbsentKeys) {
  const ModelSpec s = read(minimal("llama"));
  EXPECT_EQ(s.arch, Arch::kDecoder);
  EXPECT_EQ(s.family, Family::kLlama);
  EXPECT_EQ(s.name, "hf");
  EXPECT_EQ(s.max_seq_len, 2048);
  EXPECT_DOUBLE_EQ(s.norm_eps, 1e-6);
  EXPECT_FALSE(s.tie_embeddings);
  EXPECT_EQ(s.n_kv_head, 4);
  EXPECT_EQ(s.head_dim(), 16);
  EXPECT_EQ(s.parts.act, Activation::kSilu);
  EXPECT_FALSE(s.parts.qkv_bias || s.parts.o_bias || s.parts.mlp_bias);
  EXPECT_DOUBLE_EQ(s.rope_theta, 10000.0);
  EXPECT_EQ(s.rope_scaling.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(s.parts.rotary_fraction, 1.0);
  EXPECT_EQ(s.parts.sliding_window, 0);
  EXPECT_EQ(s.token_ids, "");  // no ids in the file: none made up
  // attention_bias puts biases on q, k, v and o; mlp_bias on the feed-forward alone.
  const ModelSpec b = read(minimal("llama", {{"attention_bias", true}}));
  EXPECT_TRUE(b.parts.qkv_bias && b.parts.o_bias);
  EXPECT_FALSE(b.parts.mlp_bias);
  EXPECT_TRUE(read(minimal("llama", {{"mlp_bias", true}})).parts.mlp_bias);
  // An explicit head_dim frees hidden_size from dividing by the heads.
  const ModelSpec wide = read(minimal("llama", {{"hidden_size", 62}, {"head_dim", 32}}));
  EXPECT_EQ(wide.head_dim(), 32);
  EXPECT_NE(refusal(minimal("llama", {{"hidden_size", 62}}))
                .find("'hidden_size' (62) must be divisible by 'num_attention_heads' (4) when 'head_dim' is not given"),
            std::string::npos);
}

TEST(HfConfig, GemmaDefaultsDifferFromLlamas) {
  const ModelSpec g = read(minimal("gemma"));
  EXPECT_EQ(g.head_dim(), 256);  // Gemma's head_dim is 256, not hidden_size / heads
  EXPECT_TRUE(g.tie_embeddings);
  EXPECT_EQ(g.parts.act, Activation::kGeluTanh);
  EXPECT_EQ(g.parts.norm, NormKind::kRmsPlusOne);
  EXPECT_TRUE(g.parts.scale_embedding);
  // Gemma reads hidden_act; Gemma2 reads hidden_activation and leaves hidden_act unread but allowed.
  EXPECT_EQ(read(minimal("gemma", {{"hidden_act", "gelu"}, {"hidden_activation", "silu"}})).parts.act,
            Activation::kGelu);
  const ModelSpec g2 = read(minimal("gemma2", {{"head_dim", 16}, {"hidden_act", "silu"}}));
  EXPECT_EQ(g2.parts.act, Activation::kGeluTanh);
  EXPECT_EQ(read(minimal("gemma2", {{"head_dim", 16}, {"hidden_activation", "gelu"}})).parts.act, Activation::kGelu);
  EXPECT_NE(refusal(minimal("gemma", {{"use_bidirectional_attention", true}})).find("attends causally"),
            std::string::npos);
  EXPECT_EQ(refusal(minimal("gemma", {{"use_bidirectional_attention", nullptr}})), "");
}

TEST(HfConfig, Gemma2SoftcapsScaleAndAlternatingWindows) {
  const ModelSpec g = read(minimal("gemma2", {{"head_dim", 16}}));
  EXPECT_DOUBLE_EQ(g.parts.attn_softcap, 50);  // absent: the family's caps
  EXPECT_DOUBLE_EQ(g.parts.final_softcap, 30);
  EXPECT_DOUBLE_EQ(g.parts.query_scale, 1.0 / 16);  // query_pre_attn_scalar 256
  EXPECT_EQ(g.parts.sliding_window, 4096);
  EXPECT_EQ(g.parts.sliding_layers, (std::vector<bool>{true, false, true, false}));
  EXPECT_TRUE(g.parts.sandwich_norms);
  // A null cap is none; a given scalar and window are taken; layer_types says which layers slide.
  const ModelSpec n = read(minimal(
      "gemma2",
      {{"head_dim", 16},
       {"attn_logit_softcapping", nullptr},
       {"final_logit_softcapping", 10.0},
       {"query_pre_attn_scalar", 64},
       {"sliding_window", 32},
       {"layer_types", json::array({"full_attention", "sliding_attention", "sliding_attention", "full_attention"})}}));
  EXPECT_DOUBLE_EQ(n.parts.attn_softcap, 0);
  EXPECT_DOUBLE_EQ(n.parts.final_softcap, 10);
  EXPECT_DOUBLE_EQ(n.parts.query_scale, 1.0 / 8);
  EXPECT_EQ(n.parts.sliding_window, 32);
  EXPECT_EQ(n.parts.sliding_layers, (std::vector<bool>{false, true, true, false}));
  EXPECT_EQ(n.window(0), 0);
  EXPECT_EQ(n.window(1), 32);
  EXPECT_NE(refusal(minimal("gemma2", {{"head_dim", 16}, {"query_pre_attn_scalar", 0}}))
                .find("'query_pre_attn_scalar' must be > 0"),
            std::string::npos);
  // What tandem writes reads back to the same model: the scalar as an integer when it is one.
  const json written = json::parse(hf_config_json(n));
  EXPECT_TRUE(written["query_pre_attn_scalar"].is_number_integer()) << written.dump();
  EXPECT_EQ(written["query_pre_attn_scalar"].get<int64_t>(), 64);
  EXPECT_TRUE(written["attn_logit_softcapping"].is_null());
  const ModelSpec back = read(written);
  EXPECT_EQ(back.parts.sliding_layers, n.parts.sliding_layers);
  EXPECT_DOUBLE_EQ(back.parts.query_scale, n.parts.query_scale);
  EXPECT_DOUBLE_EQ(back.parts.attn_softcap, 0);
  EXPECT_DOUBLE_EQ(back.parts.final_softcap, 10);
  ModelSpec odd = n;
  odd.parts.query_scale = 1.0 / std::sqrt(50.5);
  EXPECT_TRUE(json::parse(hf_config_json(odd))["query_pre_attn_scalar"].is_number_float());
}

TEST(HfConfig, SlidingWindowsOfMistralQwen2AndPhi3) {
  EXPECT_EQ(read(minimal("mistral")).parts.sliding_window, 4096);  // absent: Mistral's default
  EXPECT_EQ(read(minimal("mistral", {{"sliding_window", nullptr}})).parts.sliding_window, 0);  // null: none
  EXPECT_EQ(read(minimal("mistral", {{"sliding_window", 128}})).parts.sliding_window, 128);
  EXPECT_EQ(read(minimal("phi3")).parts.sliding_window, 0);
  EXPECT_DOUBLE_EQ(read(minimal("phi3")).norm_eps, 1e-5);
  EXPECT_NE(refusal(minimal("mistral", {{"sliding_window", -1}})).find("'sliding_window' must be >= 0"),
            std::string::npos);
  // Qwen2: no window unless use_sliding_window; then the layers from max_window_layers on slide.
  const ModelSpec off = read(minimal("qwen2", {{"sliding_window", 64}}));
  EXPECT_EQ(off.parts.sliding_window, 0);
  EXPECT_TRUE(off.parts.sliding_layers.empty());
  EXPECT_TRUE(off.parts.qkv_bias);
  const ModelSpec on =
      read(minimal("qwen2", {{"use_sliding_window", true}, {"sliding_window", 64}, {"max_window_layers", 1}}));
  EXPECT_EQ(on.parts.sliding_window, 64);
  EXPECT_EQ(on.parts.sliding_layers, (std::vector<bool>{false, true, true, true}));
  // layer_types wins over max_window_layers, and must name every layer with a known kind.
  const json types = json::array({"sliding_attention", "full_attention", "full_attention", "sliding_attention"});
  EXPECT_EQ(read(minimal("qwen2", {{"use_sliding_window", true}, {"max_window_layers", 1}, {"layer_types", types}}))
                .parts.sliding_layers,
            (std::vector<bool>{true, false, false, true}));
  EXPECT_NE(refusal(minimal("qwen2", {{"layer_types", json::array({"full_attention"})}}))
                .find("'layer_types' names 1 layers; num_hidden_layers is 4"),
            std::string::npos);
  EXPECT_NE(refusal(minimal("qwen2", {{"layer_types", json::array({"full_attention", "chunked_attention",
                                                                   "full_attention", "full_attention"})}}))
                .find("'layer_types' holds \"chunked_attention\""),
            std::string::npos);
  // Qwen2's round trip keeps which layers slide.
  const ModelSpec back = read(json::parse(hf_config_json(on)));
  EXPECT_EQ(back.parts.sliding_window, 64);
  EXPECT_EQ(back.parts.sliding_layers, on.parts.sliding_layers);
}

TEST(HfConfig, DynamicLinearAndYarnRopeScalings) {
  // Dynamic NTK extends the context to the factor's multiple and writes the original length back.
  const ModelSpec dyn = read(minimal(
      "llama", {{"max_position_embeddings", 1024}, {"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}}}}));
  EXPECT_EQ(dyn.rope_scaling.type, RopeType::kDynamic);
  EXPECT_EQ(dyn.max_seq_len, 2048);
  EXPECT_EQ(dyn.rope_scaling.original_max_position, 1024);
  const json written = json::parse(hf_config_json(dyn));
  EXPECT_EQ(written["max_position_embeddings"], 1024);
  EXPECT_EQ(read(written).max_seq_len, 2048);
  // A factor of at most 1 does not shrink it.
  EXPECT_EQ(read(minimal("llama",
                         {{"max_position_embeddings", 1024}, {"rope_scaling", {{"type", "dynamic"}, {"factor", 1.0}}}}))
                .max_seq_len,
            1024);
  const ModelSpec lin = read(minimal("llama", {{"rope_scaling", {{"type", "linear"}, {"factor", 4.0}}}}));
  EXPECT_EQ(lin.rope_scaling.type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(lin.rope_scaling.factor, 4.0);
  EXPECT_EQ(lin.max_seq_len, 2048);
  EXPECT_NE(refusal(minimal("llama", {{"rope_scaling", {{"type", "linear"}}}}))
                .find("'rope_scaling.factor' is missing (a number); rope_type 'linear' needs it"),
            std::string::npos);
  EXPECT_NE(refusal(minimal("llama", {{"rope_scaling", {{"type", "linear"}, {"factor", 0.0}}}}))
                .find("'rope_scaling.factor' must be > 0, got 0"),
            std::string::npos);
  // Yarn: each absent key takes transformers' default; the original length defaults to the context.
  const ModelSpec yarn = read(minimal(
      "qwen2",
      {{"max_position_embeddings", 4096},
       {"rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 1024}}}}));
  EXPECT_EQ(yarn.rope_scaling.type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(yarn.rope_scaling.factor, 4.0);
  EXPECT_EQ(yarn.rope_scaling.original_max_position, 1024);
  EXPECT_DOUBLE_EQ(yarn.rope_scaling.beta_fast, 32);
  EXPECT_DOUBLE_EQ(yarn.rope_scaling.beta_slow, 1);
  EXPECT_TRUE(yarn.rope_scaling.truncate);
  EXPECT_DOUBLE_EQ(yarn.rope_scaling.attention_factor, 0);
  EXPECT_EQ(yarn.max_seq_len, 4096);  // yarn does not change the context
  const ModelSpec bare =
      read(minimal("llama", {{"max_position_embeddings", 4096}, {"rope_parameters", {{"rope_type", "yarn"}}}}));
  EXPECT_EQ(bare.rope_scaling.original_max_position, 4096);
  EXPECT_DOUBLE_EQ(bare.rope_scaling.factor, 1.0);  // the context over the original length
  const ModelSpec tuned = read(minimal("llama", {{"rope_scaling",
                                                  {{"rope_type", "yarn"},
                                                   {"factor", 2.0},
                                                   {"beta_fast", 16.0},
                                                   {"beta_slow", 2.0},
                                                   {"mscale", 0.5},
                                                   {"truncate", false},
                                                   {"attention_factor", 1.2}}}}));
  const ModelSpec tuned_back = read(json::parse(hf_config_json(tuned)));
  EXPECT_DOUBLE_EQ(tuned_back.rope_scaling.beta_fast, 16.0);
  EXPECT_DOUBLE_EQ(tuned_back.rope_scaling.beta_slow, 2.0);
  EXPECT_DOUBLE_EQ(tuned_back.rope_scaling.mscale, 0.5);
  EXPECT_FALSE(tuned_back.rope_scaling.truncate);
  EXPECT_DOUBLE_EQ(tuned_back.rope_scaling.attention_factor, 1.2);
  EXPECT_EQ(tuned_back.rope_scaling.original_max_position, tuned.rope_scaling.original_max_position);
  EXPECT_NE(
      refusal(minimal("llama", {{"rope_scaling", {{"rope_type", "yarn"}, {"beta_fast", 0.0}}}})).find("must be > 0"),
      std::string::npos);
  EXPECT_NE(
      refusal(minimal("llama", {{"rope_scaling", {{"rope_type", "yarn"}, {"original_max_position_embeddings", 0}}}}))
          .find("'rope_scaling.original_max_position_embeddings' must be > 0, got 0"),
      std::string::npos);
}

TEST(HfConfig, Gpt2KeysAndTheirDefaults) {
  const json gpt2 = {{"model_type", "gpt2"}, {"n_embd", 64}, {"n_layer", 2}, {"n_head", 4}, {"vocab_size", 256}};
  const ModelSpec s = read(gpt2);
  EXPECT_EQ(s.family, Family::kGpt2);
  EXPECT_EQ(s.d_ff, 256);  // n_inner absent: 4 x n_embd
  EXPECT_EQ(s.max_seq_len, 1024);
  EXPECT_EQ(s.n_kv_head, 4);
  EXPECT_TRUE(s.tie_embeddings);
  EXPECT_DOUBLE_EQ(s.norm_eps, 1e-5);
  EXPECT_EQ(s.parts.act, Activation::kGeluTanh);  // gelu_new
  EXPECT_DOUBLE_EQ(s.parts.query_scale, 0);       // 1 / sqrt(head_dim)
  json unscaled = gpt2;
  unscaled["scale_attn_weights"] = false;
  EXPECT_DOUBLE_EQ(read(unscaled).parts.query_scale, 1.0);
  EXPECT_DOUBLE_EQ(read(json::parse(hf_config_json(read(unscaled)))).parts.query_scale, 1.0);
  json extras = gpt2;  // what GPT2LMHeadModel's configs carry beside the model, and dropout
  extras.update({{"n_ctx", 1024},
                 {"reorder_and_upcast_attn", false},
                 {"summary_type", "cls_index"},
                 {"summary_use_proj", true},
                 {"attn_pdrop", 0.1},
                 {"resid_pdrop", 0.1},
                 {"embd_pdrop", 0.1}});
  EXPECT_EQ(refusal(extras), "");
  EXPECT_NE(refusal(minimal("llama", {{"summary_type", "cls_index"}})).find("unknown key 'summary_type'"),
            std::string::npos);  // only GPT-2's configs may carry the summary head's keys
  json inverse = gpt2;
  inverse["scale_attn_by_inverse_layer_idx"] = true;
  EXPECT_NE(refusal(inverse).find("'scale_attn_by_inverse_layer_idx' is true"), std::string::npos);
  json cross = gpt2;
  cross["add_cross_attention"] = true;
  EXPECT_NE(refusal(cross).find("'add_cross_attention' is true"), std::string::npos);
  json uneven = gpt2;
  uneven["n_head"] = 5;
  EXPECT_NE(refusal(uneven).find("'n_embd' (64) must be divisible by 'n_head' (5)"), std::string::npos);
}

TEST(HfConfig, TokenIdsAreKeptAsTheyWereAndWrittenBack) {
  const ModelSpec s =
      read(minimal("llama", {{"bos_token_id", 1}, {"eos_token_id", {2, 7}}, {"pad_token_id", nullptr}}));
  ASSERT_NE(s.token_ids, "");
  const json ids = json::parse(s.token_ids);
  EXPECT_EQ(ids["bos_token_id"], 1);
  EXPECT_EQ(ids["eos_token_id"], json::array({2, 7}));
  EXPECT_TRUE(ids.contains("pad_token_id") && ids["pad_token_id"].is_null());
  const json written = json::parse(hf_config_json(s, "bfloat16"));
  EXPECT_EQ(written["eos_token_id"], json::array({2, 7}));
  EXPECT_EQ(written["bos_token_id"], 1);
  EXPECT_EQ(written["torch_dtype"], "bfloat16");
  // A spec without ids writes them as null, never a family's default.
  const json none = json::parse(hf_config_json(read(minimal("llama"))));
  EXPECT_TRUE(none["eos_token_id"].is_null());
}

TEST(HfConfig, DropoutIsNotedNotRefusedAndAModelOfOtherShapeIsNamed) {
  const ModelSpec phi = read(minimal("phi3", {{"resid_pdrop", 0.1},
                                              {"embd_pdrop", 0.05},
                                              {"attention_dropout", 0.1},
                                              {"original_max_position_embeddings", 4096}}));
  EXPECT_EQ(phi.d_model, 64);
  EXPECT_NE(refusal(minimal("phi3", {{"resid_pdrop", -0.1}})).find("'resid_pdrop' must be within [0, 1)"),
            std::string::npos);
  // A long value in a message is cut short.
  const std::string long_value = refusal(minimal("llama", {{"hidden_size", std::string(100, '7')}}));
  EXPECT_NE(long_value.find("'hidden_size' must be an integer, got \"" + std::string(36, '7') + "..."),
            std::string::npos)
      << long_value;
  EXPECT_EQ(long_value.find(std::string(50, '7')), std::string::npos) << long_value;
  EXPECT_NE(refusal(minimal("llama", {{"num_attention_heads", 0}})).find("'num_attention_heads' must be > 0, got 0"),
            std::string::npos);
  EXPECT_NE(refusal(minimal("llama", {{"head_dim", -8}})).find("'head_dim' must be > 0, got -8"), std::string::npos);
  EXPECT_NE(refusal(json{{"hidden_size", 64}}).find("model_type '' is not supported yet"), std::string::npos);
}

TEST(HfConfig, AFileThatIsNotAConfigObjectIsRefusedByName) {
  EXPECT_NE(error_of([] { spec_from_hf_config_text("[1, 2]", "c.json"); }).find("c.json: expected a JSON object"),
            std::string::npos);
  EXPECT_NE(error_of([] { spec_from_hf_config_text("{\"model_type\": ", "c.json"); }).find("c.json"),
            std::string::npos);
  test::TempDir dir;
  std::ofstream(dir.file("config.json")) << minimal("mistral").dump();
  EXPECT_EQ(spec_from_hf_config(dir.file("config.json")).family, Family::kMistral);
  EXPECT_NE(error_of([&] { spec_from_hf_config(dir.file("none.json")); }).find(dir.file("none.json")),
            std::string::npos);
}

}  // namespace
}  // namespace tandem
