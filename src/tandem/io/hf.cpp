#include "tandem/io/hf.h"

#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "tandem/core/error.h"
#include "tandem/core/fs.h"
#include "tandem/core/strings.h"
#include "tandem/io/json_text.h"
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

namespace {

using nlohmann::json;

// Note [HF config keys]
// config.json is read key by key through ConfigObject, which checks each value's JSON type (a
// UserError naming the file, the key and the type expected) and remembers which keys were read.
// A key left unread must be metadata that does not change what the model computes (kMetadataKeys:
// what transformers 4.x and 5.x write beside the architecture, generation defaults of old 4.x
// files included); any other key is refused rather than ignored, since ignoring a key whose
// meaning tandem does not implement would build a different model than transformers builds.
// RoPE comes in two layouts: transformers 4.x writes top-level rope_theta and rope_scaling
// ({"rope_type" or "type", factor, ...}), 5.x writes rope_parameters ({rope_theta, rope_type,
// factor, ...}); both are read, and a value given twice must agree.

// clang-format off
const std::set<std::string> kMetadataKeys = {
    "_attn_implementation_autoset", "_name_or_path", "add_cross_attention", "architectures", "bad_words_ids",
    "begin_suppress_tokens", "bos_token_id", "chunk_size_feed_forward", "cross_attention_hidden_size",
    "decoder_start_token_id", "diversity_penalty", "do_sample", "early_stopping", "encoder_no_repeat_ngram_size",
    "eos_token_id", "exponential_decay_length_penalty", "finetuning_task", "forced_bos_token_id",
    "forced_eos_token_id", "gradient_checkpointing", "id2label", "initializer_range", "is_decoder",
    "is_encoder_decoder", "label2id", "length_penalty", "max_length", "min_length", "no_repeat_ngram_size",
    "num_beam_groups", "num_beams", "num_return_sequences", "output_attentions", "output_hidden_states",
    "output_scores", "pad_token_id", "prefix", "problem_type", "remove_invalid_values", "repetition_penalty",
    "return_dict", "return_dict_in_generate", "sep_token_id", "suppress_tokens", "task_specific_params",
    "temperature", "tf_legacy_loss", "tie_encoder_decoder", "tokenizer_class", "top_k", "top_p", "torchscript",
    "transformers_version", "typical_p", "use_bfloat16", "use_cache"};
// clang-format on

/// What a JSON null means for a key: the key's default (transformers allows None there) or a
/// value of the wrong type.
enum class NullIs { kWrongType, kAbsent };

/// A value for an error message: compact JSON, cut short.
std::string shown(const json& v) {
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

/// One JSON object of a config file, read with type checks (Note [HF config keys]).
class ConfigObject {
 public:
  ConfigObject(const json& object, std::string origin, std::string prefix)
      : object_(object), origin_(std::move(origin)), prefix_(std::move(prefix)) {}

  /// The key as messages name it ("rope_parameters.factor").
  std::string name(const std::string& key) const { return prefix_ + key; }

  std::optional<int64_t> integer(const std::string& key, NullIs null = NullIs::kWrongType) {
    const json* v = find(key, null, "an integer");
    if (!v) return std::nullopt;
    // Unsigned only when above int64's range; negative integers are signed.
    const bool fits = v->is_number_integer() && !(v->is_number_unsigned() && v->get<uint64_t>() > INT64_MAX);
    if (!fits) wrong_type(key, *v, "an integer");
    return v->get<int64_t>();
  }
  int64_t required_integer(const std::string& key) {
    const auto v = integer(key);
    TANDEM_CHECK(v, origin_, ": '", name(key), "' is missing (an integer)");
    return *v;
  }
  std::optional<double> number(const std::string& key, NullIs null = NullIs::kWrongType) {
    const json* v = find(key, null, "a number");
    if (!v) return std::nullopt;
    if (!v->is_number()) wrong_type(key, *v, "a number");
    return v->get<double>();
  }
  double required_number(const std::string& key, const std::string& why) {
    const auto v = number(key);
    TANDEM_CHECK(v, origin_, ": '", name(key), "' is missing (a number); ", why);
    return *v;
  }
  std::optional<bool> boolean(const std::string& key, NullIs null = NullIs::kWrongType) {
    const json* v = find(key, null, "true or false");
    if (!v) return std::nullopt;
    if (!v->is_boolean()) wrong_type(key, *v, "true or false");
    return v->get<bool>();
  }
  std::optional<std::string> string(const std::string& key, NullIs null = NullIs::kWrongType) {
    const json* v = find(key, null, "a string");
    if (!v) return std::nullopt;
    if (!v->is_string()) wrong_type(key, *v, "a string");
    return v->get<std::string>();
  }
  /// The nested object, or nullptr when absent (or null, with NullIs::kAbsent).
  const json* object(const std::string& key, NullIs null = NullIs::kWrongType) {
    const json* v = find(key, null, "an object");
    if (v && !v->is_object()) wrong_type(key, *v, "an object");
    return v;
  }
  /// Refuses the first key that was not read and is not in `allowed`.
  void refuse_unread(const std::set<std::string>& allowed, const std::string& why) const {
    for (const auto& [key, value] : object_.items()) {
      if (read_.count(key) || allowed.count(key)) continue;
      const std::string near = closest_match(key, std::vector<std::string>(read_.begin(), read_.end()));
      TANDEM_FAIL(origin_, ": unknown key '", name(key), "'",
                  near.empty() ? "" : " (did you mean '" + name(near) + "'?)", "; ", why);
    }
  }

 private:
  const json* find(const std::string& key, NullIs null, const char* expected) {
    read_.insert(key);
    const auto it = object_.find(key);
    if (it == object_.end()) return nullptr;
    if (it->is_null()) {
      if (null == NullIs::kAbsent) return nullptr;
      wrong_type(key, *it, expected);
    }
    return &*it;
  }
  [[noreturn]] void wrong_type(const std::string& key, const json& v, const char* expected) const {
    TANDEM_FAIL(origin_, ": '", name(key), "' must be ", expected, ", got ", shown(v));
  }

  const json& object_;
  std::string origin_, prefix_;
  std::set<std::string> read_;
};

/// RoPE settings from either layout (Note [HF config keys]) into `s` (rope_theta, rope_scaling).
void read_rope(ConfigObject& cfg, ModelSpec& s, const std::string& origin) {
  const json* scaling = cfg.object("rope_scaling", NullIs::kAbsent);
  const json* parameters = cfg.object("rope_parameters", NullIs::kAbsent);
  TANDEM_CHECK(!(scaling && parameters), origin,
               ": both 'rope_scaling' (transformers 4.x) and 'rope_parameters' (transformers 5.x) are set; keep "
               "one (transformers then reads only rope_scaling)");
  // Each value with the key it came from, for messages.
  std::optional<double> theta = cfg.number("rope_theta");
  std::optional<double> partial = cfg.number("partial_rotary_factor");
  std::string theta_key = "rope_theta", partial_key = "partial_rotary_factor";
  if (scaling || parameters) {
    const std::string where = scaling ? "rope_scaling" : "rope_parameters";
    ConfigObject rope(scaling ? *scaling : *parameters, origin, where + ".");
    // A value given both at the top level and inside the RoPE object must agree.
    const auto merge = [&](std::optional<double>& top, std::string& top_key) {
      const std::string key = top_key;
      const auto inner = rope.number(key);
      TANDEM_CHECK(!(top && inner && *top != *inner), origin, ": '", key, "' is ", top.value_or(0.0), " but '",
                   rope.name(key), "' is ", inner.value_or(0.0), "; keep one of them");
      if (inner) top = inner, top_key = rope.name(key);
    };
    merge(theta, theta_key);
    merge(partial, partial_key);
    const auto rope_type = rope.string("rope_type");
    const auto legacy_type = rope.string("type");  // transformers 4.x's older spelling
    TANDEM_CHECK(!(rope_type && legacy_type && *rope_type != *legacy_type), origin, ": '", rope.name("rope_type"),
                 "' is '", rope_type.value_or(""), "' but '", rope.name("type"), "' is '", legacy_type.value_or(""),
                 "'; keep one of them");
    const std::string type = rope_type ? *rope_type : legacy_type.value_or("default");
    TANDEM_CHECK(type == "default" || type == "llama3", origin, ": '", rope.name(rope_type ? "rope_type" : "type"),
                 "' '", type,
                 "' is not supported; tandem implements the default RoPE and Llama 3.1's 'llama3' scaling (convert "
                 "the checkpoint or train a model of a supported kind)");
    if (type == "llama3") {
      const std::string why = "rope_type 'llama3' needs factor, low_freq_factor and high_freq_factor";
      auto& rs = s.rope_scaling;
      rs.factor = rope.required_number("factor", why);
      rs.low_freq_factor = rope.required_number("low_freq_factor", why);
      rs.high_freq_factor = rope.required_number("high_freq_factor", why);
      // transformers 5.x falls back to max_position_embeddings when the original length is not given.
      rs.original_max_position = rope.integer("original_max_position_embeddings").value_or(s.max_seq_len);
      TANDEM_CHECK(rs.factor > 0, origin, ": '", rope.name("factor"), "' must be > 0, got ", rs.factor);
      TANDEM_CHECK(rs.low_freq_factor > 0 && rs.high_freq_factor > rs.low_freq_factor, origin, ": '",
                   rope.name("high_freq_factor"), "' (", rs.high_freq_factor, ") must exceed '",
                   rope.name("low_freq_factor"), "' (", rs.low_freq_factor, "), which must be > 0");
      TANDEM_CHECK(rs.original_max_position > 0, origin, ": '", rope.name("original_max_position_embeddings"),
                   "' must be > 0, got ", rs.original_max_position);
    }
    rope.refuse_unread({}, "rope_type '" + type + "' does not use it; remove it from config.json");
  }
  s.rope_theta = theta.value_or(10000.0);
  TANDEM_CHECK(s.rope_theta > 0, origin, ": '", theta_key, "' must be > 0, got ", s.rope_theta);
  TANDEM_CHECK(partial.value_or(1.0) == 1.0, origin, ": '", partial_key, "' ", partial.value_or(1.0),
               " is not supported; tandem rotates the whole head (partial_rotary_factor 1)");
}

/// The LLaMA keys (model_type llama) into `s`; Note [HF config keys].
void read_llama(ConfigObject& cfg, ModelSpec& s, const std::string& origin) {
  s.n_head = cfg.required_integer("num_attention_heads");
  TANDEM_CHECK(s.n_head > 0 && s.d_model % s.n_head == 0, origin, ": 'hidden_size' (", s.d_model,
               ") must be divisible by 'num_attention_heads' (", s.n_head, ")");
  s.n_kv_head = cfg.integer("num_key_value_heads", NullIs::kAbsent).value_or(s.n_head);
  TANDEM_CHECK(s.n_kv_head > 0 && s.n_head % s.n_kv_head == 0, origin, ": 'num_attention_heads' (", s.n_head,
               ") must be divisible by 'num_key_value_heads' (", s.n_kv_head, ")");
  if (const auto head_dim = cfg.integer("head_dim", NullIs::kAbsent))
    TANDEM_CHECK(*head_dim == s.d_model / s.n_head, origin, ": 'head_dim' ", *head_dim,
                 " differs from hidden_size / num_attention_heads = ", s.d_model / s.n_head,
                 "; tandem's attention has head_dim = hidden_size / num_attention_heads");
  const std::string act = cfg.string("hidden_act").value_or("silu");
  TANDEM_CHECK(act == "silu", origin, ": 'hidden_act' '", act, "' is not supported; tandem's LLaMA uses silu");
  for (const char* key : {"attention_bias", "mlp_bias"})
    TANDEM_CHECK(!cfg.boolean(key).value_or(false), origin, ": '", key,
                 "' is true; tandem's LLaMA layers have no biases (a checkpoint with biases cannot be loaded)");
  const double dropout = cfg.number("attention_dropout", NullIs::kAbsent).value_or(0.0);
  TANDEM_CHECK(dropout == 0, origin, ": 'attention_dropout' ", dropout,
               " is not supported; tandem has no attention dropout (set it to 0.0 to train without)");
  if (const auto tp = cfg.integer("pretraining_tp", NullIs::kAbsent))  // split matmuls: the same function
    TANDEM_CHECK(*tp >= 1, origin, ": 'pretraining_tp' must be >= 1, got ", *tp);
  if (const json* pruned = cfg.object("pruned_heads", NullIs::kAbsent))
    TANDEM_CHECK(pruned->empty(), origin, ": 'pruned_heads' is not empty; tandem cannot load pruned attention");
  read_rope(cfg, s, origin);
}

/// The MoE keys that tandem's own MoE types write (hf_config_json).
void read_moe(ConfigObject& cfg, ModelSpec& s) {
  s.n_experts = cfg.required_integer("num_local_experts");
  s.top_k = cfg.required_integer("num_experts_per_tok");
  s.capacity_factor = cfg.number("capacity_factor").value_or(1.25);
  s.moe_aux_weight = cfg.number("router_aux_loss_coef").value_or(0.01);
}

}  // namespace

ModelSpec spec_from_hf_config_text(const std::string& text, const std::string& origin) {
  const json j = parse_json_text(text, origin);
  TANDEM_CHECK(j.is_object(), origin, ": expected a JSON object");
  ConfigObject cfg(j, origin, "");
  const std::string type = cfg.string("model_type").value_or("");
  const std::map<std::string, Arch> types = {{"llama", Arch::kLlama},
                                             {"tandem_mlp", Arch::kMlp},
                                             {"tandem_resnet_bk", Arch::kResNetBk},
                                             {"tandem_amx_moe", Arch::kAmxMoe}};
  TANDEM_CHECK(types.count(type), origin, ": model_type '", type,
               "' is not supported; --init-from reads LLaMA checkpoints (model_type llama)");
  ModelSpec s;
  s.name = "hf";
  s.arch = types.at(type);
  s.d_model = cfg.required_integer("hidden_size");
  s.d_ff = cfg.required_integer("intermediate_size");
  s.n_layer = cfg.required_integer("num_hidden_layers");
  s.vocab_size = cfg.required_integer("vocab_size");
  s.max_seq_len = cfg.integer("max_position_embeddings").value_or(2048);
  s.norm_eps = cfg.number("rms_norm_eps").value_or(1e-6);
  s.tie_embeddings = cfg.boolean("tie_word_embeddings").value_or(false);
  cfg.string("torch_dtype", NullIs::kAbsent);  // the weights' dtype: load_hf_weights converts whatever it finds
  cfg.string("dtype", NullIs::kAbsent);        // (transformers 5.x's name for torch_dtype)
  TANDEM_CHECK(!cfg.object("quantization_config", NullIs::kAbsent), origin,
               ": the checkpoint is quantized ('quantization_config'); tandem loads floating-point weights: "
               "dequantize it first (load it in transformers and save_pretrained it in bfloat16 or float32)");
  // tandem's own types: n_head 1 where the architecture has no attention (as their presets).
  const auto expect_act = [&](const std::string& act) {
    const std::string got = cfg.string("hidden_act").value_or(act);
    TANDEM_CHECK(got == act, origin, ": 'hidden_act' '", got, "' is not what model_type ", type, " computes ('", act,
                 "')");
  };
  switch (s.arch) {
    case Arch::kLlama:
      read_llama(cfg, s, origin);
      break;
    case Arch::kResNetBk:
      s.n_head = s.n_kv_head = cfg.required_integer("num_attention_heads");  // BK heads
      read_moe(cfg, s);
      expect_act("silu");
      break;
    case Arch::kAmxMoe:
      s.n_head = s.n_kv_head = 1;
      s.n_dense = cfg.required_integer("num_dense_layers");
      read_moe(cfg, s);
      expect_act("gelu (dense), silu (experts)");
      break;
    case Arch::kMlp:
      s.n_head = s.n_kv_head = 1;
      expect_act("gelu");
      break;
  }
  cfg.refuse_unread(kMetadataKeys, "tandem does not know what it changes in the model; remove it from " + origin +
                                       " if it does not change the model");
  try {
    validate_spec(s);
  } catch (const UserError& e) {  // the spec's names (model.*) for the config's keys
    TANDEM_FAIL(origin, ": ", e.what());
  }
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
    const nlohmann::json j = parse_json_text(read_file(index.string(), "safetensors index"), index.string());
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
