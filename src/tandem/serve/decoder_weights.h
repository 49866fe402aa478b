#pragma once
// The weights generation reads, under a residency plan: the embedding (and GPT-2's position table),
// the final norm and the output projection on the device; each decoder layer's weights in one flat
// buffer, on the device or in pinned host memory streamed up per use (Note [Streamed layers]). Read
// from a folder's HF-named tensors (models/family.h: any family's names, fused or separate q/k/v,
// input-major GPT-2 weights) straight into their final place, layout and dtype.

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "tandem/formats/weight_files.h"
#include "tandem/models/spec.h"
#include "tandem/serve/layer_stream.h"
#include "tandem/serve/residency_plan.h"

namespace tandem {

/// Views of one decoder layer's weights into its flat buffer, in the compute dtype, (out, in) and
/// with q/k/v and gate/up stacked whatever the family stores. The feed-forward has the checkpoint's
/// (unpadded) d_ff: tandem's zero padding adds nothing to the function (Note [Zero padding keeps
/// the function]). A part the model does not have is undefined.
struct LayerWeights {
  torch::Tensor qkv, qkv_bias;          // (H hd + 2 KV hd, C), (H hd + 2 KV hd)
  torch::Tensor o, o_bias;              // (C, H hd), (C)
  torch::Tensor gate_up, gate_up_bias;  // (2 F, C): gate and up stacked; ungated (GPT-2): (F, C), up only
  torch::Tensor down, down_bias;        // (C, F), (C)
  // The norms are fp32 (Note [Norms in fp32]), whatever the matrices' dtype.
  torch::Tensor attn_norm, attn_norm_bias;   // (C): before the attention (the bias: LayerNorm)
  torch::Tensor ff_norm, ff_norm_bias;       // (C): before the feed-forward
  torch::Tensor attn_out_norm, ff_out_norm;  // (C): Gemma2's norms of the two outputs
};

/// Where the weights go.
struct WeightPlacement {
  c10::Device device{c10::kCPU};
  torch::ScalarType dtype = torch::kFloat32;  ///< compute dtype of the matrices and norms
  ResidencyPlan plan;                         ///< from plan_residency
};

/// The decoder's weights (one instance per loaded model; used by one thread at a time).
class DecoderWeights {
 public:
  /// Allocates every buffer where `placement` says and copies each tensor of `lookup` in, converted.
  /// UserError naming `source` and the tensor when one is missing or has the wrong shape.
  DecoderWeights(const ModelSpec& spec, WeightPlacement placement, const TensorLookup& lookup,
                 const std::string& source);

  /// The model's shapes, and where its weights are.
  const ModelSpec& spec() const { return spec_; }
  const WeightPlacement& placement() const { return placement_; }
  /// The always-resident weights on the device.
  const torch::Tensor& embed() const { return embed_; }                      // (V, C)
  const torch::Tensor& positions() const { return positions_; }              // (max_seq_len, C); undefined without
  const torch::Tensor& final_norm() const { return final_norm_; }            // (C) fp32
  const torch::Tensor& final_norm_bias() const { return final_norm_bias_; }  // (C) fp32; LayerNorm only
  const torch::Tensor& lm_head() const { return lm_head_; }                  // (V, C); the embedding when tied

  /// Layer `layer`'s weights on the device, ready for work queued after this call.
  LayerWeights acquire(int64_t layer);
  /// Work reading layer `layer` is queued (a streamed layer's buffer may take the next one).
  void release(int64_t layer);
  /// Streamed layers copied to the device so far (0 when every layer is resident).
  int64_t uploads() const { return stream_ ? stream_->uploads() : 0; }
  /// Whether every layer stays on the device (none streamed).
  bool all_resident() const { return stream_ == nullptr; }

  /// One part of a layer's flat buffer: its place, and the HF tensors that fill its rows.
  struct Part {
    torch::Tensor LayerWeights::*field;
    int64_t rows, cols;  // cols 0: a vector of `rows`
    int64_t offset = 0;  // in elements, within the flat buffer
    struct Source {
      std::string name;  // after the layer's prefix: "self_attn.q_proj.weight"
      int64_t row0, rows;
    };
    std::vector<Source> sources;
  };

 private:
  LayerWeights views(const torch::Tensor& flat) const;
  /// The norm fields of `flat`'s views, as fp32 tensors of their own on the device.
  LayerWeights norms_fp32(const torch::Tensor& flat) const;
  void load_layer(const torch::Tensor& flat, int64_t layer, const TensorLookup& lookup, const std::string& source);

  ModelSpec spec_;
  WeightPlacement placement_;
  std::vector<Part> parts_;  // a layer's buffer, matrices first
  torch::Tensor embed_, positions_, final_norm_, final_norm_bias_, lm_head_;
  std::vector<torch::Tensor> resident_;  // per layer: the device flat buffer, undefined when streamed
  std::vector<LayerWeights> norms_;      // per layer: its norms in fp32 on the device (Note [Norms in fp32])
  std::unique_ptr<LayerStream> stream_;  // null when every layer is resident
};

}  // namespace tandem
