#pragma once
// The decoder's forward for generation (every family of Note [Decoder families]) over
// DecoderWeights and a paged KV cache: the prompts of sequences that join (prefill) and one new
// token of each running sequence (decode) in one pass over the weights, so a streamed layer crosses
// the bus once per step whatever the batch.
//
// Note [Generation forward]
// The numerics are those of models/decoder.cpp's DecoderLayer under autocast, as tandem trains: an
// fp32 residual stream; norms in fp32 (the scale converted to fp32) and their output cast to the
// compute dtype; matrix products in the compute dtype; RoPE from the same RopeTable, applied in the
// compute dtype; attention through models/attention.h's attend (scaled_dot_product_attention, or
// the soft-capped scores of Gemma2). A sliding window masks keys more than the window behind each
// query; their pages stay in the cache until the sequence ends. Projections and the feed-forward see every
// new token of the step as one (N, C) matrix. Attention is grouped: sequences adding one token
// attend together over their gathered pages, padded to the longest and masked by length; a
// sequence adding several tokens attends causally: those starting at 0 together, over their fresh
// keys (Note [Fresh prefills together]), the others alone, over their pages. With fp32 weights this
// equals Model::forward to rounding.
//
// Note [Decode step kernels]
// A recorded decode step is one launch (Note [Decode graphs]) but still about forty small kernels
// a layer, each a few microseconds, where reading the layer's weights takes tens: so each kernel
// that computes nothing new is left out. The norms' fp32 scales are converted once at load (Note
// [Norms in fp32]); the residual adds take the compute-dtype output as it is (the add converts it,
// as the separate conversion did); a step of decodes only takes the attention's output as its rows,
// not a copy; and the length and window masks are made additive once a step (Note [Decode masks
// once a step]). Each gives the same values as the kernels it replaces.

#include <torch/torch.h>

#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tandem/data/tokenizer.h"
#include "tandem/kernels/decode_step.h"
#include "tandem/models/attention.h"
#include "tandem/models/rope.h"
#include "tandem/serve/decoder_weights.h"
#include "tandem/serve/kv_cache.h"
#include "tandem/serve/step_layout.h"

namespace tandem {

/// One sequence's part of a step: `tokens` appended at positions start, start + 1, ...
struct SequenceChunk {
  const PageTable* pages = nullptr;  ///< holds at least start + tokens.size() tokens
  int64_t start = 0;                 ///< tokens of the sequence already in the cache
  std::vector<TokenId> tokens;       ///< the new tokens, at least one
};

/// Which logits a step returns.
enum class LogitRows {
  kLast,  ///< (B, V): each chunk's last token (what generation samples from)
  kAll,   ///< (N, V): every new token, chunk after chunk (tests)
};

/// The decoder (Note [Generation forward]); one thread calls forward() at a time.
class Decoder {
 public:
  explicit Decoder(std::shared_ptr<DecoderWeights> weights);

  /// The model's shapes (from its config.json).
  const ModelSpec& spec() const { return weights_->spec(); }
  /// Whether decode rows attend through the paged kernel (Note [Paged decode attention]).
  bool paged_attention() const { return paged_attention_; }
  /// Whether a step's prefills attend in one call (Note [Packed prefill attention]).
  bool packed_prefill() const { return packed_prefill_; }
  /// Prepares the persistent decode step (Note [Persistent decode step]) over `cache` where it takes
  /// this model: decode steps of up to DecodeStep::kMaxRows rows over that cache then run as one
  /// launch. Queues device work; call it outside a recording. forward() calls it itself.
  void prepare_decode_step(const KvCache& cache);
  /// Whether decode steps over `cache` of `rows` rows run as the persistent step.
  bool persistent_step(const KvCache& cache, int64_t rows) const;
  /// Why the persistent step does not run ("" when it does, or before prepare_decode_step).
  const std::string& persistent_refusal() const { return persistent_refusal_; }
  /// The products launched so far that formed their own norm (Note [Norm in the product]); steps
  /// replayed from a CUDA graph launch nothing here.
  int64_t normed_products() const { return normed_products_; }
  /// Where it computes, and in which dtype (the KV cache's too).
  c10::Device device() const { return weights_->placement().device; }
  torch::ScalarType dtype() const { return weights_->placement().dtype; }
  /// The weights and their residency plan.
  DecoderWeights& weights() { return *weights_; }
  /// The shape of a KV cache for this decoder.
  KvCacheShape cache_shape(int64_t page_tokens) const;

  /// Runs each chunk's new tokens through the model, writes their keys and values into `cache` (at
  /// the chunk's pages) and attends over the sequence's cached tokens. Returns fp32 logits on the
  /// device, (B, vocab) or (N, vocab) per `rows`, in the order of `batch`.
  torch::Tensor forward(const std::vector<SequenceChunk>& batch, KvCache& cache, LogitRows rows = LogitRows::kLast);

  /// forward()'s two halves: the step's layout from its chunks (host work and small copies to the
  /// device), then the pass over the weights, which queues device work only (fp32 logits of the
  /// layout's logit rows).
  StepLayout layout(const std::vector<SequenceChunk>& batch, const KvCache& cache, LogitRows rows);
  torch::Tensor run(const StepLayout& step, KvCache& cache);
  /// The layout of a decode step whose inputs are already on the device, built there without a
  /// host decision, so that run(decode_layout(...)) can be recorded (Note [Decode graphs]). Every
  /// row's logits are returned.
  StepLayout decode_layout(const DecodeInputs& inputs, const KvCache& cache);

 private:
  void layout_decodes(const std::vector<SequenceChunk>& batch, const std::vector<size_t>& order, const KvCache& cache,
                      StepLayout& step) const;
  void layout_prefills(const std::vector<SequenceChunk>& batch, const std::vector<size_t>& order, const KvCache& cache,
                       StepLayout& step) const;
  void layout_fresh(StepLayout& step) const;
  void set_positions(StepLayout& step, const torch::Tensor& positions);  // and their cos and sin
  void set_dynamic_rope(const std::vector<SequenceChunk>& batch, const std::vector<size_t>& order, StepLayout& step);
  void set_decode_masks(StepLayout& step, const torch::Tensor& lengths, int64_t keys) const;
  std::pair<torch::Tensor, torch::Tensor> layer(const torch::Tensor& x, const torch::Tensor& pending, int64_t index,
                                                const StepLayout& step, KvCache& cache);
  torch::Tensor norm_in(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias) const;
  torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) const;
  std::pair<torch::Tensor, torch::Tensor> add_and_norm(const torch::Tensor& x, const torch::Tensor& a,
                                                       const torch::Tensor& w, const torch::Tensor& bias) const;
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> queries_keys_values(const torch::Tensor& h,
                                                                              const LayerWeights& w, int64_t index,
                                                                              const StepLayout& step,
                                                                              KvCache& cache) const;
  torch::Tensor gated(const torch::Tensor& h, const LayerWeights& w) const;
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> normed_queries_keys_values(
      const torch::Tensor& x, const torch::Tensor& pending, const LayerWeights& w, int64_t index,
      const StepLayout& step, KvCache& cache) const;
  std::pair<torch::Tensor, torch::Tensor> normed_gated(const torch::Tensor& x, const torch::Tensor& a,
                                                       const LayerWeights& w) const;
  torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t index,
                          const StepLayout& step, KvCache& cache);
  DecodeStepModel decode_step_model(const KvCache& cache);

  std::shared_ptr<DecoderWeights> weights_;
  std::unique_ptr<RopeTable> rope_;  // null with learned positions
  AttentionOptions attention_options_;
  bool paged_attention_ = false;                                       // Note [Paged decode attention]
  bool fused_norms_ = false, fused_rope_ = false, fused_act_ = false;  // Note [Decode fusions]
  bool skinny_linear_ = false;                                         // Note [Skinny linear]
  bool skinny_epilogues_ = false;                                      // Note [Skinny epilogues]
  bool norms_in_products_ = false;                                     // Note [Norm in the product]
  mutable int64_t normed_products_ = 0;
  bool packed_prefill_ = false;              // Note [Packed prefill attention]
  bool persistent_ = false;                  // Note [Persistent decode step]
  std::unique_ptr<DecodeStep> step_kernel_;  // over the pages of cache step_cache_
  uint64_t step_cache_ = 0;                  // KvCache::id(); 0: none
  std::string persistent_refusal_;
};

}  // namespace tandem
