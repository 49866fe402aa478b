#include "tandem/serve/decoder_weights.h"

#include "tandem/core/error.h"
#include "tandem/memory/pinned.h"

namespace tandem {

namespace {

// One tensor of a layer's flat buffer, in buffer order: the matrices first, so that each starts at
// an offset that is a multiple of d_model elements.
struct LayerPart {
  const char* name;
  int64_t rows, cols;  // cols 0: a vector of `rows`
};

std::vector<LayerPart> layer_parts(const ModelSpec& spec) {
  const int64_t C = spec.d_model, kv = spec.n_kv_head * spec.head_dim(), F = spec.d_ff;
  return {
      {"self_attn.q_proj.weight", C, C}, {"self_attn.k_proj.weight", kv, C}, {"self_attn.v_proj.weight", kv, C},
      {"self_attn.o_proj.weight", C, C}, {"mlp.gate_proj.weight", F, C},     {"mlp.up_proj.weight", F, C},
      {"mlp.down_proj.weight", C, F},    {"input_layernorm.weight", C, 0},   {"post_attention_layernorm.weight", C, 0}};
}

torch::Tensor view_at(const torch::Tensor& flat, int64_t& offset, int64_t rows, int64_t cols) {
  const int64_t n = rows * (cols > 0 ? cols : 1);
  auto v = flat.narrow(0, offset, n);
  offset += n;
  return cols > 0 ? v.view({rows, cols}) : v;
}

void copy_weight(const torch::Tensor& dst, const TensorLookup& lookup, const std::string& name,
                 const std::string& source) {
  const auto t = lookup(name);
  TANDEM_CHECK(t.has_value(), source, ": tensor '", name,
               "' is missing; give a Llama checkpoint (tandem's, or a Hugging Face folder with safetensors)");
  TANDEM_CHECK(t->sizes() == dst.sizes(), source, ": tensor '", name, "' has shape ", t->sizes(), " but config.json ",
               "implies ", dst.sizes(), "; the weights and config.json do not belong together");
  TANDEM_CHECK(t->is_floating_point(), source, ": tensor '", name, "' has dtype ", t->scalar_type(),
               "; expected floating-point weights");
  dst.copy_(*t);
}

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> layer_named_views(const torch::Tensor& flat, const ModelSpec& spec) {
  TANDEM_ASSERT(flat.numel() == decoder_layer_numel(spec), "layer buffer of ", flat.numel(), " elements, expected ",
                decoder_layer_numel(spec));
  std::vector<std::pair<std::string, torch::Tensor>> out;
  int64_t offset = 0;
  for (const auto& p : layer_parts(spec)) out.emplace_back(p.name, view_at(flat, offset, p.rows, p.cols));
  return out;
}

LayerWeights layer_views(const torch::Tensor& flat, const ModelSpec& spec) {
  TANDEM_ASSERT(flat.numel() == decoder_layer_numel(spec), "layer buffer of ", flat.numel(), " elements, expected ",
                decoder_layer_numel(spec));
  const int64_t C = spec.d_model, kv = spec.n_kv_head * spec.head_dim(), F = spec.d_ff;
  int64_t offset = 0;
  LayerWeights w;
  w.qkv = view_at(flat, offset, C + 2 * kv, C);
  w.o = view_at(flat, offset, C, C);
  w.gate_up = view_at(flat, offset, 2 * F, C);
  w.down = view_at(flat, offset, C, F);
  w.input_norm = view_at(flat, offset, C, 0);
  w.post_norm = view_at(flat, offset, C, 0);
  return w;
}

DecoderWeights::DecoderWeights(const ModelSpec& spec, WeightPlacement placement, const TensorLookup& lookup,
                               const std::string& source)
    : spec_(spec), placement_(std::move(placement)) {
  TANDEM_ASSERT(static_cast<int64_t>(placement_.plan.layers.size()) == spec_.n_layer, "residency plan of ",
                placement_.plan.layers.size(), " layers for a model of ", spec_.n_layer);
  torch::NoGradGuard no_grad;
  const auto options = torch::TensorOptions().dtype(placement_.dtype).device(placement_.device);
  embed_ = torch::empty({spec_.vocab_size, spec_.d_model}, options);
  copy_weight(embed_, lookup, "model.embed_tokens.weight", source);
  final_norm_ = torch::empty({spec_.d_model}, options);
  copy_weight(final_norm_, lookup, "model.norm.weight", source);
  if (spec_.tie_embeddings) {
    lm_head_ = embed_;
  } else {
    lm_head_ = torch::empty({spec_.vocab_size, spec_.d_model}, options);
    copy_weight(lm_head_, lookup, "lm_head.weight", source);
  }

  const int64_t numel = decoder_layer_numel(spec_);
  // Host buffers are pinned only when there is a device to copy them to.
  const HostMemory host_memory = placement_.device.is_cpu() ? HostMemory::kPageable : HostMemory::kPinned;
  std::vector<torch::Tensor> host(static_cast<size_t>(spec_.n_layer));
  resident_.resize(static_cast<size_t>(spec_.n_layer));
  for (int64_t i = 0; i < spec_.n_layer; ++i) {
    const bool streamed = placement_.plan.layers[static_cast<size_t>(i)] == LayerHome::kHost;
    auto flat = streamed ? host_tensor(numel, placement_.dtype, host_memory) : torch::empty({numel}, options);
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    for (const auto& [name, view] : layer_named_views(flat, spec_)) copy_weight(view, lookup, prefix + name, source);
    (streamed ? host : resident_)[static_cast<size_t>(i)] = flat;
  }
  if (placement_.plan.streamed() > 0)
    stream_ = std::make_unique<LayerStream>(std::move(host), placement_.plan.slots, placement_.device);
}

LayerWeights DecoderWeights::acquire(int64_t layer) {
  const auto& flat = resident_.at(static_cast<size_t>(layer));
  return layer_views(flat.defined() ? flat : stream_->acquire(layer), spec_);
}

void DecoderWeights::release(int64_t layer) {
  if (!resident_.at(static_cast<size_t>(layer)).defined()) stream_->release(layer);
}

}  // namespace tandem
