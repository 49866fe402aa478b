#include "tandem/serve/decoder_weights.h"

#include "tandem/core/error.h"
#include "tandem/memory/pinned.h"
#include "tandem/models/family.h"

namespace tandem {

namespace {

using Part = DecoderWeights::Part;

// A layer's flat buffer in order, matrices first (each then starts at an offset that is a multiple
// of d_model elements), with the family's tensors that fill each part.
std::vector<Part> layer_parts(const ModelSpec& spec) {
  const FamilyNames& n = family_names(spec.family);
  const DecoderParts& p = spec.parts;
  const int64_t C = spec.d_model, q = spec.n_head * spec.head_dim(), kv = spec.n_kv_head * spec.head_dim();
  const int64_t F = spec.d_ff, ff_in = p.gated_ffn ? 2 * F : F;
  const std::string attn = n.attn + ".", mlp = n.mlp + ".";
  // The q/k/v (or gate/up) sources of a stacked part, for the suffix "weight" or "bias".
  const auto qkv = [&](const std::string& suffix) -> std::vector<Part::Source> {
    if (!n.qkv.empty()) return {{attn + n.qkv + "." + suffix, 0, q + 2 * kv}};
    return {
        {attn + n.q + "." + suffix, 0, q}, {attn + n.k + "." + suffix, q, kv}, {attn + n.v + "." + suffix, q + kv, kv}};
  };
  const auto gate_up = [&](const std::string& suffix) -> std::vector<Part::Source> {
    if (!n.gate_up.empty()) return {{mlp + n.gate_up + "." + suffix, 0, 2 * F}};
    if (!p.gated_ffn) return {{mlp + n.up + "." + suffix, 0, F}};
    return {{mlp + n.gate + "." + suffix, 0, F}, {mlp + n.up + "." + suffix, F, F}};
  };
  const auto one = [](const std::string& name, int64_t rows) { return std::vector<Part::Source>{{name, 0, rows}}; };
  std::vector<Part> parts = {
      {&LayerWeights::qkv, q + 2 * kv, C, 0, qkv("weight")},
      {&LayerWeights::o, C, q, 0, one(attn + n.o + ".weight", C)},
      {&LayerWeights::gate_up, ff_in, C, 0, gate_up("weight")},
      {&LayerWeights::down, C, F, 0, one(mlp + n.down + ".weight", C)},
  };
  if (p.qkv_bias) parts.push_back({&LayerWeights::qkv_bias, q + 2 * kv, 0, 0, qkv("bias")});
  if (p.o_bias) parts.push_back({&LayerWeights::o_bias, C, 0, 0, one(attn + n.o + ".bias", C)});
  if (p.mlp_bias) {
    parts.push_back({&LayerWeights::gate_up_bias, ff_in, 0, 0, gate_up("bias")});
    parts.push_back({&LayerWeights::down_bias, C, 0, 0, one(mlp + n.down + ".bias", C)});
  }
  const auto norm = [&](torch::Tensor LayerWeights::*weight, torch::Tensor LayerWeights::*bias,
                        const std::string& name) {
    parts.push_back({weight, C, 0, 0, one(name + ".weight", C)});
    if (p.norm == NormKind::kLayerNorm) {
      TANDEM_ASSERT(bias != nullptr, "a LayerNorm without a place for its bias");
      parts.push_back({bias, C, 0, 0, one(name + ".bias", C)});
    }
  };
  norm(&LayerWeights::attn_norm, &LayerWeights::attn_norm_bias, n.attn_norm);
  norm(&LayerWeights::ff_norm, &LayerWeights::ff_norm_bias, n.ff_norm);
  if (p.sandwich_norms) {
    norm(&LayerWeights::attn_out_norm, nullptr, n.attn_out_norm);
    norm(&LayerWeights::ff_out_norm, nullptr, n.ff_out_norm);
  }
  int64_t offset = 0;
  for (auto& part : parts) {
    part.offset = offset;
    offset += part.rows * std::max<int64_t>(part.cols, 1);
  }
  TANDEM_ASSERT(offset == decoder_layer_numel(spec), "layer buffer of ", offset, " elements, the plan counts ",
                decoder_layer_numel(spec));
  return parts;
}

// The tensor `name` of `lookup` into `dst` (rows of a part), converted; input-major matrices
// (GPT-2's Conv1D) transposed to (out, in).
void copy_weight(const torch::Tensor& dst, const TensorLookup& lookup, const std::string& name, bool input_major,
                 const std::string& source) {
  const auto t = lookup(name);
  TANDEM_CHECK(t.has_value(), source, ": tensor '", name,
               "' is missing; the folder's weights do not match its config.json (a checkpoint of another family?)");
  const auto w = input_major && t->dim() == 2 ? t->t() : *t;
  TANDEM_CHECK(w.sizes() == dst.sizes(), source, ": tensor '", name, "' has shape ", t->sizes(), " but config.json ",
               "implies ", input_major && t->dim() == 2 ? dst.t().sizes() : dst.sizes(),
               "; the weights and config.json do not belong together");
  TANDEM_CHECK(t->is_floating_point(), source, ": tensor '", name, "' has dtype ", t->scalar_type(),
               "; expected floating-point weights");
  dst.copy_(w);
}

}  // namespace

DecoderWeights::DecoderWeights(const ModelSpec& spec, WeightPlacement placement, const TensorLookup& lookup,
                               const std::string& source)
    : spec_(spec), placement_(std::move(placement)), parts_(layer_parts(spec)) {
  TANDEM_ASSERT(static_cast<int64_t>(placement_.plan.layers.size()) == spec_.n_layer, "residency plan of ",
                placement_.plan.layers.size(), " layers for a model of ", spec_.n_layer);
  torch::NoGradGuard no_grad;
  const FamilyNames& n = family_names(spec_.family);
  const auto options = torch::TensorOptions().dtype(placement_.dtype).device(placement_.device);
  const auto fixed = [&](std::vector<int64_t> shape, const std::string& name) {
    auto t = torch::empty(shape, options);
    copy_weight(t, lookup, name, false, source);
    return t;
  };
  embed_ = fixed({spec_.vocab_size, spec_.d_model}, n.base + n.embed + ".weight");
  if (spec_.parts.learned_positions)
    positions_ = fixed({spec_.max_seq_len, spec_.d_model}, n.base + n.positions + ".weight");
  // Note [Norms in fp32]: converted from the compute dtype, as norm_fp32 would at every step.
  final_norm_ = fixed({spec_.d_model}, n.base + n.final_norm + ".weight").to(torch::kFloat32);
  if (spec_.parts.norm == NormKind::kLayerNorm)
    final_norm_bias_ = fixed({spec_.d_model}, n.base + n.final_norm + ".bias").to(torch::kFloat32);
  lm_head_ = spec_.tie_embeddings ? embed_ : fixed({spec_.vocab_size, spec_.d_model}, "lm_head.weight");

  const int64_t numel = decoder_layer_numel(spec_);
  // Host buffers are pinned only when there is a device to copy them to.
  const HostMemory host_memory = placement_.device.is_cpu() ? HostMemory::kPageable : HostMemory::kPinned;
  std::vector<torch::Tensor> host(static_cast<size_t>(spec_.n_layer));
  resident_.resize(static_cast<size_t>(spec_.n_layer));
  for (int64_t i = 0; i < spec_.n_layer; ++i) {
    const bool streamed = placement_.plan.layers[static_cast<size_t>(i)] == LayerHome::kHost;
    auto flat = streamed ? host_tensor(numel, placement_.dtype, host_memory) : torch::empty({numel}, options);
    load_layer(flat, i, lookup, source);
    norms_.push_back(norms_fp32(flat));
    (streamed ? host : resident_)[static_cast<size_t>(i)] = flat;
  }
  if (placement_.plan.streamed() > 0)
    stream_ = std::make_unique<LayerStream>(std::move(host), placement_.plan.slots, placement_.device);
}

void DecoderWeights::load_layer(const torch::Tensor& flat, int64_t layer, const TensorLookup& lookup,
                                const std::string& source) {
  const FamilyNames& n = family_names(spec_.family);
  const std::string prefix = n.base + n.layers + "." + std::to_string(layer) + ".";
  for (const auto& part : parts_) {
    auto view = flat.narrow(0, part.offset, part.rows * std::max<int64_t>(part.cols, 1));
    if (part.cols > 0) view = view.view({part.rows, part.cols});
    for (const auto& s : part.sources)
      copy_weight(view.narrow(0, s.row0, s.rows), lookup, prefix + s.name, n.input_major && part.cols > 0, source);
  }
}

LayerWeights DecoderWeights::views(const torch::Tensor& flat) const {
  LayerWeights w;
  for (const auto& part : parts_) {
    auto v = flat.narrow(0, part.offset, part.rows * std::max<int64_t>(part.cols, 1));
    w.*(part.field) = part.cols > 0 ? v.view({part.rows, part.cols}) : v;
  }
  return w;
}

// Note [Norms in fp32]
// The decoder normalises in fp32 (Note [Generation forward]): norm_fp32 converts a weight in the
// compute dtype to fp32 at every call, a kernel launch per norm and layer at every step (two per
// layer, a tenth of a decode step's kernels). The layers' norms are therefore kept apart from their
// flat buffers, converted to fp32 once on the device (a few KiB a layer, resident even for streamed
// layers), and acquire() hands these out: the same values norm_fp32 would make, so the same output.
LayerWeights DecoderWeights::norms_fp32(const torch::Tensor& flat) const {
  const LayerWeights v = views(flat);
  LayerWeights n;
  const auto f32 = [&](const torch::Tensor& t) {
    return t.defined() ? t.to(placement_.device, torch::kFloat32, /*non_blocking=*/false, /*copy=*/true)
                       : torch::Tensor();
  };
  n.attn_norm = f32(v.attn_norm), n.attn_norm_bias = f32(v.attn_norm_bias);
  n.ff_norm = f32(v.ff_norm), n.ff_norm_bias = f32(v.ff_norm_bias);
  n.attn_out_norm = f32(v.attn_out_norm), n.ff_out_norm = f32(v.ff_out_norm);
  return n;
}

LayerWeights DecoderWeights::acquire(int64_t layer) {
  const auto& flat = resident_.at(static_cast<size_t>(layer));
  LayerWeights w = views(flat.defined() ? flat : stream_->acquire(layer));
  const LayerWeights& n = norms_.at(static_cast<size_t>(layer));
  w.attn_norm = n.attn_norm, w.attn_norm_bias = n.attn_norm_bias;
  w.ff_norm = n.ff_norm, w.ff_norm_bias = n.ff_norm_bias;
  w.attn_out_norm = n.attn_out_norm, w.ff_out_norm = n.ff_out_norm;
  return w;
}

void DecoderWeights::release(int64_t layer) {
  if (!resident_.at(static_cast<size_t>(layer)).defined()) stream_->release(layer);
}

}  // namespace tandem
