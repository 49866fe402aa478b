#include "tandem/io/hf.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "tandem/core/error.h"
#include "tandem/formats/safetensors.h"
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

// A LLaMA config.json as transformers 5.x writes it (save_pretrained of a LlamaConfig).
nlohmann::json llama_v5() {
  return nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 1, "dtype": "float32", "eos_token_id": 2, "head_dim": 16, "hidden_act": "silu",
    "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128, "max_position_embeddings": 16384,
    "mlp_bias": false, "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "pad_token_id": null, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_parameters": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                        "original_max_position_embeddings": 8192, "rope_theta": 500000.0, "rope_type": "llama3"},
    "tie_word_embeddings": false, "transformers_version": "5.24.0", "use_cache": true, "vocab_size": 100})");
}

// The same model as transformers 4.x writes it: top-level rope_theta and rope_scaling.
nlohmann::json llama_v4() {
  auto j = llama_v5();
  j.erase("rope_parameters");
  j.erase("dtype");
  j["torch_dtype"] = "float32";
  j["transformers_version"] = "4.57.6";
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = {{"factor", 8.0},
                       {"high_freq_factor", 4.0},
                       {"low_freq_factor", 1.0},
                       {"original_max_position_embeddings", 8192},
                       {"rope_type", "llama3"}};
  return j;
}

std::string error_for(const nlohmann::json& config) {
  return test::error_of([&] { spec_from_hf_config_text(config.dump(), "ckpt/config.json"); });
}

// `config` with the value at `path` ("a" or "a.b") replaced, or removed when `value` is discarded.
nlohmann::json with(nlohmann::json config, const std::string& path,
                    const nlohmann::json& value = nlohmann::json::value_t::discarded) {
  const auto dot = path.find('.');
  auto& target = dot == std::string::npos ? config : config[path.substr(0, dot)];
  const std::string key = dot == std::string::npos ? path : path.substr(dot + 1);
  if (value.is_discarded())
    target.erase(key);
  else
    target[key] = value;
  return config;
}

void expect_same_spec(const ModelSpec& a, const ModelSpec& b, const std::string& what) {
  EXPECT_EQ(a.arch, b.arch) << what;
  EXPECT_EQ(a.n_layer, b.n_layer) << what;
  EXPECT_EQ(a.d_model, b.d_model) << what;
  EXPECT_EQ(a.n_head, b.n_head) << what;
  EXPECT_EQ(a.n_kv_head, b.n_kv_head) << what;
  EXPECT_EQ(a.d_ff, b.d_ff) << what;
  EXPECT_EQ(a.vocab_size, b.vocab_size) << what;
  EXPECT_EQ(a.max_seq_len, b.max_seq_len) << what;
  EXPECT_EQ(a.tie_embeddings, b.tie_embeddings) << what;
  EXPECT_EQ(a.rope_theta, b.rope_theta) << what;
  EXPECT_EQ(a.norm_eps, b.norm_eps) << what;
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor) << what;
  EXPECT_EQ(a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor) << what;
  EXPECT_EQ(a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor) << what;
  EXPECT_EQ(a.rope_scaling.original_max_position, b.rope_scaling.original_max_position) << what;
  EXPECT_EQ(a.n_experts, b.n_experts) << what;
  EXPECT_EQ(a.top_k, b.top_k) << what;
  EXPECT_EQ(a.n_dense, b.n_dense) << what;
  EXPECT_EQ(a.capacity_factor, b.capacity_factor) << what;
  EXPECT_EQ(a.moe_aux_weight, b.moe_aux_weight) << what;
}

TEST(HfConfig, BothRopeLayoutsGiveTheSameSpec) {
  const ModelSpec v5 = spec_from_hf_config_text(llama_v5().dump(), "v5");
  EXPECT_EQ(v5.rope_theta, 500000.0);
  EXPECT_EQ(v5.rope_scaling.factor, 8.0);
  EXPECT_EQ(v5.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(v5.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(v5.rope_scaling.original_max_position, 8192);
  EXPECT_EQ(v5.n_kv_head, 2);
  EXPECT_EQ(v5.norm_eps, 1e-5);
  auto legacy_type = llama_v4();  // transformers 4.x before rope_type: "type"
  legacy_type["rope_scaling"].erase("rope_type");
  legacy_type["rope_scaling"]["type"] = "llama3";
  auto both_thetas = llama_v5();  // the same theta twice agrees
  both_thetas["rope_theta"] = 500000;
  auto theta_outside = llama_v5();  // 5.x takes a top-level rope_theta into rope_parameters
  theta_outside["rope_parameters"].erase("rope_theta");
  theta_outside["rope_theta"] = 500000.0;
  const std::vector<std::pair<std::string, nlohmann::json>> layouts = {
      {"4.x rope_theta + rope_scaling", llama_v4()},
      {"4.x rope_scaling.type", legacy_type},
      {"5.x rope_parameters + equal rope_theta", both_thetas},
      {"5.x rope_parameters without rope_theta", theta_outside},
      {"tandem's own config.json", nlohmann::json::parse(hf_config_json(v5))}};
  for (const auto& [what, config] : layouts) expect_same_spec(spec_from_hf_config_text(config.dump(), what), v5, what);

  // Default RoPE: theta from rope_parameters (not the 10000 fallback), no scaling.
  auto plain = llama_v5();
  plain["rope_parameters"] = {{"rope_theta", 1000000.0}, {"rope_type", "default"}};
  const ModelSpec d5 = spec_from_hf_config_text(plain.dump(), "plain v5");
  EXPECT_EQ(d5.rope_theta, 1000000.0);
  EXPECT_EQ(d5.rope_scaling.factor, 0.0);
  auto plain4 = llama_v4();
  plain4["rope_theta"] = 1000000.0;
  plain4["rope_scaling"] = nullptr;
  expect_same_spec(spec_from_hf_config_text(plain4.dump(), "plain v4"), d5, "plain v4");
  // Without original_max_position_embeddings, llama3 scaling uses max_position_embeddings (as 5.x does).
  EXPECT_EQ(spec_from_hf_config_text(with(llama_v5(), "rope_parameters.original_max_position_embeddings").dump(), "x")
                .rope_scaling.original_max_position,
            16384);
  // Keys whose None is the default, and metadata that does not change the model.
  auto extras = llama_v5();
  for (const char* key : {"num_key_value_heads", "head_dim", "attention_dropout", "quantization_config", "rope_scaling",
                          "pretraining_tp", "dtype", "torch_dtype"})
    extras[key] = nullptr;
  extras["pretraining_tp"] = 2;
  extras["_name_or_path"] = "meta-llama/Llama-3.2-1B";
  extras["pruned_heads"] = nlohmann::json::object();
  extras["id2label"] = {{"0", "LABEL_0"}};
  extras["max_length"] = 20;
  const ModelSpec e = spec_from_hf_config_text(extras.dump(), "extras");
  EXPECT_EQ(e.n_kv_head, 4);
  EXPECT_EQ(e.rope_theta, 500000.0);
}

TEST(HfConfig, ReadsEveryKeyOfTransformers4FullDump) {
  // LlamaConfig(...).to_dict() of transformers 4.57: every attribute, generation defaults included.
  const auto full = nlohmann::json::parse(R"({
    "_name_or_path": "", "add_cross_attention": false, "architectures": ["LlamaForCausalLM"],
    "attention_bias": false, "attention_dropout": 0.0, "bad_words_ids": null, "begin_suppress_tokens": null,
    "bos_token_id": 1, "chunk_size_feed_forward": 0, "cross_attention_hidden_size": null,
    "decoder_start_token_id": null, "diversity_penalty": 0.0, "do_sample": false, "dtype": null,
    "early_stopping": false, "encoder_no_repeat_ngram_size": 0, "eos_token_id": 2,
    "exponential_decay_length_penalty": null, "finetuning_task": null, "forced_bos_token_id": null,
    "forced_eos_token_id": null, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64,
    "id2label": {"0": "LABEL_0", "1": "LABEL_1"}, "initializer_range": 0.02, "intermediate_size": 128,
    "is_decoder": false, "is_encoder_decoder": false, "label2id": {"LABEL_0": 0, "LABEL_1": 1},
    "length_penalty": 1.0, "max_length": 20, "max_position_embeddings": 16384, "min_length": 0,
    "mlp_bias": false, "model_type": "llama", "no_repeat_ngram_size": 0, "num_attention_heads": 4,
    "num_beam_groups": 1, "num_beams": 1, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "num_return_sequences": 1, "output_attentions": false, "output_hidden_states": false, "output_scores": false,
    "pad_token_id": null, "prefix": null, "pretraining_tp": 1, "problem_type": null, "pruned_heads": {},
    "remove_invalid_values": false, "repetition_penalty": 1.0, "return_dict": true,
    "return_dict_in_generate": false, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "sep_token_id": null, "suppress_tokens": null, "task_specific_params": null,
    "temperature": 1.0, "tf_legacy_loss": false, "tie_encoder_decoder": false, "tie_word_embeddings": false,
    "tokenizer_class": null, "top_k": 50, "top_p": 1.0, "torchscript": false, "transformers_version": "4.57.6",
    "typical_p": 1.0, "use_bfloat16": false, "use_cache": true, "vocab_size": 100})");
  expect_same_spec(spec_from_hf_config_text(full.dump(), "full"), spec_from_hf_config_text(llama_v5().dump(), "v5"),
                   "4.57 full dump");
}

TEST(HfConfig, TandemTypesRoundTrip) {
  for (const char* preset : {"mlp", "bk-tiny", "amx-moe-tiny", "tiny"}) {
    ModelSpec s = preset_spec(preset);
    s.name = "hf";
    expect_same_spec(spec_from_hf_config_text(hf_config_json(s), preset), s, preset);
  }
  ModelSpec l3 = spec();
  l3.rope_theta = 500000.0;
  l3.rope_scaling = {RopeType::kLlama3, 8.0, 1.0, 4.0, 8192};
  expect_same_spec(spec_from_hf_config_text(hf_config_json(l3, "bfloat16"), "l3"), l3, "l3");
}

struct ConfigCase {
  std::string what;
  nlohmann::json config;
  std::string key;       // the key the message must name
  std::string expected;  // and what else it must say
};

void expect_refused(const std::vector<ConfigCase>& cases) {
  for (const auto& c : cases) {
    const std::string message = error_for(c.config);
    EXPECT_NE(message.find("ckpt/config.json: "), std::string::npos) << c.what << ": " << message;
    EXPECT_NE(message.find("'" + c.key + "'"), std::string::npos) << c.what << ": " << message;
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.what << ": " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << c.what << ": " << message;
  }
}

TEST(HfConfig, WrongTypesNameTheKeyAndTheType) {
  const auto v5 = llama_v5(), v4 = llama_v4();
  auto bk = nlohmann::json::parse(hf_config_json(preset_spec("bk-tiny")));
  auto amx = nlohmann::json::parse(hf_config_json(preset_spec("amx-moe-tiny")));
  const std::string integer = "must be an integer", number = "must be a number", boolean = "must be true or false",
                    string = "must be a string", object = "must be an object";
  std::vector<ConfigCase> cases;
  const auto add = [&](const nlohmann::json& base, const std::string& path, const nlohmann::json& value,
                       const std::string& expected) {
    cases.push_back({path + " = " + value.dump(), with(base, path, value), path, expected});
  };
  add(v5, "model_type", 3, string);
  add(v5, "hidden_size", "64", integer);
  add(v5, "intermediate_size", nullptr, integer);
  add(v5, "num_hidden_layers", true, integer);
  add(v5, "vocab_size", 1e30, integer);
  add(v5, "vocab_size", nlohmann::json(uint64_t{18446744073709551615ull}), integer);
  add(v5, "num_attention_heads", 4.0, integer);
  add(v5, "num_key_value_heads", 1.5, integer);
  add(v5, "head_dim", "16", integer);
  add(v5, "max_position_embeddings", nlohmann::json::object(), integer);
  add(v5, "rms_norm_eps", "x", number);
  add(v5, "rms_norm_eps", nullptr, number);
  add(v5, "tie_word_embeddings", "yes", boolean);
  add(v5, "tie_word_embeddings", 1, boolean);
  add(v5, "attention_bias", 0, boolean);
  add(v5, "mlp_bias", "false", boolean);
  add(v5, "attention_dropout", "0", number);
  add(v5, "hidden_act", 3, string);
  add(v5, "pretraining_tp", 1.0, integer);
  add(v5, "dtype", true, string);
  add(v4, "torch_dtype", 32, string);
  add(v5, "quantization_config", "fp8", object);
  add(v5, "pruned_heads", nlohmann::json::array(), object);
  add(v5, "partial_rotary_factor", "1", number);
  add(v5, "rope_parameters", nlohmann::json::array(), object);
  add(v5, "rope_parameters.rope_theta", "500000", number);
  add(v5, "rope_parameters.rope_type", 3, string);
  add(v5, "rope_parameters.factor", "8", number);
  add(v5, "rope_parameters.low_freq_factor", nullptr, number);
  add(v5, "rope_parameters.high_freq_factor", nlohmann::json::array(), number);
  add(v5, "rope_parameters.original_max_position_embeddings", 8192.5, integer);
  add(v5, "rope_parameters.partial_rotary_factor", false, number);
  add(v4, "rope_theta", nlohmann::json::array(), number);
  add(v4, "rope_theta", nullptr, number);
  add(v4, "rope_scaling", "llama3", object);
  add(v4, "rope_scaling.type", 1, string);
  add(v4, "rope_scaling.factor", true, number);
  add(bk, "num_attention_heads", "8", integer);
  add(bk, "num_local_experts", "8", integer);
  add(bk, "num_experts_per_tok", 2.5, integer);
  add(bk, "capacity_factor", "1.25", number);
  add(bk, "router_aux_loss_coef", nullptr, number);
  add(bk, "hidden_act", false, string);
  add(amx, "num_dense_layers", 2.5, integer);
  add(amx, "num_local_experts", nlohmann::json::array(), integer);
  add(amx, "num_experts_per_tok", "2", integer);
  add(amx, "capacity_factor", "x", number);
  add(amx, "router_aux_loss_coef", nlohmann::json::array(), number);
  add(amx, "tie_word_embeddings", "true", boolean);
  expect_refused(cases);
  // What the message says in full.
  EXPECT_EQ(error_for(with(v5, "tie_word_embeddings", "yes")),
            R"(ckpt/config.json: 'tie_word_embeddings' must be true or false, got "yes")");
}

TEST(HfConfig, RefusesWhatTandemDoesNotImplement) {
  const auto v5 = llama_v5(), v4 = llama_v4();
  const std::string remove = "remove it from ckpt/config.json if it does not change the model";
  std::vector<ConfigCase> cases;
  for (const char* type : {"longrope", "su", "proportional"}) {
    cases.push_back({std::string("5.x rope_type ") + type, with(v5, "rope_parameters.rope_type", type),
                     "rope_parameters.rope_type", std::string("'") + type + "' is not supported"});
    auto legacy = v4;
    legacy["rope_scaling"] = {{"type", type}, {"factor", 2.0}};
    cases.push_back(
        {std::string("4.x type ") + type, legacy, "rope_scaling.type", std::string("'") + type + "' is not supported"});
  }
  cases.push_back({"relu", with(v5, "hidden_act", "relu"), "hidden_act", "gelu_pytorch_tanh"});
  cases.push_back(
      {"partial rotary above 1", with(v4, "partial_rotary_factor", 1.5), "partial_rotary_factor", "within (0, 1]"});
  cases.push_back({"odd rotary dimension", with(v4, "partial_rotary_factor", 0.3125), "partial_rotary_factor", "even"});
  cases.push_back({"dropout of 1", with(v5, "attention_dropout", 1.0), "attention_dropout", "within [0, 1)"});
  cases.push_back(
      {"quantized", with(v5, "quantization_config", {{"quant_method", "fp8"}}), "quantization_config", "dequantize"});
  cases.push_back({"heads", with(v5, "num_attention_heads", 5), "num_attention_heads", "divisible"});
  cases.push_back({"kv heads", with(v5, "num_key_value_heads", 3), "num_key_value_heads", "divisible"});
  cases.push_back({"pruned", with(v5, "pruned_heads", {{"0", {1}}}), "pruned_heads", "pruned"});
  cases.push_back({"unknown key", with(v5, "sliding_window", 4096), "sliding_window", remove});
  cases.push_back({"remote code", with(v5, "auto_map", {{"AutoModel", "x.Model"}}), "auto_map", remove});
  cases.push_back(
      {"misspelt key", with(v5, "rms_norm_epsilon", 1e-5), "rms_norm_epsilon", "did you mean 'rms_norm_eps'?"});
  cases.push_back({"yarn key under llama3", with(v5, "rope_parameters.beta_fast", 32), "rope_parameters.beta_fast",
                   "rope_type 'llama3' does not use it"});
  auto default_with_factor = v5;
  default_with_factor["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"factor", 2.0}};
  cases.push_back({"factor of default rope", default_with_factor, "rope_parameters.factor", "does not use it"});
  cases.push_back({"llama3 without factor", with(v5, "rope_parameters.factor"), "rope_parameters.factor", "missing"});
  cases.push_back({"llama3 high <= low", with(v5, "rope_parameters.high_freq_factor", 1.0),
                   "rope_parameters.high_freq_factor", "must exceed"});
  cases.push_back({"conflicting theta", with(v5, "rope_theta", 10000.0), "rope_parameters.rope_theta", "keep one"});
  cases.push_back({"conflicting theta 4.x", with(v4, "rope_scaling.rope_theta", 10000.0), "rope_theta", "keep one"});
  cases.push_back({"conflicting type", with(v4, "rope_scaling.type", "linear"), "rope_scaling.type", "keep one"});
  cases.push_back({"both layouts", with(v5, "rope_scaling", v4["rope_scaling"]), "rope_parameters", "keep one"});
  cases.push_back(
      {"another family", with(v5, "model_type", "mamba"), "mamba", "qwen2, mistral, gemma, gemma2, phi3, gpt2"});
  cases.push_back({"llama key in a tandem type",
                   with(nlohmann::json::parse(hf_config_json(preset_spec("bk-tiny"))), "rope_theta", 10000.0),
                   "rope_theta", remove});
  cases.push_back({"act of the MLP",
                   with(nlohmann::json::parse(hf_config_json(preset_spec("mlp"))), "hidden_act", "silu"), "hidden_act",
                   "gelu"});
  expect_refused(cases);
  // Shapes out of range: the spec's own check, prefixed with the file.
  const std::string layers = error_for(with(v5, "num_hidden_layers", 0));
  EXPECT_EQ(layers.rfind("ckpt/config.json: model.n_layer", 0), 0u) << layers;
}

}  // namespace
}  // namespace tandem
