#include "tandem/io/hf_config.h"

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "tandem/core/error.h"
#include "tandem/core/fs.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/formats/json_text.h"
#include "tandem/models/family.h"

namespace tandem {
namespace {

using nlohmann::json;

// Note [HF config keys]
// config.json is read key by key through ConfigObject, which checks each value's JSON type (a
// UserError naming the file, the key and the type expected) and remembers which keys were read.
// A key left unread must be metadata that does not change what the model computes (kMetadataKeys:
// what transformers 4.x and 5.x write beside the architecture, generation defaults of old 4.x
// files included); any other key is refused rather than ignored, since ignoring a key whose
// meaning tandem does not implement would build a different model than transformers builds.
// A key is read with the default its family's transformers config gives it when absent (Gemma's
// head_dim is 256, not hidden_size / num_attention_heads). RoPE comes in two layouts:
// transformers 4.x writes top-level rope_theta and rope_scaling ({"rope_type" or "type", factor,
// ...}), 5.x writes rope_parameters ({rope_theta, rope_type, factor, ...}); both are read, and a
// value given twice must agree. Dropout changes training only, and tandem trains without it: a
// non-zero rate is named in a warning, not refused (every GPT-2 checkpoint has 0.1).

// clang-format off
const std::set<std::string> kMetadataKeys = {
    "_attn_implementation_autoset", "_name_or_path", "add_cross_attention", "architectures", "bad_words_ids",
    "begin_suppress_tokens", "bos_token_id", "cache_implementation", "chunk_size_feed_forward", "cross_attention_hidden_size",
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
  /// The nested array, or nullptr when absent (or null, with NullIs::kAbsent).
  const json* array(const std::string& key, NullIs null = NullIs::kWrongType) {
    const json* v = find(key, null, "a list");
    if (v && !v->is_array()) wrong_type(key, *v, "a list");
    return v;
  }
  /// Whether the key is in the object at all (null included).
  bool has(const std::string& key) const { return object_.contains(key); }
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

/// An activation by its transformers name.
Activation activation(const std::string& name, const std::string& key, const std::string& origin) {
  if (name == "silu" || name == "swish") return Activation::kSilu;
  if (name == "gelu") return Activation::kGelu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_new") return Activation::kGeluTanh;
  TANDEM_FAIL(origin, ": '", key, "' '", name,
              "' is not supported; tandem implements silu, gelu, gelu_new and gelu_pytorch_tanh");
}

std::string activation_name(Activation a, Family f) {
  switch (a) {
    case Activation::kSilu:
      return "silu";
    case Activation::kGelu:
      return "gelu";
    case Activation::kGeluTanh:
      return f == Family::kGpt2 ? "gelu_new" : "gelu_pytorch_tanh";
  }
  return "?";
}

/// The rope_type's own keys into s.rope_scaling.
void read_rope_type(ConfigObject& rope, const std::string& type, ModelSpec& s, const std::string& origin) {
  auto& rs = s.rope_scaling;
  const std::string why = "rope_type '" + type + "' needs it";
  if (type == "linear" || type == "dynamic") {
    rs.type = type == "linear" ? RopeType::kLinear : RopeType::kDynamic;
    rs.factor = rope.required_number("factor", why);
    rs.original_max_position = s.max_seq_len;
    // Dynamic NTK scales beyond max_position_embeddings, to the factor's multiple of it: tandem's
    // context (written back as the original length, hf_config_json).
    if (rs.type == RopeType::kDynamic && rs.factor > 1)
      s.max_seq_len = static_cast<int64_t>(std::llround(double(s.max_seq_len) * rs.factor));
  } else if (type == "yarn") {
    rs.type = RopeType::kYarn;
    rs.original_max_position = rope.integer("original_max_position_embeddings").value_or(s.max_seq_len);
    rs.factor =
        rope.number("factor", NullIs::kAbsent).value_or(double(s.max_seq_len) / double(rs.original_max_position));
    rs.attention_factor = rope.number("attention_factor", NullIs::kAbsent).value_or(0.0);
    rs.beta_fast = rope.number("beta_fast", NullIs::kAbsent).value_or(32.0);
    rs.beta_slow = rope.number("beta_slow", NullIs::kAbsent).value_or(1.0);
    rs.mscale = rope.number("mscale", NullIs::kAbsent).value_or(0.0);
    rs.mscale_all_dim = rope.number("mscale_all_dim", NullIs::kAbsent).value_or(0.0);
    rs.truncate = rope.boolean("truncate", NullIs::kAbsent).value_or(true);
    TANDEM_CHECK(rs.original_max_position > 0, origin, ": '", rope.name("original_max_position_embeddings"),
                 "' must be > 0, got ", rs.original_max_position);
    TANDEM_CHECK(rs.beta_fast > 0 && rs.beta_slow > 0, origin, ": '", rope.name("beta_fast"), "' and '",
                 rope.name("beta_slow"), "' must be > 0");
  } else if (type == "llama3") {
    rs.type = RopeType::kLlama3;
    rs.factor = rope.required_number("factor", why);
    rs.low_freq_factor = rope.required_number("low_freq_factor", why);
    rs.high_freq_factor = rope.required_number("high_freq_factor", why);
    // transformers 5.x falls back to max_position_embeddings when the original length is not given.
    rs.original_max_position = rope.integer("original_max_position_embeddings").value_or(s.max_seq_len);
    TANDEM_CHECK(rs.low_freq_factor > 0 && rs.high_freq_factor > rs.low_freq_factor, origin, ": '",
                 rope.name("high_freq_factor"), "' (", rs.high_freq_factor, ") must exceed '",
                 rope.name("low_freq_factor"), "' (", rs.low_freq_factor, "), which must be > 0");
    TANDEM_CHECK(rs.original_max_position > 0, origin, ": '", rope.name("original_max_position_embeddings"),
                 "' must be > 0, got ", rs.original_max_position);
  }
  if (rs.type != RopeType::kDefault)
    TANDEM_CHECK(rs.factor > 0, origin, ": '", rope.name("factor"), "' must be > 0, got ", rs.factor);
}

/// RoPE settings from either layout (Note [HF config keys]) into `s` (rope_theta, rope_scaling,
/// partial_rotary_factor).
void read_rope(ConfigObject& cfg, ModelSpec& s, const std::string& origin) {
  const json* scaling = cfg.object("rope_scaling", NullIs::kAbsent);
  const json* parameters = cfg.object("rope_parameters", NullIs::kAbsent);
  TANDEM_CHECK(!(scaling && parameters), origin,
               ": both 'rope_scaling' (transformers 4.x) and 'rope_parameters' (transformers 5.x) are set; keep "
               "one (transformers then reads only rope_scaling)");
  // Each value with the key it came from, for messages.
  std::optional<double> theta = cfg.number("rope_theta");
  std::optional<double> partial = cfg.number("partial_rotary_factor", NullIs::kAbsent);
  std::string theta_key = "rope_theta", partial_key = "partial_rotary_factor";
  if (scaling || parameters) {
    const std::string where = scaling ? "rope_scaling" : "rope_parameters";
    ConfigObject rope(scaling ? *scaling : *parameters, origin, where + ".");
    // A value given both at the top level and inside the RoPE object must agree.
    const auto merge = [&](std::optional<double>& top, std::string& top_key) {
      const std::string key = top_key;
      const auto inner = rope.number(key, NullIs::kAbsent);
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
    const std::set<std::string> known = {"default", "linear", "dynamic", "yarn", "llama3"};
    TANDEM_CHECK(known.count(type), origin, ": '", rope.name(rope_type ? "rope_type" : "type"), "' '", type,
                 "' is not supported; tandem implements the default RoPE and the linear, dynamic, yarn and llama3 "
                 "scalings (convert the checkpoint or train a model of a supported kind)");
    read_rope_type(rope, type, s, origin);
    rope.refuse_unread({}, "rope_type '" + type + "' does not use it; remove it from config.json");
  }
  s.rope_theta = theta.value_or(10000.0);
  TANDEM_CHECK(s.rope_theta > 0, origin, ": '", theta_key, "' must be > 0, got ", s.rope_theta);
  s.parts.rotary_fraction = partial.value_or(1.0);
  TANDEM_CHECK(s.parts.rotary_fraction > 0 && s.parts.rotary_fraction <= 1, origin, ": '", partial_key,
               "' must be within (0, 1], got ", s.parts.rotary_fraction);
  TANDEM_CHECK(s.rotary_dim() % 2 == 0, origin, ": '", partial_key, "' ", s.parts.rotary_fraction, " rotates ",
               s.rotary_dim(), " of the head's ", s.head_dim(), " dimensions; RoPE needs an even number of them");
}

/// Non-zero dropout rates among `keys`, named in one warning (Note [HF config keys]).
void note_dropout(ConfigObject& cfg, std::initializer_list<const char*> keys, const std::string& origin) {
  std::vector<std::string> set;
  for (const char* key : keys) {
    const double rate = cfg.number(key, NullIs::kAbsent).value_or(0.0);
    TANDEM_CHECK(rate >= 0 && rate < 1, origin, ": '", key, "' must be within [0, 1), got ", rate);
    if (rate > 0) set.push_back(strprintf("%s %g", key, rate));
  }
  if (!set.empty()) log::warn(origin + ": " + join(set, ", ") + " not applied: tandem trains without dropout");
}

/// layer_types (["sliding_attention", "full_attention", ...]) into s.parts.sliding_layers.
void read_layer_types(ConfigObject& cfg, ModelSpec& s, const std::string& origin) {
  const json* types = cfg.array("layer_types", NullIs::kAbsent);
  if (!types) return;
  TANDEM_CHECK(static_cast<int64_t>(types->size()) == s.n_layer, origin, ": 'layer_types' names ", types->size(),
               " layers; num_hidden_layers is ", s.n_layer);
  s.parts.sliding_layers.clear();
  for (const auto& t : *types) {
    const std::string v = t.is_string() ? t.get<std::string>() : "";
    TANDEM_CHECK(v == "sliding_attention" || v == "full_attention", origin, ": 'layer_types' holds ", shown(t),
                 "; tandem implements sliding_attention and full_attention");
    s.parts.sliding_layers.push_back(v == "sliding_attention");
  }
}

/// The sliding window keys of a family (Note [Decoder families]). A null window is none.
void read_window(ConfigObject& cfg, ModelSpec& s, const std::string& origin) {
  auto& p = s.parts;
  const auto window_or = [&](int64_t absent) {
    const bool given = cfg.has("sliding_window");
    return cfg.integer("sliding_window", NullIs::kAbsent).value_or(given ? 0 : absent);
  };
  switch (s.family) {
    case Family::kMistral:
    case Family::kPhi3:
      p.sliding_window = window_or(s.family == Family::kMistral ? 4096 : 0);
      break;
    case Family::kQwen2: {
      const bool use = cfg.boolean("use_sliding_window").value_or(false);
      const int64_t window = window_or(4096);
      const int64_t from = cfg.integer("max_window_layers", NullIs::kAbsent).value_or(28);
      for (int64_t i = 0; i < s.n_layer; ++i) p.sliding_layers.push_back(i >= from);
      read_layer_types(cfg, s, origin);
      p.sliding_window = use ? window : 0;
      break;
    }
    case Family::kGemma2:
      p.sliding_window = window_or(4096);
      for (int64_t i = 0; i < s.n_layer; ++i) p.sliding_layers.push_back(i % 2 == 0);
      read_layer_types(cfg, s, origin);
      break;
    default:
      break;
  }
  TANDEM_CHECK(p.sliding_window >= 0, origin, ": 'sliding_window' must be >= 0, got ", p.sliding_window);
  if (p.sliding_window == 0) p.sliding_layers.clear();
}

/// The keys of the Llama-named families (llama, qwen2, mistral, gemma, gemma2, phi3) into `s`.
void read_llama_like(ConfigObject& cfg, ModelSpec& s, const std::string& origin) {
  const Family f = s.family;
  const bool gemma = f == Family::kGemma || f == Family::kGemma2;
  s.d_model = cfg.required_integer("hidden_size");
  s.d_ff = cfg.required_integer("intermediate_size");
  s.n_layer = cfg.required_integer("num_hidden_layers");
  s.vocab_size = cfg.required_integer("vocab_size");
  s.max_seq_len = cfg.integer("max_position_embeddings").value_or(2048);
  s.norm_eps = cfg.number("rms_norm_eps").value_or(f == Family::kPhi3 ? 1e-5 : 1e-6);
  s.tie_embeddings = cfg.boolean("tie_word_embeddings").value_or(gemma);
  s.n_head = cfg.required_integer("num_attention_heads");
  TANDEM_CHECK(s.n_head > 0, origin, ": 'num_attention_heads' must be > 0, got ", s.n_head);
  s.n_kv_head = cfg.integer("num_key_value_heads", NullIs::kAbsent).value_or(s.n_head);
  TANDEM_CHECK(s.n_kv_head > 0 && s.n_head % s.n_kv_head == 0, origin, ": 'num_attention_heads' (", s.n_head,
               ") must be divisible by 'num_key_value_heads' (", s.n_kv_head, ")");
  s.parts.head_dim = cfg.integer("head_dim", NullIs::kAbsent).value_or(gemma ? 256 : 0);
  if (s.parts.head_dim == 0) {
    TANDEM_CHECK(s.d_model % s.n_head == 0, origin, ": 'hidden_size' (", s.d_model,
                 ") must be divisible by 'num_attention_heads' (", s.n_head, ") when 'head_dim' is not given");
  } else {
    TANDEM_CHECK(s.parts.head_dim > 0, origin, ": 'head_dim' must be > 0, got ", s.parts.head_dim);
  }
  // The activation: Gemma2 reads hidden_activation (its hidden_act is not used), the others hidden_act.
  const std::string act_key = f == Family::kGemma2 ? "hidden_activation" : "hidden_act";
  const std::string unused_act_key = f == Family::kGemma2 ? "hidden_act" : "hidden_activation";
  if (gemma) cfg.string(unused_act_key, NullIs::kAbsent);
  s.parts.act = activation(cfg.string(act_key).value_or(gemma ? "gelu_pytorch_tanh" : "silu"), act_key, origin);
  if (f == Family::kLlama || gemma) {
    const bool bias = cfg.boolean("attention_bias").value_or(false);
    s.parts.qkv_bias = s.parts.o_bias = bias;
  }
  if (f == Family::kLlama) s.parts.mlp_bias = cfg.boolean("mlp_bias").value_or(false);
  if (gemma)
    TANDEM_CHECK(!cfg.boolean("use_bidirectional_attention", NullIs::kAbsent).value_or(false), origin,
                 ": 'use_bidirectional_attention' is true; tandem's decoder attends causally");
  if (f == Family::kPhi3) {
    cfg.integer("original_max_position_embeddings", NullIs::kAbsent);  // used by longrope only
    note_dropout(cfg, {"attention_dropout", "resid_pdrop", "embd_pdrop"}, origin);
  } else {
    note_dropout(cfg, {"attention_dropout"}, origin);
  }
  if (f == Family::kLlama) {
    if (const auto tp = cfg.integer("pretraining_tp", NullIs::kAbsent))  // split matmuls: the same function
      TANDEM_CHECK(*tp >= 1, origin, ": 'pretraining_tp' must be >= 1, got ", *tp);
    if (const json* pruned = cfg.object("pruned_heads", NullIs::kAbsent))
      TANDEM_CHECK(pruned->empty(), origin, ": 'pruned_heads' is not empty; tandem cannot load pruned attention");
  }
  if (f == Family::kGemma2) {
    const double scalar = cfg.number("query_pre_attn_scalar", NullIs::kAbsent).value_or(256.0);
    TANDEM_CHECK(scalar > 0, origin, ": 'query_pre_attn_scalar' must be > 0, got ", scalar);
    s.parts.query_scale = 1.0 / std::sqrt(scalar);
    s.parts.attn_softcap = cfg.number("attn_logit_softcapping", NullIs::kAbsent).value_or(0.0);
    s.parts.final_softcap = cfg.number("final_logit_softcapping", NullIs::kAbsent).value_or(0.0);
    if (!cfg.has("attn_logit_softcapping")) s.parts.attn_softcap = 50;
    if (!cfg.has("final_logit_softcapping")) s.parts.final_softcap = 30;
  }
  read_window(cfg, s, origin);
  read_rope(cfg, s, origin);
}

/// GPT-2's keys (n_embd, n_layer, ...) into `s`.
void read_gpt2(ConfigObject& cfg, ModelSpec& s, const std::string& origin) {
  s.d_model = cfg.required_integer("n_embd");
  s.n_layer = cfg.required_integer("n_layer");
  s.n_head = s.n_kv_head = cfg.required_integer("n_head");
  TANDEM_CHECK(s.n_head > 0 && s.d_model % s.n_head == 0, origin, ": 'n_embd' (", s.d_model,
               ") must be divisible by 'n_head' (", s.n_head, ")");
  s.vocab_size = cfg.required_integer("vocab_size");
  s.max_seq_len = cfg.integer("n_positions").value_or(1024);
  cfg.integer("n_ctx", NullIs::kAbsent);  // an older name of n_positions, which transformers no longer reads
  s.d_ff = cfg.integer("n_inner", NullIs::kAbsent).value_or(4 * s.d_model);
  s.norm_eps = cfg.number("layer_norm_epsilon").value_or(1e-5);
  s.tie_embeddings = cfg.boolean("tie_word_embeddings").value_or(true);
  s.parts.act = activation(cfg.string("activation_function").value_or("gelu_new"), "activation_function", origin);
  if (!cfg.boolean("scale_attn_weights").value_or(true)) s.parts.query_scale = 1.0;
  TANDEM_CHECK(!cfg.boolean("scale_attn_by_inverse_layer_idx").value_or(false), origin,
               ": 'scale_attn_by_inverse_layer_idx' is true; tandem scales every layer's attention alike");
  TANDEM_CHECK(!cfg.boolean("add_cross_attention").value_or(false), origin,
               ": 'add_cross_attention' is true; tandem's decoder has no cross-attention");
  cfg.boolean("reorder_and_upcast_attn", NullIs::kAbsent);  // the same function, computed in fp32
  note_dropout(cfg, {"attn_pdrop", "resid_pdrop", "embd_pdrop"}, origin);
}

// GPT2LMHeadModel's keys for its sequence-summary head, which a causal LM does not use.
const std::set<std::string> kGpt2SummaryKeys = {"summary_activation", "summary_first_dropout", "summary_proj_to_labels",
                                                "summary_type", "summary_use_proj"};

/// The MoE keys that tandem's own MoE types write (hf_config_json).
void read_moe(ConfigObject& cfg, ModelSpec& s) {
  s.n_experts = cfg.required_integer("num_local_experts");
  s.top_k = cfg.required_integer("num_experts_per_tok");
  s.capacity_factor = cfg.number("capacity_factor").value_or(1.25);
  s.moe_aux_weight = cfg.number("router_aux_loss_coef").value_or(0.01);
}

/// tandem's own model types (tandem_mlp, tandem_resnet_bk, tandem_amx_moe) into `s`.
void read_tandem_type(ConfigObject& cfg, ModelSpec& s, const std::string& type, const std::string& origin) {
  s.d_model = cfg.required_integer("hidden_size");
  s.d_ff = cfg.required_integer("intermediate_size");
  s.n_layer = cfg.required_integer("num_hidden_layers");
  s.vocab_size = cfg.required_integer("vocab_size");
  s.max_seq_len = cfg.integer("max_position_embeddings").value_or(2048);
  s.norm_eps = cfg.number("rms_norm_eps").value_or(1e-6);
  s.tie_embeddings = cfg.boolean("tie_word_embeddings").value_or(false);
  // n_head 1 where the architecture has no attention (as their presets).
  const auto expect_act = [&](const std::string& act) {
    const std::string got = cfg.string("hidden_act").value_or(act);
    TANDEM_CHECK(got == act, origin, ": 'hidden_act' '", got, "' is not what model_type ", type, " computes ('", act,
                 "')");
  };
  if (s.arch == Arch::kResNetBk) {
    s.n_head = s.n_kv_head = cfg.required_integer("num_attention_heads");  // BK heads
    read_moe(cfg, s);
    expect_act("silu");
  } else if (s.arch == Arch::kAmxMoe) {
    s.n_head = s.n_kv_head = 1;
    s.n_dense = cfg.required_integer("num_dense_layers");
    read_moe(cfg, s);
    expect_act("gelu (dense), silu (experts)");
  } else {
    s.n_head = s.n_kv_head = 1;
    expect_act("gelu");
  }
}

// ---- writing config.json ----

/// RoPE in the layout both transformers 4.x and 5.x read: top-level rope_theta and rope_scaling.
void write_rope(json& j, const ModelSpec& s) {
  j["rope_theta"] = s.rope_theta;
  const auto& rs = s.rope_scaling;
  if (s.parts.rotary_fraction != 1.0) j["partial_rotary_factor"] = s.parts.rotary_fraction;
  switch (rs.type) {
    case RopeType::kDefault:
      j["rope_scaling"] = nullptr;
      return;
    case RopeType::kLinear:
    case RopeType::kDynamic:
      j["rope_scaling"] = {{"rope_type", rs.type == RopeType::kLinear ? "linear" : "dynamic"}, {"factor", rs.factor}};
      return;
    case RopeType::kYarn:
      j["rope_scaling"] = {{"rope_type", "yarn"},       {"factor", rs.factor},
                           {"beta_fast", rs.beta_fast}, {"beta_slow", rs.beta_slow},
                           {"truncate", rs.truncate},   {"original_max_position_embeddings", rs.original_max_position}};
      if (rs.attention_factor > 0) j["rope_scaling"]["attention_factor"] = rs.attention_factor;
      if (rs.mscale > 0) j["rope_scaling"]["mscale"] = rs.mscale;
      if (rs.mscale_all_dim > 0) j["rope_scaling"]["mscale_all_dim"] = rs.mscale_all_dim;
      return;
    case RopeType::kLlama3:
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", rs.factor},
                           {"low_freq_factor", rs.low_freq_factor},
                           {"high_freq_factor", rs.high_freq_factor},
                           {"original_max_position_embeddings", rs.original_max_position}};
      return;
  }
}

json layer_types_json(const ModelSpec& s) {
  json types = json::array();
  for (int64_t i = 0; i < s.n_layer; ++i) types.push_back(s.window(i) > 0 ? "sliding_attention" : "full_attention");
  return types;
}

/// The keys of a Llama-named family, as its transformers config reads them.
void write_llama_like(json& j, const ModelSpec& s) {
  const DecoderParts& p = s.parts;
  const Family f = s.family;
  j["hidden_size"] = s.d_model;
  j["intermediate_size"] = s.d_ff;
  j["num_hidden_layers"] = s.n_layer;
  j["num_attention_heads"] = s.n_head;
  j["num_key_value_heads"] = s.n_kv_head;
  j["head_dim"] = s.head_dim();
  j["vocab_size"] = s.vocab_size;
  j["max_position_embeddings"] =
      s.rope_scaling.type == RopeType::kDynamic ? s.rope_scaling.original_max_position : s.max_seq_len;
  j["rms_norm_eps"] = s.norm_eps;
  j["tie_word_embeddings"] = s.tie_embeddings;
  j[f == Family::kGemma2 ? "hidden_activation" : "hidden_act"] = activation_name(p.act, f);
  if (f == Family::kLlama || f == Family::kGemma || f == Family::kGemma2) j["attention_bias"] = p.qkv_bias;
  if (f == Family::kLlama) j["mlp_bias"] = p.mlp_bias;
  j["attention_dropout"] = 0.0;
  const json window = p.sliding_window > 0 ? json(p.sliding_window) : json(nullptr);
  if (f == Family::kMistral || f == Family::kPhi3) j["sliding_window"] = window;
  if (f == Family::kQwen2) {
    j["use_sliding_window"] = p.sliding_window > 0;
    j["sliding_window"] = window;
    j["max_window_layers"] = s.n_layer;  // layer_types says which layers slide
    j["layer_types"] = layer_types_json(s);
  }
  if (f == Family::kGemma2) {
    j["sliding_window"] = p.sliding_window > 0 ? p.sliding_window : s.max_seq_len;
    j["layer_types"] = layer_types_json(s);
    const double scale = p.query_scale > 0 ? p.query_scale : 1.0 / std::sqrt(double(s.head_dim()));
    const double scalar = 1.0 / (scale * scale);  // transformers 5 types it as an integer
    const auto whole = std::llround(scalar);
    j["query_pre_attn_scalar"] = std::abs(scalar - double(whole)) < 1e-6 * scalar ? json(whole) : json(scalar);
    j["attn_logit_softcapping"] = p.attn_softcap > 0 ? json(p.attn_softcap) : json(nullptr);
    j["final_logit_softcapping"] = p.final_softcap > 0 ? json(p.final_softcap) : json(nullptr);
  }
  write_rope(j, s);
}

void write_gpt2(json& j, const ModelSpec& s) {
  j["n_embd"] = s.d_model;
  j["n_layer"] = s.n_layer;
  j["n_head"] = s.n_head;
  j["n_positions"] = s.max_seq_len;
  j["n_inner"] = s.d_ff;
  j["vocab_size"] = s.vocab_size;
  j["layer_norm_epsilon"] = s.norm_eps;
  j["activation_function"] = activation_name(s.parts.act, Family::kGpt2);
  j["tie_word_embeddings"] = s.tie_embeddings;
  j["scale_attn_weights"] = s.parts.query_scale != 1.0;
  for (const char* key : {"attn_pdrop", "resid_pdrop", "embd_pdrop"}) j[key] = 0.0;
}

void write_tandem_type(json& j, const ModelSpec& s) {
  if (s.arch == Arch::kResNetBk) {
    j["architectures"] = {"TandemResNetBkForCausalLM"};
    j["model_type"] = "tandem_resnet_bk";
    j["num_attention_heads"] = s.n_head;  // BK heads
    j["hidden_act"] = "silu";
  } else if (s.arch == Arch::kAmxMoe) {
    j["architectures"] = {"TandemAmxMoeForCausalLM"};
    j["model_type"] = "tandem_amx_moe";
    j["num_dense_layers"] = s.n_dense;
    j["hidden_act"] = "gelu (dense), silu (experts)";
  } else {
    j["architectures"] = {"TandemMlpForCausalLM"};
    j["model_type"] = "tandem_mlp";
    j["hidden_act"] = "gelu";
  }
  if (s.arch == Arch::kResNetBk || s.arch == Arch::kAmxMoe) {
    j["num_local_experts"] = s.n_experts;
    j["num_experts_per_tok"] = s.top_k;
    j["capacity_factor"] = s.capacity_factor;
    j["router_aux_loss_coef"] = s.moe_aux_weight;
  }
  j["hidden_size"] = s.d_model;
  j["intermediate_size"] = s.d_ff;
  j["num_hidden_layers"] = s.n_layer;
  j["vocab_size"] = s.vocab_size;
  j["max_position_embeddings"] = s.max_seq_len;
  j["rms_norm_eps"] = s.norm_eps;
  j["tie_word_embeddings"] = s.tie_embeddings;
}

}  // namespace

std::string hf_config_json(const ModelSpec& s, const std::string& torch_dtype) {
  json j;
  if (s.arch == Arch::kDecoder) {
    const FamilyNames& n = family_names(s.family);
    j["architectures"] = {n.architecture};
    j["model_type"] = n.model_type;
    if (s.family == Family::kGpt2)
      write_gpt2(j, s);
    else
      write_llama_like(j, s);
  } else {
    write_tandem_type(j, s);
  }
  // Token ids as the folder had them; none for a preset (no family default stands in for them).
  j["bos_token_id"] = j["eos_token_id"] = j["pad_token_id"] = nullptr;
  if (!s.token_ids.empty()) j.update(json::parse(s.token_ids));
  j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

ModelSpec spec_from_hf_config_text(const std::string& text, const std::string& origin) {
  const json j = parse_json_text(text, origin);
  TANDEM_CHECK(j.is_object(), origin, ": expected a JSON object");
  ConfigObject cfg(j, origin, "");
  const std::string type = cfg.string("model_type").value_or("");
  const std::map<std::string, Arch> own = {
      {"tandem_mlp", Arch::kMlp}, {"tandem_resnet_bk", Arch::kResNetBk}, {"tandem_amx_moe", Arch::kAmxMoe}};
  ModelSpec s;
  s.name = "hf";
  Family family = Family::kLlama;
  if (own.count(type)) {
    s.arch = own.at(type);
    read_tandem_type(cfg, s, type, origin);
  } else {
    TANDEM_CHECK(family_of_model_type(type, family), origin, ": model_type '", type,
                 "' is not supported yet; tandem reads the families ", supported_model_types(),
                 " and its own, in training, generation and serving alike");
    s.arch = Arch::kDecoder;
    s.family = family;
    s.parts = family_parts(family);
    if (family == Family::kGpt2)
      read_gpt2(cfg, s, origin);
    else
      read_llama_like(cfg, s, origin);
  }
  json ids = json::object();  // kept as they are (ModelSpec::token_ids)
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"})
    if (j.contains(key)) ids[key] = j.at(key);
  if (!ids.empty()) s.token_ids = ids.dump();
  cfg.string("torch_dtype", NullIs::kAbsent);  // the weights' dtype: load_hf_weights converts whatever it finds
  cfg.string("dtype", NullIs::kAbsent);        // (transformers 5.x's name for torch_dtype)
  TANDEM_CHECK(!cfg.object("quantization_config", NullIs::kAbsent), origin,
               ": the checkpoint is quantized ('quantization_config'); tandem loads floating-point weights: "
               "dequantize it first (load it in transformers and save_pretrained it in bfloat16 or float32)");
  std::set<std::string> allowed = kMetadataKeys;
  if (s.arch == Arch::kDecoder && family == Family::kGpt2)
    allowed.insert(kGpt2SummaryKeys.begin(), kGpt2SummaryKeys.end());
  cfg.refuse_unread(allowed, "tandem does not know what it changes in the model; remove it from " + origin +
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

}  // namespace tandem
