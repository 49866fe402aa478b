#include "tandem/io/hf.h"

#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "tandem/core/error.h"
#include "tandem/io/fs.h"
#include "tandem/io/safetensors.h"

namespace fs = std::filesystem;

namespace tandem {

std::string hf_config_json(const ModelSpec& s, const std::string& torch_dtype) {
  nlohmann::json j;
  if (s.arch == Arch::kLlama) {
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    j["num_attention_heads"] = s.n_head;
    j["num_key_value_heads"] = s.n_kv_head;
    j["head_dim"] = s.head_dim();
    j["hidden_act"] = "silu";
    j["rope_theta"] = s.rope_theta;
    if (s.rope_scaling.factor > 0) {
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", s.rope_scaling.factor},
                           {"low_freq_factor", s.rope_scaling.low_freq_factor},
                           {"high_freq_factor", s.rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings", s.rope_scaling.original_max_position}};
    } else {
      j["rope_scaling"] = nullptr;
    }
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  } else if (s.arch == Arch::kResNetBk) {
    j["architectures"] = {"TandemResNetBkForCausalLM"};
    j["model_type"] = "tandem_resnet_bk";
    j["num_attention_heads"] = s.n_head;  // BK heads
    j["num_local_experts"] = s.n_experts;
    j["num_experts_per_tok"] = s.top_k;
    j["capacity_factor"] = s.capacity_factor;
    j["router_aux_loss_coef"] = s.moe_aux_weight;
    j["hidden_act"] = "silu";
  } else if (s.arch == Arch::kAmxMoe) {
    j["architectures"] = {"TandemAmxMoeForCausalLM"};
    j["model_type"] = "tandem_amx_moe";
    j["num_dense_layers"] = s.n_dense;
    j["num_local_experts"] = s.n_experts;
    j["num_experts_per_tok"] = s.top_k;
    j["capacity_factor"] = s.capacity_factor;
    j["router_aux_loss_coef"] = s.moe_aux_weight;
    j["hidden_act"] = "gelu (dense), silu (experts)";
  } else {
    j["architectures"] = {"TandemMlpForCausalLM"};
    j["model_type"] = "tandem_mlp";
    j["hidden_act"] = "gelu";
  }
  j["hidden_size"] = s.d_model;
  j["intermediate_size"] = s.d_ff;
  j["num_hidden_layers"] = s.n_layer;
  j["vocab_size"] = s.vocab_size;
  j["max_position_embeddings"] = s.max_seq_len;
  j["rms_norm_eps"] = s.norm_eps;
  j["tie_word_embeddings"] = s.tie_embeddings;
  j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

ModelSpec spec_from_hf_config_text(const std::string& text, const std::string& origin) {
  using nlohmann::json;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse errors, and numbers out of range
    TANDEM_FAIL(origin, ": not valid JSON (", e.what(), ")");
  }
  TANDEM_CHECK(j.is_object(), origin, ": expected a JSON object");
  const std::string type = j.value("model_type", std::string());
  TANDEM_CHECK(type == "llama" || type == "tandem_mlp" || type == "tandem_resnet_bk", origin, ": model_type '", type,
               "' is not supported; --init-from reads LLaMA checkpoints (model_type llama)");
  const auto get_int = [&](const char* key) -> int64_t {
    TANDEM_CHECK(j.contains(key) && j[key].is_number_integer(), origin, ": '", key, "' is missing or not an integer");
    return j[key].get<int64_t>();
  };
  ModelSpec s;
  s.name = "hf";
  s.arch = type == "llama" ? Arch::kLlama : (type == "tandem_resnet_bk" ? Arch::kResNetBk : Arch::kMlp);
  s.d_model = get_int("hidden_size");
  s.d_ff = get_int("intermediate_size");
  s.n_layer = get_int("num_hidden_layers");
  s.vocab_size = get_int("vocab_size");
  s.max_seq_len = j.contains("max_position_embeddings") ? get_int("max_position_embeddings") : 2048;
  s.norm_eps = j.value("rms_norm_eps", 1e-6);
  s.tie_embeddings = j.value("tie_word_embeddings", false);
  if (s.arch == Arch::kResNetBk) {
    s.n_head = get_int("num_attention_heads");
    s.n_kv_head = s.n_head;
    s.n_experts = get_int("num_local_experts");
    s.top_k = get_int("num_experts_per_tok");
    s.capacity_factor = j.value("capacity_factor", 1.25);
    s.moe_aux_weight = j.value("router_aux_loss_coef", 0.01);
  }
  if (s.arch == Arch::kLlama) {
    s.n_head = get_int("num_attention_heads");
    s.n_kv_head = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                      ? get_int("num_key_value_heads")
                      : s.n_head;
    s.rope_theta = j.value("rope_theta", 10000.0);
    const std::string act = j.value("hidden_act", std::string("silu"));
    TANDEM_CHECK(act == "silu", origin, ": hidden_act '", act, "' is not supported (LLaMA uses silu)");
    TANDEM_CHECK(!j.value("attention_bias", false) && !j.value("mlp_bias", false), origin,
                 ": attention_bias/mlp_bias are not supported");
    if (j.contains("head_dim") && !j["head_dim"].is_null())
      TANDEM_CHECK(get_int("head_dim") * s.n_head == s.d_model, origin, ": head_dim ", get_int("head_dim"),
                   " x num_attention_heads ", s.n_head, " != hidden_size ", s.d_model, "; not supported");
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
      const auto& rs = j["rope_scaling"];
      const std::string rt = rs.value("rope_type", rs.value("type", std::string()));
      TANDEM_CHECK(rt == "llama3" || rt == "default", origin, ": rope_scaling type '", rt,
                   "' is not supported (only llama3)");
      if (rt == "llama3") {
        s.rope_scaling.factor = rs.value("factor", 8.0);
        s.rope_scaling.low_freq_factor = rs.value("low_freq_factor", 1.0);
        s.rope_scaling.high_freq_factor = rs.value("high_freq_factor", 4.0);
        s.rope_scaling.original_max_position = rs.value("original_max_position_embeddings", int64_t{8192});
      }
    }
  }
  validate_spec(s);
  return s;
}

ModelSpec spec_from_hf_config(const std::string& path) {
  return spec_from_hf_config_text(read_file(path, "HF config"), path);
}

void load_hf_weights(Model& model, const std::string& dir) {
  const fs::path d(dir);
  const fs::path single = d / "model.safetensors";
  const fs::path index = d / "model.safetensors.index.json";
  std::map<std::string, std::shared_ptr<SafetensorsFile>> files;  // by file name
  std::map<std::string, std::string> weight_map;                  // tensor -> file name
  if (fs::exists(single)) {
    auto f = std::make_shared<SafetensorsFile>(single.string());
    for (const auto& n : f->names()) weight_map[n] = "model.safetensors";
    files["model.safetensors"] = f;
  } else if (fs::exists(index)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_file(index.string(), "safetensors index"));
    } catch (const nlohmann::json::exception& e) {  // parse errors, and numbers out of range
      TANDEM_FAIL(index.string(), ": not valid JSON (", e.what(), ")");
    }
    TANDEM_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), index.string(),
                 ": missing the 'weight_map' object");
    for (const auto& [name, file] : j["weight_map"].items()) {
      TANDEM_CHECK(file.is_string(), index.string(), ": weight_map entry '", name, "' is not a file name");
      const std::string fname = file.get<std::string>();
      TANDEM_CHECK(fname.find('/') == std::string::npos && fname != ".." && !fname.empty(), index.string(),
                   ": shard name '", fname, "' must be a plain file name in the same directory");
      weight_map[name] = fname;
      if (!files.count(fname)) {
        TANDEM_CHECK(fs::exists(d / fname), index.string(), " lists shard '", fname, "' which is missing from ", dir);
        files[fname] = std::make_shared<SafetensorsFile>((d / fname).string());
      }
    }
  } else {
    TANDEM_FAIL("no model.safetensors or model.safetensors.index.json in '", dir,
                "'; --init-from needs an HF directory with safetensors weights (convert .bin checkpoints first)");
  }
  model.load_hf_state_dict(
      [&](const std::string& name) -> std::optional<torch::Tensor> {
        auto it = weight_map.find(name);
        if (it == weight_map.end()) return std::nullopt;
        const auto& f = files.at(it->second);
        TANDEM_CHECK(f->contains(name), f->path(), " does not hold tensor '", name, "' although the index says so");
        return f->tensor(name);
      },
      dir);
}

void save_hf_model(Model& model, const std::string& dir) {
  write_file_synced((fs::path(dir) / "config.json").string(), hf_config_json(model.spec()));
  write_safetensors((fs::path(dir) / "model.safetensors").string(), model.hf_state_dict(), {{"format", "pt"}});
}

}  // namespace tandem
