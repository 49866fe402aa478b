#include "tandem/models/decoder.h"

#include <cmath>

#include "tandem/core/error.h"
#include "tandem/models/family.h"
#include "tandem/models/init.h"

namespace tandem {
namespace {

constexpr double kInitStd = 0.02;

std::string layer_prefix(const FamilyNames& n, int64_t index) {
  return n.base + n.layers + "." + std::to_string(index) + ".";
}

}  // namespace

torch::Tensor activate(const torch::Tensor& x, Activation act) {
  switch (act) {
    case Activation::kSilu:
      return torch::silu(x);
    case Activation::kGelu:
      return torch::gelu(x);
    case Activation::kGeluTanh:
      return torch::gelu(x, "tanh");
  }
  return x;
}

EmbeddingBlock::EmbeddingBlock(const ModelSpec& spec)
    : Block(BlockKind::kEmbedding, "embed", family_names(spec.family).base), vocab_(spec.vocab_size) {
  const FamilyNames& n = family_names(spec.family);
  auto w = torch::empty({spec.padded_vocab(), spec.d_model});  // (V_pad, C)
  init_normal(w, kInitStd);
  embed_tokens = register_module(
      n.embed, torch::nn::Embedding(torch::nn::EmbeddingOptions(spec.padded_vocab(), spec.d_model)._weight(w)));
  if (spec.arch == Arch::kDecoder && spec.parts.learned_positions) {
    auto p = torch::empty({spec.max_seq_len, spec.d_model});
    init_normal(p, kInitStd);
    positions_ = register_module(
        n.positions, torch::nn::Embedding(torch::nn::EmbeddingOptions(spec.max_seq_len, spec.d_model)._weight(p)));
  }
  if (spec.arch == Arch::kDecoder && spec.parts.scale_embedding) scale_ = std::sqrt(double(spec.d_model));
}

// Note [fp32 residual stream]
// The residual stream is fp32 whatever the weights' dtype, as it is with fp32 parameters under
// autocast: with a bf16 embedding table (the offload engine's working copy) the lookup reads an
// fp32 view of it, so the stream starts in fp32 and the table's gradient is accumulated over
// tokens in fp32 and rounded to bf16 once. The position table and Gemma's scale join in fp32.
torch::Tensor EmbeddingBlock::forward(const torch::Tensor& tokens) {
  const auto lookup = [](torch::nn::Embedding& e, const torch::Tensor& ids) {
    const auto& w = e->weight;
    return w.scalar_type() == torch::kFloat32 ? e->forward(ids) : torch::embedding(w.to(torch::kFloat32), ids);
  };
  auto x = lookup(embed_tokens, tokens);
  if (positions_) {
    const int64_t T = tokens.size(-1), max = positions_->weight.size(0);
    TANDEM_CHECK(T <= max, "sequence length ", T, " exceeds the ", max,
                 " learned positions; lower train.seq_len to at most ", max);
    x = x + lookup(positions_, torch::arange(T, tokens.options()));
  }
  return scale_ > 0 ? x * scale_ : x;
}

std::vector<int64_t> EmbeddingBlock::hf_shape(const std::string& name, const torch::Tensor& param) const {
  auto shape = param.sizes().vec();
  if (param.is_same(embed_tokens->weight)) shape[0] = vocab_;
  (void)name;
  return shape;
}

DecoderLayer::DecoderLayer(const ModelSpec& spec, int64_t index, std::shared_ptr<RopeTable> rope)
    : Block(BlockKind::kLayer, "layer." + std::to_string(index), layer_prefix(family_names(spec.family), index)),
      n_head_(spec.n_head),
      n_kv_head_(spec.n_kv_head),
      head_dim_(spec.head_dim()),
      d_ff_(spec.d_ff),
      window_(spec.window(index)),
      act_(spec.parts.act),
      rope_(std::move(rope)) {
  const FamilyNames& n = family_names(spec.family);
  const auto norm = [&](const std::string& name) {
    return register_module(name, Norm(spec.d_model, spec.norm_eps, spec.parts.norm));
  };
  attn_norm_ = norm(n.attn_norm);
  build_attention(spec);
  if (spec.parts.sandwich_norms) attn_out_norm_ = norm(n.attn_out_norm);
  ff_norm_ = norm(n.ff_norm);
  build_feed_forward(spec);
  if (spec.parts.sandwich_norms) ff_out_norm_ = norm(n.ff_out_norm);
  attention_options_.scale = spec.parts.query_scale;
  attention_options_.softcap = spec.parts.attn_softcap;
}

void DecoderLayer::build_attention(const ModelSpec& spec) {
  const FamilyNames& n = family_names(spec.family);
  const DecoderParts& p = spec.parts;
  const int64_t C = spec.d_model, q_dim = n_head_ * head_dim_, kv_dim = n_kv_head_ * head_dim_;
  const double out_std = kInitStd / std::sqrt(2.0 * spec.n_layer);  // scaled residual projections
  auto attn = register_module(n.attn, std::make_shared<torch::nn::Module>());
  const auto proj = [&](const std::string& name, int64_t in, int64_t out, double std, bool bias) {
    return attn->register_module(name, Projection(in, out, std, bias, n.input_major));
  };
  if (!n.qkv.empty()) {
    qkv_ = proj(n.qkv, C, q_dim + 2 * kv_dim, kInitStd, p.qkv_bias);
  } else {
    q_ = proj(n.q, C, q_dim, kInitStd, p.qkv_bias);
    k_ = proj(n.k, C, kv_dim, kInitStd, p.qkv_bias);
    v_ = proj(n.v, C, kv_dim, kInitStd, p.qkv_bias);
  }
  o_ = proj(n.o, q_dim, C, out_std, p.o_bias);
}

// Note [Zero padding keeps the function]
// Feed-forward units beyond spec.d_ff (padding to a multiple of 64) start with zero input rows
// and biases (gate, up) and zero output columns (down). Their activation is act(0) * 0 = 0 (silu,
// gelu: act(0) = 0), and every gradient that reaches them is a product with one of those zeros, so
// they stay exactly zero under any optimizer whose update of a zero parameter with a zero gradient
// is zero (AdamW, Adam, SGD, Lion: decay of 0 is 0). Checkpoints in HF form drop them (hf_shape).
void DecoderLayer::build_feed_forward(const ModelSpec& spec) {
  const FamilyNames& n = family_names(spec.family);
  const DecoderParts& p = spec.parts;
  const int64_t C = spec.d_model, ff = spec.padded_d_ff();
  const double out_std = kInitStd / std::sqrt(2.0 * spec.n_layer);
  auto mlp = register_module(n.mlp, std::make_shared<torch::nn::Module>());
  const auto proj = [&](const std::string& name, int64_t in, int64_t out, double std) {
    return mlp->register_module(name, Projection(in, out, std, p.mlp_bias, n.input_major));
  };
  if (!n.gate_up.empty()) {
    gate_up_ = proj(n.gate_up, C, 2 * ff, kInitStd);  // fused: never padded (ModelSpec::padded_d_ff)
  } else {
    if (p.gated_ffn) gate_ = proj(n.gate, C, ff, kInitStd);
    up_ = proj(n.up, C, ff, kInitStd);
  }
  down_ = proj(n.down, ff, C, out_std);
  if (ff == spec.d_ff) return;
  const std::string mlp_prefix = hf_prefix_ + n.mlp + ".";
  for (auto [name, pr] : {std::make_pair(n.gate, gate_), std::make_pair(n.up, up_)}) {
    if (!pr) continue;
    pr->zero_outputs_from(spec.d_ff);
    hf_shapes_[mlp_prefix + name + ".weight"] = pr->weight_shape(C, spec.d_ff);
    if (pr->bias.defined()) hf_shapes_[mlp_prefix + name + ".bias"] = {spec.d_ff};
  }
  down_->zero_inputs_from(spec.d_ff);
  hf_shapes_[mlp_prefix + n.down + ".weight"] = down_->weight_shape(spec.d_ff, C);
}

std::vector<int64_t> DecoderLayer::hf_shape(const std::string& name, const torch::Tensor& param) const {
  const auto it = hf_shapes_.find(name);
  return it == hf_shapes_.end() ? param.sizes().vec() : it->second;
}

torch::Tensor DecoderLayer::attention(const torch::Tensor& h) {
  const int64_t B = h.size(0), T = h.size(1), q_dim = n_head_ * head_dim_, kv_dim = n_kv_head_ * head_dim_;
  torch::Tensor q, k, v;
  if (qkv_) {
    const auto a = qkv_->forward(h);  // (B, T, q_dim + 2 kv_dim): q, k, v
    q = a.narrow(-1, 0, q_dim), k = a.narrow(-1, q_dim, kv_dim), v = a.narrow(-1, q_dim + kv_dim, kv_dim);
  } else {
    q = q_->forward(h), k = k_->forward(h), v = v_->forward(h);
  }
  q = q.reshape({B, T, n_head_, head_dim_}).transpose(1, 2);     // (B, H, T, hd)
  k = k.reshape({B, T, n_kv_head_, head_dim_}).transpose(1, 2);  // (B, KV, T, hd)
  v = v.reshape({B, T, n_kv_head_, head_dim_}).transpose(1, 2);  // (B, KV, T, hd)
  if (rope_) {
    auto [cos, sin] = rope_->get(T, q.device(), q.scalar_type());
    q = apply_rope(q, cos, sin);
    k = apply_rope(k, cos, sin);
  }
  const auto mask = window_ > 0 ? causal_mask(T, window_, q.device()) : torch::Tensor();
  auto y = attend(q, k, v, mask, attention_options_);  // (B, H, T, hd)
  return o_->forward(y.transpose(1, 2).reshape({B, T, q_dim}));
}

torch::Tensor DecoderLayer::feed_forward(const torch::Tensor& h) {
  if (gate_up_) {
    const auto a = gate_up_->forward(h);  // (B, T, 2 F): gate, up
    return down_->forward(activate(a.narrow(-1, 0, d_ff_), act_) * a.narrow(-1, d_ff_, d_ff_));
  }
  if (gate_) return down_->forward(activate(gate_->forward(h), act_) * up_->forward(h));
  return down_->forward(activate(up_->forward(h), act_));
}

torch::Tensor DecoderLayer::forward(const torch::Tensor& x) {
  // x: (B, T, C), the fp32 residual stream.
  auto a = attention(attn_norm_->forward(x));
  if (attn_out_norm_) a = attn_out_norm_->forward(a);
  const auto r = x + a;
  auto f = feed_forward(ff_norm_->forward(r));
  if (ff_out_norm_) f = ff_out_norm_->forward(f);
  return r + f;
}

HeadBlock::HeadBlock(const ModelSpec& spec, const torch::Tensor& tied_weight)
    : Block(BlockKind::kHead, "head", ""),
      tied_weight_(tied_weight),
      norm_name_(family_names(spec.family).base + family_names(spec.family).final_norm),
      softcap_(spec.arch == Arch::kDecoder ? spec.parts.final_softcap : 0),
      vocab_(spec.vocab_size) {
  norm_ = register_module(
      "norm", Norm(spec.d_model, spec.norm_eps, spec.arch == Arch::kDecoder ? spec.parts.norm : NormKind::kRms));
  if (!tied_weight_.defined())
    lm_head_ = register_module("lm_head", Projection(spec.d_model, spec.padded_vocab(), kInitStd));
}

torch::Tensor HeadBlock::forward(const torch::Tensor& x) {
  auto h = norm_->forward(x);
  auto logits = lm_head_ ? lm_head_->forward(h) : torch::nn::functional::linear(h, tied_weight_);  // (B, T, V_pad)
  return softcap_ > 0 ? torch::tanh(logits / softcap_) * softcap_ : logits;
}

std::vector<NamedTensor> HeadBlock::hf_parameters() {
  std::vector<NamedTensor> out{{norm_name_ + ".weight", norm_->weight}};
  if (norm_->bias.defined()) out.emplace_back(norm_name_ + ".bias", norm_->bias);
  if (lm_head_) out.emplace_back("lm_head.weight", lm_head_->weight);
  return out;
}

std::vector<int64_t> HeadBlock::hf_shape(const std::string& name, const torch::Tensor& param) const {
  auto shape = param.sizes().vec();
  if (name == "lm_head.weight") shape[0] = vocab_;
  return shape;
}

}  // namespace tandem
