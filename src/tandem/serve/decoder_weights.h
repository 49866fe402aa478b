#pragma once
// The weights generation reads, under a residency plan: the embedding, the final norm and the output
// projection on the device; each decoder layer's weights in one flat buffer, on the device or in
// pinned host memory streamed up per use (Note [Streamed layers]). Read from HF-named tensors
// (a tandem checkpoint or a Hugging Face folder) straight into their final place and dtype.

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/models/spec.h"
#include "tandem/serve/layer_stream.h"
#include "tandem/serve/residency_plan.h"

namespace tandem {

/// Views of one decoder layer's weights into its flat buffer, in the compute dtype. The feed-forward
/// has the checkpoint's (unpadded) d_ff: tandem's zero padding adds nothing to the function (Note
/// [Zero padding keeps the function]).
struct LayerWeights {
  torch::Tensor qkv;         // (C + 2 KV hd, C): q_proj, k_proj and v_proj stacked
  torch::Tensor o;           // (C, C)
  torch::Tensor gate_up;     // (2 F, C): gate_proj and up_proj stacked
  torch::Tensor down;        // (C, F)
  torch::Tensor input_norm;  // (C)
  torch::Tensor post_norm;   // (C)
};

/// The views of `flat` (decoder_layer_numel(spec) elements).
LayerWeights layer_views(const torch::Tensor& flat, const ModelSpec& spec);

/// HF tensor name suffixes ("self_attn.q_proj.weight") of a layer and their views into `flat`.
std::vector<std::pair<std::string, torch::Tensor>> layer_named_views(const torch::Tensor& flat, const ModelSpec& spec);

/// A tensor by its HF name (any float dtype, on the CPU), or nullopt when absent.
using TensorLookup = std::function<std::optional<torch::Tensor>(const std::string& name)>;

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
  const torch::Tensor& embed() const { return embed_; }            // (V, C)
  const torch::Tensor& final_norm() const { return final_norm_; }  // (C)
  const torch::Tensor& lm_head() const { return lm_head_; }        // (V, C); the embedding when tied

  /// Layer `layer`'s weights on the device, ready for work queued after this call.
  LayerWeights acquire(int64_t layer);
  /// Work reading layer `layer` is queued (a streamed layer's buffer may take the next one).
  void release(int64_t layer);
  /// Streamed layers copied to the device so far (0 when every layer is resident).
  int64_t uploads() const { return stream_ ? stream_->uploads() : 0; }

 private:
  ModelSpec spec_;
  WeightPlacement placement_;
  torch::Tensor embed_, final_norm_, lm_head_;
  std::vector<torch::Tensor> resident_;  // per layer: the device flat buffer, undefined when streamed
  std::unique_ptr<LayerStream> stream_;  // null when every layer is resident
};

}  // namespace tandem
