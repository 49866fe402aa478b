#pragma once
// The decoder's Blocks (Note [Decoder families]): the token embedding, the decoder layer and the
// head, each with the parts its family's DecoderParts switch on, and parameters registered under
// the family's HF names (models/family.h).

#include <torch/torch.h>

#include <map>
#include <memory>

#include "tandem/models/attention.h"
#include "tandem/models/block.h"
#include "tandem/models/norm.h"
#include "tandem/models/projection.h"
#include "tandem/models/rope.h"
#include "tandem/models/spec.h"

namespace tandem {

/// The token embedding (times sqrt(d_model) for Gemma), plus the learned position table (GPT-2):
/// (B, T) int64 -> (B, T, C) fp32.
class EmbeddingBlock : public Block {
 public:
  explicit EmbeddingBlock(const ModelSpec& spec);
  torch::Tensor forward(const torch::Tensor& tokens) override;
  std::vector<int64_t> hf_shape(const std::string& name, const torch::Tensor& param) const override;
  torch::nn::Embedding embed_tokens{nullptr};

 private:
  torch::nn::Embedding positions_{nullptr};
  double scale_ = 0;  // 0: none
  int64_t vocab_;
};

/// One decoder layer: r = x + attn_out_norm(o(attend(rope(q), rope(k), v))) over attn_norm(x), then
/// r + ff_out_norm(down(act(gate) * up)) over ff_norm(r); the output norms with sandwich norms only.
class DecoderLayer : public Block {
 public:
  DecoderLayer(const ModelSpec& spec, int64_t index, std::shared_ptr<RopeTable> rope);
  torch::Tensor forward(const torch::Tensor& x) override;
  std::vector<int64_t> hf_shape(const std::string& name, const torch::Tensor& param) const override;

 private:
  void build_attention(const ModelSpec& spec);
  void build_feed_forward(const ModelSpec& spec);
  torch::Tensor attention(const torch::Tensor& h);
  torch::Tensor feed_forward(const torch::Tensor& h);

  int64_t n_head_, n_kv_head_, head_dim_, d_ff_, window_;
  Activation act_;
  AttentionOptions attention_options_;
  std::shared_ptr<RopeTable> rope_;  // null with learned positions
  Norm attn_norm_{nullptr}, attn_out_norm_{nullptr}, ff_norm_{nullptr}, ff_out_norm_{nullptr};
  Projection q_{nullptr}, k_{nullptr}, v_{nullptr}, qkv_{nullptr}, o_{nullptr};
  Projection gate_{nullptr}, up_{nullptr}, gate_up_{nullptr}, down_{nullptr};
  std::map<std::string, std::vector<int64_t>> hf_shapes_;  // the padded feed-forward's HF shapes
};

/// Final norm and the output projection (untied lm_head, or the embedding matrix when tied), the
/// logits soft-capped for Gemma2: (B, T, C) -> (B, T, V_pad).
class HeadBlock : public Block {
 public:
  HeadBlock(const ModelSpec& spec, const torch::Tensor& tied_weight);
  torch::Tensor forward(const torch::Tensor& x) override;
  std::vector<NamedTensor> hf_parameters() override;
  std::vector<int64_t> hf_shape(const std::string& name, const torch::Tensor& param) const override;

 private:
  Norm norm_{nullptr};
  Projection lm_head_{nullptr};
  torch::Tensor tied_weight_;  // the embedding's parameter when tied; not registered here
  std::string norm_name_;
  double softcap_;
  int64_t vocab_;
};

/// The feed-forward's activation.
torch::Tensor activate(const torch::Tensor& x, Activation act);

}  // namespace tandem
