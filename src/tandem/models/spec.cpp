#include "tandem/models/spec.h"

#include <algorithm>
#include <tuple>

#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/models/family.h"

namespace tandem {
namespace {

ModelSpec llama(std::string name, int64_t layers, int64_t d, int64_t heads, int64_t kv, int64_t ff, int64_t vocab,
                int64_t seq, bool tie) {
  ModelSpec s;
  s.name = std::move(name);
  s.arch = Arch::kDecoder;
  s.n_layer = layers, s.d_model = d, s.n_head = heads, s.n_kv_head = kv, s.d_ff = ff;
  s.vocab_size = vocab, s.max_seq_len = seq, s.tie_embeddings = tie;
  return s;
}

// A preset of another family: its parts as the family computes them by default, norm epsilon 1e-6.
ModelSpec family(std::string name, Family f, int64_t layers, int64_t d, int64_t heads, int64_t kv, int64_t ff,
                 int64_t vocab, int64_t seq, bool tie) {
  ModelSpec s = llama(std::move(name), layers, d, heads, kv, ff, vocab, seq, tie);
  s.family = f;
  s.parts = family_parts(f);
  s.norm_eps = 1e-6;
  return s;
}

// Note [Preset shapes]
// Every matrix dimension is a multiple of 64 and head_dim is 64 or 128, so bf16 GEMMs and
// flash attention run on tensor cores without padding. The 1B..13B presets follow the public
// LLaMA shapes (7B, 13B are LLaMA-2's); 1B and 3B use grouped-query attention.
const std::vector<ModelSpec>& presets() {
  static const std::vector<ModelSpec> kPresets = [] {
    std::vector<ModelSpec> p;
    // tiny: byte-level, trains on two CPU cores in seconds.
    p.push_back(llama("tiny", 4, 128, 4, 2, 384, 256, 128, true));
    p.push_back(llama("125M", 12, 768, 12, 12, 2048, 32000, 2048, true));
    p.push_back(llama("1B", 24, 2048, 16, 8, 5632, 32000, 2048, false));
    p.push_back(llama("3B", 28, 3072, 24, 8, 8192, 32000, 2048, false));
    p.push_back(llama("7B", 32, 4096, 32, 32, 11008, 32000, 4096, false));
    p.push_back(llama("13B", 40, 5120, 40, 40, 13824, 32000, 4096, false));
    // ResNet-BK (Note [ResNet-BK mixing]): n_head = BK heads, d_ff = per-expert hidden size.
    using BkPreset = std::tuple<const char*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;
    for (auto [name, layers, d, heads, ff, experts, vocab, seq] :
         {BkPreset{"bk-tiny", 4, 128, 8, 128, 8, 256, 128}, BkPreset{"bk-125M", 12, 768, 16, 448, 8, 32000, 2048}}) {
      ModelSpec bk = llama(name, layers, d, heads, heads, ff, vocab, seq, true);
      bk.arch = Arch::kResNetBk;
      bk.n_experts = experts, bk.top_k = 2;
      p.push_back(bk);
    }
    ModelSpec mlp = llama("mlp", 4, 256, 1, 1, 1024, 256, 128, true);
    mlp.arch = Arch::kMlp;
    p.push_back(mlp);
    // Seed 000's model: dense layers for the CPU's matrix units feeding MoE layers for the GPU.
    ModelSpec amx = llama("amx-moe", 6, 1024, 1, 1, 2048, 8192, 512, true);
    amx.arch = Arch::kAmxMoe;
    amx.n_dense = 2, amx.n_experts = 8, amx.top_k = 2;
    p.push_back(amx);
    ModelSpec amx_tiny = llama("amx-moe-tiny", 4, 128, 1, 1, 256, 256, 128, true);
    amx_tiny.arch = Arch::kAmxMoe;
    amx_tiny.n_dense = 2, amx_tiny.n_experts = 8, amx_tiny.top_k = 2;
    p.push_back(amx_tiny);
    // The shapes of public checkpoints of the other families (Note [Decoder families]), for planning
    // and for training from scratch; --init-from a folder reads its own config.json.
    for (auto [name, layers, d, heads, kv, ff, vocab, tie] :
         {std::tuple<const char*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool>{
              "qwen2.5-0.5B", 24, 896, 14, 2, 4864, 151936, true},
          {"qwen2.5-1.5B", 28, 1536, 12, 2, 8960, 151936, true},
          {"qwen2.5-7B", 28, 3584, 28, 4, 18944, 152064, false}}) {
      ModelSpec q = family(name, Family::kQwen2, layers, d, heads, kv, ff, vocab, 32768, tie);
      q.rope_theta = 1e6;
      p.push_back(q);
    }
    ModelSpec mistral = family("mistral-7B", Family::kMistral, 32, 4096, 32, 8, 14336, 32000, 32768, false);
    mistral.parts.sliding_window = 4096;  // Mistral 7B v0.1
    p.push_back(mistral);
    ModelSpec gemma2 = family("gemma2-2B", Family::kGemma2, 26, 2304, 8, 4, 9216, 256000, 8192, true);
    gemma2.parts.head_dim = 256;
    gemma2.parts.query_scale = 1.0 / 16;  // query_pre_attn_scalar 256
    gemma2.parts.attn_softcap = 50, gemma2.parts.final_softcap = 30;
    gemma2.parts.sliding_window = 4096;
    for (int64_t i = 0; i < gemma2.n_layer; ++i) gemma2.parts.sliding_layers.push_back(i % 2 == 0);
    p.push_back(gemma2);
    return p;
  }();
  return kPresets;
}

}  // namespace

int64_t ModelSpec::layer_params(int64_t i, bool padded) const {
  if (arch != Arch::kAmxMoe) return params_per_layer(padded);
  if (i < n_dense) return 2 * d_model * d_ff + d_model;
  return d_model + d_model * n_experts + 3 * n_experts * d_model * d_ff;
}

int64_t ModelSpec::params_per_layer(bool padded) const {
  if (arch == Arch::kAmxMoe) return layer_params(n_dense < n_layer ? n_dense : 0, padded);
  const int64_t ff = padded ? padded_d_ff() : d_ff;
  if (arch == Arch::kMlp) return 2 * d_model * ff + d_model;
  if (arch == Arch::kResNetBk)
    return d_model * 3 * n_head + 3 * n_head + 2 * n_head * d_model + 2 * n_head + 2 * d_model + d_model * n_experts +
           3 * n_experts * d_model * d_ff;
  const int64_t q_dim = n_head * head_dim(), kv_dim = n_kv_head * head_dim();
  const int64_t attn = 2 * d_model * q_dim + 2 * d_model * kv_dim + (parts.qkv_bias ? q_dim + 2 * kv_dim : 0) +
                       (parts.o_bias ? d_model : 0);
  const int64_t ff_in = parts.gated_ffn ? 2 : 1;
  const int64_t mlp = (ff_in + 1) * d_model * ff + (parts.mlp_bias ? ff_in * ff + d_model : 0);
  const int64_t norms = (parts.sandwich_norms ? 4 : 2) * norm_params();
  return attn + mlp + norms;
}

int64_t ModelSpec::norm_params() const { return parts.norm == NormKind::kLayerNorm ? 2 * d_model : d_model; }

int64_t ModelSpec::num_params() const {
  const int64_t emb = padded_vocab() * d_model;
  int64_t layers = 0;
  for (int64_t i = 0; i < n_layer; ++i) layers += layer_params(i);
  return emb * (tie_embeddings ? 1 : 2) + position_params() + layers + norm_params();
}

int64_t ModelSpec::num_params_unpadded() const {
  const int64_t emb = vocab_size * d_model;
  int64_t layers = 0;
  for (int64_t i = 0; i < n_layer; ++i) layers += layer_params(i, false);
  return emb * (tie_embeddings ? 1 : 2) + position_params() + layers + norm_params();
}

int64_t ModelSpec::position_params() const {
  return arch == Arch::kDecoder && parts.learned_positions ? max_seq_len * d_model : 0;
}

int64_t ModelSpec::padded_d_ff() const {
  if (arch == Arch::kResNetBk || arch == Arch::kAmxMoe) return d_ff;
  if (arch == Arch::kDecoder && !family_names(family).gate_up.empty()) return d_ff;  // fused: see padded_d_ff's doc
  return (d_ff + 63) / 64 * 64;
}

int64_t ModelSpec::rotary_dim() const {
  if (parts.learned_positions) return 0;
  return static_cast<int64_t>(static_cast<double>(head_dim()) * parts.rotary_fraction);  // as HF rounds it
}

int64_t ModelSpec::window(int64_t layer) const {
  if (parts.sliding_window <= 0) return 0;
  if (parts.sliding_layers.empty()) return parts.sliding_window;
  return parts.sliding_layers.at(static_cast<size_t>(layer)) ? parts.sliding_window : 0;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  for (const auto& p : presets()) out.push_back(p.name);
  return out;
}

ModelSpec preset_spec(const std::string& name) {
  for (const auto& p : presets())
    if (to_lower(p.name) == to_lower(name)) return p;
  TANDEM_FAIL("unknown model preset '", name, "'", did_you_mean(name, preset_names()),
              " (presets: ", join(preset_names(), ", "), ")");
}

namespace {

void validate_decoder(const ModelSpec& s) {
  const DecoderParts& p = s.parts;
  TANDEM_CHECK(s.n_head > 0 && s.n_head <= kMaxWidth, "model.n_head must be within 1 .. ", kMaxWidth, ", got ",
               s.n_head);
  TANDEM_CHECK(p.head_dim > 0 || s.d_model % s.n_head == 0, "model.d_model (", s.d_model,
               ") must be divisible by model.n_head (", s.n_head, ")");
  TANDEM_CHECK(s.head_dim() > 0 && s.head_dim() <= kMaxWidth, "the head dimension must be within 1 .. ", kMaxWidth,
               ", got ", s.head_dim());
  TANDEM_CHECK(s.rotary_dim() % 2 == 0, "RoPE's dimension (head_dim ", s.head_dim(), " x partial_rotary_factor ",
               p.rotary_fraction, " = ", s.rotary_dim(), ") must be even");
  TANDEM_CHECK(p.rotary_fraction > 0 && p.rotary_fraction <= 1, "partial_rotary_factor must be within (0, 1], got ",
               p.rotary_fraction);
  TANDEM_CHECK(s.n_kv_head > 0 && s.n_head % s.n_kv_head == 0, "model.n_head (", s.n_head,
               ") must be divisible by model.n_kv_head (", s.n_kv_head, ")");
  TANDEM_CHECK(s.rope_theta > 0, "model.rope_theta must be > 0, got ", s.rope_theta);
  TANDEM_CHECK(p.sliding_window >= 0, "the sliding window must be >= 0, got ", p.sliding_window);
  TANDEM_CHECK(p.sliding_layers.empty() || static_cast<int64_t>(p.sliding_layers.size()) == s.n_layer,
               "the sliding layers name ", p.sliding_layers.size(), " layers of ", s.n_layer,
               "; give one entry per layer");
  TANDEM_CHECK(p.attn_softcap >= 0 && p.final_softcap >= 0 && p.query_scale >= 0,
               "soft-capping values and the query scale must be >= 0");
  if (p.learned_positions)
    TANDEM_CHECK(s.max_seq_len <= (int64_t{1} << 20), "a learned position table of ", s.max_seq_len,
                 " positions is beyond what tandem plans for; lower model.max_seq_len");
}

}  // namespace

void validate_spec(const ModelSpec& s) {
  // Upper bounds far beyond any trained model keep every size of the spec, the memory estimate and
  // the plan within int64 (and the per-layer loops short): a typo fails here, not in an allocation.
  const auto in_range = [](const char* key, int64_t v, int64_t max) {
    TANDEM_CHECK(v > 0 && v <= max, key, " must be within 1 .. ", max, ", got ", v);
  };
  in_range("model.n_layer", s.n_layer, kMaxLayers);
  in_range("model.d_model", s.d_model, kMaxWidth);
  in_range("model.d_ff", s.d_ff, 4 * kMaxWidth);
  in_range("model.vocab_size", s.vocab_size, kMaxVocab);
  in_range("model.max_seq_len", s.max_seq_len, kMaxSeqLen);
  if (s.arch == Arch::kResNetBk || s.arch == Arch::kAmxMoe) in_range("model.n_experts", s.n_experts, kMaxExperts);
  // The parameter count in floating point, before any int64 product of the dimensions is formed.
  const long double d = s.d_model, ff = s.d_ff, e = std::max<int64_t>(s.n_experts, 1);
  const long double per_layer = 4 * d * d + 3 * d * ff * e + d * e;
  const long double params = s.n_layer * per_layer + 2 * d * (s.vocab_size + 64);
  TANDEM_CHECK(params <= static_cast<long double>(kMaxParams), "the model would have ",
               format_count(static_cast<double>(params)), " parameters, more than tandem plans for (",
               format_count(static_cast<double>(kMaxParams)),
               "); check model.d_model, model.d_ff, model.n_layer and model.vocab_size");
  TANDEM_CHECK(s.norm_eps > 0, "model.norm_eps must be > 0, got ", s.norm_eps);
  if (s.arch == Arch::kDecoder) validate_decoder(s);
  if (s.arch == Arch::kResNetBk) {
    TANDEM_CHECK(s.n_head > 0 && s.n_head <= kMaxWidth, "model.n_head (BK heads) must be within 1 .. ", kMaxWidth,
                 ", got ", s.n_head);
    TANDEM_CHECK(s.n_experts >= 1 && s.top_k >= 1 && s.top_k <= s.n_experts,
                 "a ResNet-BK model needs 1 <= model.top_k <= model.n_experts, got ", s.top_k, " of ", s.n_experts);
    TANDEM_CHECK(s.capacity_factor > 0, "model.capacity_factor must be > 0, got ", s.capacity_factor);
    TANDEM_CHECK(s.moe_aux_weight >= 0, "model.moe_aux_weight must be >= 0, got ", s.moe_aux_weight);
  }
  if (s.arch == Arch::kAmxMoe) {
    TANDEM_CHECK(s.n_dense >= 0 && s.n_dense <= s.n_layer, "model.n_dense must be within 0 .. model.n_layer (",
                 s.n_layer, "), got ", s.n_dense);
    TANDEM_CHECK(s.n_experts >= 1 && s.top_k >= 1 && s.top_k <= s.n_experts,
                 "an AMX+MoE model needs 1 <= model.top_k <= model.n_experts, got ", s.top_k, " of ", s.n_experts);
    TANDEM_CHECK(s.capacity_factor > 0, "model.capacity_factor must be > 0, got ", s.capacity_factor);
    TANDEM_CHECK(s.moe_aux_weight >= 0, "model.moe_aux_weight must be >= 0, got ", s.moe_aux_weight);
  }
}

ModelSpec resolve_model_spec(const ModelConfig& c) {
  ModelSpec s = preset_spec(c.preset);
  const bool custom = c.n_layer || c.d_model || c.n_head || c.n_kv_head || c.d_ff || c.vocab_size || c.max_seq_len ||
                      c.tie_embeddings || c.rope_theta || c.norm_eps || c.n_experts || c.top_k || c.capacity_factor ||
                      c.moe_aux_weight || c.n_dense;
  const bool moe = s.arch == Arch::kResNetBk || s.arch == Arch::kAmxMoe;
  TANDEM_CHECK(moe || !(c.n_experts || c.top_k || c.capacity_factor || c.moe_aux_weight),
               "model.n_experts, model.top_k, model.capacity_factor and model.moe_aux_weight apply to MoE presets "
               "(bk-tiny, bk-125M, amx-moe, amx-moe-tiny); model.preset is ",
               s.name);
  TANDEM_CHECK(s.arch == Arch::kAmxMoe || !c.n_dense,
               "model.n_dense applies to the AMX+MoE presets (amx-moe, "
               "amx-moe-tiny); model.preset is ",
               s.name);
  if (c.n_dense) s.n_dense = *c.n_dense;
  if (c.n_layer) s.n_layer = *c.n_layer;
  if (c.d_model) s.d_model = *c.d_model;
  if (c.n_head) s.n_head = *c.n_head;
  if (c.n_kv_head)
    s.n_kv_head = *c.n_kv_head;
  else if (c.n_head && s.arch == Arch::kDecoder && s.n_kv_head > *c.n_head)
    s.n_kv_head = *c.n_head;
  if (c.d_ff) s.d_ff = *c.d_ff;
  if (c.vocab_size) s.vocab_size = *c.vocab_size;
  if (c.max_seq_len) s.max_seq_len = *c.max_seq_len;
  if (c.tie_embeddings) s.tie_embeddings = *c.tie_embeddings;
  if (c.rope_theta) s.rope_theta = *c.rope_theta;
  if (c.norm_eps) s.norm_eps = *c.norm_eps;
  if (c.n_experts) s.n_experts = *c.n_experts;
  if (c.top_k) s.top_k = *c.top_k;
  if (c.capacity_factor) s.capacity_factor = *c.capacity_factor;
  if (c.moe_aux_weight) s.moe_aux_weight = *c.moe_aux_weight;
  if (custom) s.name += "+custom";
  validate_spec(s);
  return s;
}

std::vector<MatrixShape> matrix_shapes(const ModelSpec& s) {
  std::vector<MatrixShape> m = {{"embed_tokens", s.padded_vocab(), s.d_model}};
  if (!s.tie_embeddings) m.push_back({"lm_head", s.padded_vocab(), s.d_model});
  const int64_t ff = s.padded_d_ff();
  if (s.arch == Arch::kDecoder) {
    const int64_t q = s.n_head * s.head_dim(), kv = s.n_kv_head * s.head_dim();
    m.push_back({"q_proj", q, s.d_model});
    m.push_back({"o_proj", s.d_model, q});
    m.push_back({"k_proj, v_proj", kv, s.d_model});
    m.push_back({s.parts.gated_ffn ? "gate_proj, up_proj" : "up_proj", ff, s.d_model});
    m.push_back({"down_proj", s.d_model, ff});
    m.push_back({"attention head_dim", s.head_dim(), s.head_dim()});
  } else if (s.arch == Arch::kResNetBk) {
    m.push_back({"bk.in_proj", 3 * s.n_head, s.d_model});
    m.push_back({"bk.out_proj", s.d_model, 2 * s.n_head});
    m.push_back({"mlp.router", s.n_experts, s.d_model});
    m.push_back({"mlp.experts gate, up", s.d_model, ff});
    m.push_back({"mlp.experts down", ff, s.d_model});
  } else if (s.arch == Arch::kAmxMoe) {
    m.push_back({"dense up_proj", ff, s.d_model});
    m.push_back({"dense down_proj", s.d_model, ff});
    m.push_back({"mlp.router", s.n_experts, s.d_model});
    m.push_back({"mlp.experts gate, up", s.d_model, ff});
    m.push_back({"mlp.experts down", ff, s.d_model});
  } else {
    m.push_back({"up_proj", ff, s.d_model});
    m.push_back({"down_proj", s.d_model, ff});
  }
  return m;
}

std::vector<std::string> misaligned_dims(const ModelSpec& s, int64_t multiple) {
  std::vector<std::string> out;
  for (const auto& m : matrix_shapes(s))
    if (m.rows % multiple != 0 || m.cols % multiple != 0)
      out.push_back(strprintf("%s (%lld x %lld)", m.name.c_str(), static_cast<long long>(m.rows),
                              static_cast<long long>(m.cols)));
  return out;
}

const char* to_string(Arch a) {
  switch (a) {
    case Arch::kDecoder:
      return "decoder";
    case Arch::kMlp:
      return "mlp";
    case Arch::kResNetBk:
      return "resnet_bk";
    case Arch::kAmxMoe:
      return "amx_moe";
  }
  return "?";
}

// Note [Folder overrides]
// With --init-from the architecture is the folder's config.json, and its safetensors fix every
// shape. A model.* key the user set is applied where it changes no weight (the sequence length,
// RoPE's base, the norms' epsilon) or grows one in a defined way (a larger vocabulary, whose new
// rows start from the initialisation: the out-of-vocabulary refusal advises it); a key that would
// change a shape the weights fix is refused with the folder's value, never silently dropped.
ModelSpec spec_with_folder_overrides(ModelSpec s, const ModelConfig& c, const std::string& source) {
  const auto fixed = [&](const char* key, const std::optional<int64_t>& set, int64_t folder) {
    TANDEM_CHECK(!set || *set == folder, "model.", key, "=", set.value_or(0), " differs from ", source, "'s ", folder,
                 ": the folder's weights fix it; drop the key (or convert the folder)");
  };
  fixed("n_layer", c.n_layer, s.n_layer);
  fixed("d_model", c.d_model, s.d_model);
  fixed("n_head", c.n_head, s.n_head);
  fixed("n_kv_head", c.n_kv_head, s.n_kv_head);
  fixed("d_ff", c.d_ff, s.d_ff);
  fixed("n_experts", c.n_experts, s.n_experts);
  fixed("top_k", c.top_k, s.top_k);
  fixed("n_dense", c.n_dense, s.n_dense);
  TANDEM_CHECK(!c.tie_embeddings || *c.tie_embeddings == s.tie_embeddings,
               "model.tie_embeddings=", *c.tie_embeddings ? "true" : "false", " differs from ", source,
               "'s: the folder's weights fix it; drop the key");
  if (c.vocab_size && *c.vocab_size != s.vocab_size) {
    TANDEM_CHECK(*c.vocab_size > s.vocab_size, "model.vocab_size=", *c.vocab_size, " is below ", source,
                 "'s vocabulary of ", s.vocab_size, ": its rows cannot be dropped; drop the key");
    log::info(
        strprintf("model.vocab_size=%lld grows %s's vocabulary of %lld: rows %lld .. %lld of the embedding%s "
                  "start from the initialisation",
                  static_cast<long long>(*c.vocab_size), source.c_str(), static_cast<long long>(s.vocab_size),
                  static_cast<long long>(s.vocab_size), static_cast<long long>(*c.vocab_size - 1),
                  s.tie_embeddings ? "" : " and the head"));
    s.vocab_size = *c.vocab_size;
  }
  if (c.max_seq_len) s.max_seq_len = *c.max_seq_len;
  if (c.rope_theta) s.rope_theta = *c.rope_theta;
  if (c.norm_eps) s.norm_eps = *c.norm_eps;
  TANDEM_CHECK(!c.capacity_factor && !c.moe_aux_weight, "model.capacity_factor and model.moe_aux_weight apply to ",
               "tandem's MoE presets, not to ", source, "; drop them");
  return s;
}

}  // namespace tandem
