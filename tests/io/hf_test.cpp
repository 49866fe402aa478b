#include "tandem/io/hf.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "tandem/core/error.h"
#include "tandem/io/safetensors.h"
#include "tandem/models/model.h"

namespace tandem {
namespace {

ModelSpec spec() {
  ModelSpec s = preset_spec("tiny");
  s.n_layer = 2, s.d_model = 32, s.n_head = 4, s.n_kv_head = 2, s.d_ff = 64, s.vocab_size = 100, s.max_seq_len = 32;
  s.tie_embeddings = false;
  return s;
}

void write_text(const std::string& path, const std::string& s) { std::ofstream(path) << s; }

// A sharded HF checkpoint written the way transformers lays it out: config.json, two bf16
// shards, and model.safetensors.index.json mapping every tensor to its shard.
void write_sharded(Model& src, const std::string& dir) {
  write_text(dir + "/config.json", hf_config_json(src.spec(), "bfloat16"));
  std::vector<NamedTensor> a, b;
  nlohmann::json index;
  index["metadata"] = {{"total_size", 0}};
  auto state = src.hf_state_dict();
  for (size_t i = 0; i < state.size(); ++i) {
    auto& [name, t] = state[i];
    const bool first = i < state.size() / 2;
    (first ? a : b).emplace_back(name, t.to(torch::kBFloat16));
    index["weight_map"][name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_safetensors(dir + "/model-00001-of-00002.safetensors", a, {{"format", "pt"}});
  write_safetensors(dir + "/model-00002-of-00002.safetensors", b, {{"format", "pt"}});
  write_text(dir + "/model.safetensors.index.json", index.dump(2));
}

TEST(InitFrom, LoadsAShardedBf16Checkpoint) {
  test::TempDir dir;
  torch::manual_seed(11);
  Model src(spec(), false);
  write_sharded(src, dir.path());
  const ModelSpec read = spec_from_hf_config(dir.file("config.json"));
  EXPECT_EQ(read.n_kv_head, 2);
  EXPECT_EQ(read.vocab_size, 100);
  EXPECT_FALSE(read.tie_embeddings);
  torch::manual_seed(12);
  Model dst(read, false);
  load_hf_weights(dst, dir.path());
  auto s = src.hf_state_dict(), d = dst.hf_state_dict();
  ASSERT_EQ(s.size(), d.size());
  for (size_t i = 0; i < s.size(); ++i) {
    ASSERT_EQ(s[i].first, d[i].first);
    // Exactly the bf16-rounded source weights.
    EXPECT_TRUE(torch::equal(d[i].second, s[i].second.to(torch::kBFloat16).to(torch::kFloat32))) << s[i].first;
  }
  // And the loaded model computes what the source computes on bf16-rounded weights.
  auto tokens = torch::randint(0, 100, {2, 8}, torch::kInt64);
  // (Only the real vocabulary columns: padding rows are not part of a checkpoint.)
  EXPECT_TRUE(test::AllClose(dst.forward(tokens).narrow(-1, 0, 100), src.forward(tokens).narrow(-1, 0, 100), 0.0, 0.1));
}

TEST(InitFrom, MismatchNamesTheFirstTensorThatDiffers) {
  test::TempDir dir;
  Model src(spec(), false);
  write_sharded(src, dir.path());
  ModelSpec other = spec();
  other.d_ff = 96;
  Model dst(other, false);
  try {
    load_hf_weights(dst, dir.path());
    FAIL() << "expected a shape error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.mlp.gate_proj.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[64, 32]"), std::string::npos) << e.what();
  }
  ModelSpec deeper = spec();
  deeper.n_layer = 3;
  Model dst2(deeper, false);
  try {
    load_hf_weights(dst2, dir.path());
    FAIL() << "expected a missing-tensor error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.2."), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
}

TEST(InitFrom, BadDirectoriesAndConfigs) {
  test::TempDir dir;
  Model m(spec(), false);
  EXPECT_THROW(load_hf_weights(m, dir.path()), UserError);
  EXPECT_THROW(spec_from_hf_config(dir.file("config.json")), UserError);
  EXPECT_THROW(spec_from_hf_config_text(R"({"model_type": "gpt2"})", "c"), UserError);
  EXPECT_THROW(spec_from_hf_config_text(R"({"model_type": "llama", "hidden_size": 64})", "c"), UserError);
  write_text(dir.file("model.safetensors.index.json"), R"({"weight_map": {"a": "../evil.safetensors"}})");
  EXPECT_THROW(load_hf_weights(m, dir.path()), UserError);
}

TEST(HfConfig, RoundTripsAndReadsLlama3RopeScaling) {
  ModelSpec s = spec();
  const ModelSpec back = spec_from_hf_config_text(hf_config_json(s), "x");
  EXPECT_EQ(back.d_model, s.d_model);
  EXPECT_EQ(back.n_head, s.n_head);
  EXPECT_EQ(back.n_kv_head, s.n_kv_head);
  EXPECT_EQ(back.d_ff, s.d_ff);
  const ModelSpec l3 = spec_from_hf_config_text(
      R"({"model_type":"llama","hidden_size":64,"intermediate_size":128,"num_hidden_layers":1,"num_attention_heads":4,
          "num_key_value_heads":1,"vocab_size":128256,"max_position_embeddings":64,"rope_theta":500000.0,
          "rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
          "original_max_position_embeddings":8192},"tie_word_embeddings":true})",
      "l3");
  EXPECT_DOUBLE_EQ(l3.rope_scaling.factor, 8.0);
  EXPECT_TRUE(l3.tie_embeddings);
  EXPECT_EQ(l3.padded_vocab(), 128256);
  Model m(l3, false);  // the scaled RoPE table builds and runs
  auto out = m.forward(torch::randint(0, 1000, {1, 16}, torch::kInt64));
  EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
}

}  // namespace
}  // namespace tandem
