#include "tandem/models/llama.h"

#include <cmath>

#include "tandem/core/error.h"
#include "tandem/models/init.h"

namespace tandem {
namespace {

constexpr double kInitStd = 0.02;

Projection linear(int64_t in, int64_t out, double std) { return Projection(in, out, std); }

}  // namespace

ProjectionImpl::ProjectionImpl(int64_t in, int64_t out, double std) {
  auto w = torch::empty({out, in});
  init_normal(w, std);
  weight = register_parameter("weight", w);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : dim_(dim), eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

// A low-precision scale (the offload engine's bf16 working copy) meets the fp32 residual stream
// in fp32, as an fp32 parameter would: its gradient is reduced over tokens in fp32, rounded once.
torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  return at::rms_norm(x, {dim_}, weight.scalar_type() == x.scalar_type() ? weight : weight.to(x.scalar_type()), eps_);
}

RopeTable::RopeTable(const ModelSpec& spec) {
  const int64_t hd = spec.head_dim();
  auto inv_freq = 1.0 / torch::pow(spec.rope_theta, torch::arange(0, hd, 2, torch::kFloat64) / double(hd));
  if (spec.rope_scaling.factor > 0) {
    // Llama 3.1 frequency scaling: long wavelengths divided by `factor`, short ones kept,
    // a smooth blend between (HF's "llama3" rope_type).
    const auto& rs = spec.rope_scaling;
    const double low_wavelen = rs.original_max_position / rs.low_freq_factor;
    const double high_wavelen = rs.original_max_position / rs.high_freq_factor;
    auto wavelen = 2 * M_PI / inv_freq;
    auto scaled = torch::where(wavelen > low_wavelen, inv_freq / rs.factor, inv_freq);
    auto smooth =
        (rs.original_max_position / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
    auto blended = (1 - smooth) * scaled / rs.factor + smooth * scaled;
    auto medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen);
    inv_freq = torch::where(medium, blended, scaled);
  }
  auto t = torch::arange(spec.max_seq_len, torch::kFloat64);
  auto freqs = torch::outer(t, inv_freq);     // (T, hd/2)
  auto emb = torch::cat({freqs, freqs}, -1);  // (T, hd)
  cos_ = emb.cos().to(torch::kFloat32);
  sin_ = emb.sin().to(torch::kFloat32);
}

std::pair<torch::Tensor, torch::Tensor> RopeTable::get(int64_t T, const torch::Device& device,
                                                       torch::ScalarType dtype) {
  TANDEM_CHECK(T <= cos_.size(0), "sequence length ", T, " exceeds model.max_seq_len ", cos_.size(0),
               "; lower train.seq_len or raise model.max_seq_len");
  std::lock_guard<std::mutex> lock(mutex_);
  const auto key = std::make_pair(device.str(), static_cast<int>(dtype));
  auto it = cache_.find(key);
  if (it == cache_.end())
    it = cache_.emplace(key, std::make_pair(cos_.to(device, dtype), sin_.to(device, dtype))).first;
  return {it->second.first.narrow(0, 0, T), it->second.second.narrow(0, 0, T)};
}

// Note [Zero padding keeps the function]
// Feed-forward units beyond spec.d_ff (padding to a multiple of 64) start with zero input rows
// (gate, up) and zero output columns (down). Their activation is silu(0) * 0 = 0 (gelu(0) = 0), and
// every gradient that reaches them is a product with one of those zeros, so they stay exactly zero
// under any optimizer whose update of a zero parameter with a zero gradient is zero (AdamW, Adam,
// SGD, Lion: decay of 0 is 0). Checkpoints in HF form drop them (Model::hf_shape).
void zero_ff_padding(const ModelSpec& spec, const torch::Tensor& in1, const torch::Tensor& in2,
                     const torch::Tensor& out) {
  const int64_t pad = spec.padded_d_ff() - spec.d_ff;
  if (pad == 0) return;
  torch::NoGradGuard g;
  for (const auto& w : {in1, in2})
    if (w.defined()) w.narrow(0, spec.d_ff, pad).zero_();
  out.narrow(1, spec.d_ff, pad).zero_();
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, half);
  auto rotated = torch::cat({-x2, x1}, -1);
  return x * cos + rotated * sin;
}

EmbeddingBlock::EmbeddingBlock(const ModelSpec& spec) : Block(BlockKind::kEmbedding, "embed", "model.") {
  auto w = torch::empty({spec.padded_vocab(), spec.d_model});  // (V_pad, C)
  init_normal(w, kInitStd);
  embed_tokens = register_module(
      "embed_tokens", torch::nn::Embedding(torch::nn::EmbeddingOptions(spec.padded_vocab(), spec.d_model)._weight(w)));
}

// Note [fp32 residual stream]
// The residual stream is fp32 whatever the weights' dtype, as it is with fp32 parameters under
// autocast: with a bf16 embedding table (the offload engine's working copy) the lookup reads an
// fp32 view of it, so the stream starts in fp32 and the table's gradient is accumulated over
// tokens in fp32 and rounded to bf16 once.
torch::Tensor EmbeddingBlock::forward(const torch::Tensor& tokens) {
  const auto& w = embed_tokens->weight;
  if (w.scalar_type() == torch::kFloat32) return embed_tokens->forward(tokens);
  return torch::embedding(w.to(torch::kFloat32), tokens);
}

LlamaLayer::LlamaLayer(const ModelSpec& spec, int64_t index, std::shared_ptr<RopeTable> rope)
    : Block(BlockKind::kLayer, "layer." + std::to_string(index), "model.layers." + std::to_string(index) + "."),
      d_model_(spec.d_model),
      n_head_(spec.n_head),
      n_kv_head_(spec.n_kv_head),
      head_dim_(spec.head_dim()),
      rope_(std::move(rope)) {
  const double out_std = kInitStd / std::sqrt(2.0 * spec.n_layer);  // scaled residual projections
  const int64_t kv_dim = n_kv_head_ * head_dim_;
  input_layernorm_ = register_module("input_layernorm", RMSNorm(spec.d_model, spec.norm_eps));
  attn_ = register_module("self_attn", std::make_shared<Attention>());
  attn_->q_proj = attn_->register_module("q_proj", linear(d_model_, d_model_, kInitStd));
  attn_->k_proj = attn_->register_module("k_proj", linear(d_model_, kv_dim, kInitStd));
  attn_->v_proj = attn_->register_module("v_proj", linear(d_model_, kv_dim, kInitStd));
  attn_->o_proj = attn_->register_module("o_proj", linear(d_model_, d_model_, out_std));
  post_attention_layernorm_ = register_module("post_attention_layernorm", RMSNorm(spec.d_model, spec.norm_eps));
  mlp_ = register_module("mlp", std::make_shared<SwiGlu>());
  const int64_t ff = spec.padded_d_ff();
  mlp_->gate_proj = mlp_->register_module("gate_proj", linear(d_model_, ff, kInitStd));
  mlp_->up_proj = mlp_->register_module("up_proj", linear(d_model_, ff, kInitStd));
  mlp_->down_proj = mlp_->register_module("down_proj", linear(ff, d_model_, out_std));
  zero_ff_padding(spec, mlp_->gate_proj->weight, mlp_->up_proj->weight, mlp_->down_proj->weight);
}

torch::Tensor LlamaLayer::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1);
  // Attention. x: (B, T, C) residual stream.
  auto h = input_layernorm_->forward(x);
  auto q = attn_->q_proj->forward(h).view({B, T, n_head_, head_dim_}).transpose(1, 2);     // (B, H, T, hd)
  auto k = attn_->k_proj->forward(h).view({B, T, n_kv_head_, head_dim_}).transpose(1, 2);  // (B, KV, T, hd)
  auto v = attn_->v_proj->forward(h).view({B, T, n_kv_head_, head_dim_}).transpose(1, 2);  // (B, KV, T, hd)
  auto [cos, sin] = rope_->get(T, q.device(), q.scalar_type());
  q = apply_rope(q, cos, sin);
  k = apply_rope(k, cos, sin);
  auto y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true,
                                            /*scale=*/std::nullopt, /*enable_gqa=*/n_kv_head_ != n_head_);
  y = y.transpose(1, 2).reshape({B, T, d_model_});  // (B, T, C)
  auto r = x + attn_->o_proj->forward(y);
  // SwiGLU feed-forward.
  auto g = post_attention_layernorm_->forward(r);
  auto f = mlp_->down_proj->forward(torch::silu(mlp_->gate_proj->forward(g)) * mlp_->up_proj->forward(g));
  return r + f;
}

MlpLayer::MlpLayer(const ModelSpec& spec, int64_t index)
    : Block(BlockKind::kLayer, "layer." + std::to_string(index), "model.layers." + std::to_string(index) + ".") {
  norm_ = register_module("input_layernorm", RMSNorm(spec.d_model, spec.norm_eps));
  auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  const int64_t ff = spec.padded_d_ff();
  up_ = mlp->register_module("up_proj", linear(spec.d_model, ff, kInitStd));
  down_ = mlp->register_module("down_proj", linear(ff, spec.d_model, kInitStd / std::sqrt(2.0 * spec.n_layer)));
  zero_ff_padding(spec, up_->weight, torch::Tensor(), down_->weight);
}

torch::Tensor MlpLayer::forward(const torch::Tensor& x) {
  return x + down_->forward(torch::gelu(up_->forward(norm_->forward(x))));
}

HeadBlock::HeadBlock(const ModelSpec& spec, const torch::Tensor& tied_weight)
    : Block(BlockKind::kHead, "head", ""), tied_weight_(tied_weight) {
  norm_ = register_module("norm", RMSNorm(spec.d_model, spec.norm_eps));
  if (!tied_weight_.defined())
    lm_head_ = register_module("lm_head", linear(spec.d_model, spec.padded_vocab(), kInitStd));
}

torch::Tensor HeadBlock::forward(const torch::Tensor& x) {
  auto h = norm_->forward(x);
  return lm_head_ ? lm_head_->forward(h) : torch::nn::functional::linear(h, tied_weight_);  // (B, T, V_pad)
}

std::vector<NamedTensor> HeadBlock::hf_parameters() {
  std::vector<NamedTensor> out{{"model.norm.weight", norm_->weight}};
  if (lm_head_) out.emplace_back("lm_head.weight", lm_head_->weight);
  return out;
}

}  // namespace tandem
