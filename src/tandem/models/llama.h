#pragma once
// LLaMA-style decoder Blocks: RMSNorm, RoPE, SwiGLU, grouped-query attention through
// scaled_dot_product_attention. Parameter names follow HF's LlamaForCausalLM.

#include <torch/torch.h>

#include <map>
#include <memory>
#include <mutex>

#include "tandem/models/block.h"
#include "tandem/models/spec.h"

namespace tandem {

/// RoPE cos/sin tables (T, head_dim), built once in fp32 and cached per device and dtype.
class RopeTable {
 public:
  explicit RopeTable(const ModelSpec& spec);
  /// cos and sin for positions [0, T) on `device` in `dtype`.
  std::pair<torch::Tensor, torch::Tensor> get(int64_t T, const torch::Device& device, torch::ScalarType dtype);

 private:
  torch::Tensor cos_, sin_;  // (max_seq_len, head_dim) fp32 on the CPU
  std::mutex mutex_;
  std::map<std::pair<std::string, int>, std::pair<torch::Tensor, torch::Tensor>> cache_;
};

/// Zeroes the feed-forward padding beyond spec.d_ff: rows of the input projections, columns of the
/// output projection (Note [Zero padding keeps the function]).
void zero_ff_padding(const ModelSpec& spec, const torch::Tensor& in1, const torch::Tensor& in2,
                     const torch::Tensor& out);

/// The token embedding: (B, T) int64 -> (B, T, C).
class EmbeddingBlock : public Block {
 public:
  EmbeddingBlock(const ModelSpec& spec);
  torch::Tensor forward(const torch::Tensor& tokens) override;
  torch::nn::Embedding embed_tokens{nullptr};
};

/// A bias-free linear map y = x W^T, W (out, in) drawn from N(0, std^2) in parallel (Note [Parallel
/// initialisation]); torch::nn::Linear would first draw its own initialisation on one core.
class ProjectionImpl : public torch::nn::Module {
 public:
  ProjectionImpl(int64_t in, int64_t out, double std);
  torch::Tensor forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight); }
  torch::Tensor weight;  // (out, in)
};
TORCH_MODULE(Projection);

/// One decoder layer: x + attn(norm(x)), then h + mlp(norm(h)).
class LlamaLayer : public Block {
 public:
  LlamaLayer(const ModelSpec& spec, int64_t index, std::shared_ptr<RopeTable> rope);
  torch::Tensor forward(const torch::Tensor& x) override;

  struct Attention : torch::nn::Module {
    Projection q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  };
  struct SwiGlu : torch::nn::Module {
    Projection gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  };

 private:
  int64_t d_model_, n_head_, n_kv_head_, head_dim_;
  std::shared_ptr<RopeTable> rope_;
  RMSNorm input_layernorm_{nullptr}, post_attention_layernorm_{nullptr};
  std::shared_ptr<Attention> attn_;
  std::shared_ptr<SwiGlu> mlp_;
};

/// A residual MLP layer (the `mlp` preset): x + down(gelu(up(norm(x)))).
class MlpLayer : public Block {
 public:
  MlpLayer(const ModelSpec& spec, int64_t index);
  torch::Tensor forward(const torch::Tensor& x) override;

 private:
  RMSNorm norm_{nullptr};
  Projection up_{nullptr}, down_{nullptr};
};

/// Final norm and the output projection (untied lm_head, or the embedding matrix when tied).
class HeadBlock : public Block {
 public:
  HeadBlock(const ModelSpec& spec, const torch::Tensor& tied_weight);
  torch::Tensor forward(const torch::Tensor& x) override;
  std::vector<NamedTensor> hf_parameters() override;

 private:
  RMSNorm norm_{nullptr};
  Projection lm_head_{nullptr};
  torch::Tensor tied_weight_;  // the embedding's parameter when tied; not registered here
};

/// Applies rotary embeddings to x (B, H, T, hd) in HF's rotate-half convention.
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace tandem
