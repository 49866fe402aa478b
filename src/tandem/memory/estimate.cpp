#include "tandem/memory/estimate.h"

namespace tandem {

std::vector<std::pair<std::string, int64_t>> MemoryEstimate::rows() const {
  return {{"weights (fp32)", weights},
          {"gradients (fp32)", grads},
          {"AdamW states (fp32 m, v)", optimizer},
          {"activations", activations},
          {"logits and loss", logits}};
}

namespace {

// Bytes as int64, saturated at 2^60 so that sums of the rows stay within int64 for any input.
int64_t saturate(long double bytes) {
  constexpr long double kMax = static_cast<long double>(int64_t{1} << 60);
  return bytes >= kMax ? int64_t{1} << 60 : static_cast<int64_t>(bytes);
}

}  // namespace

ActivationCost activation_cost(const ModelSpec& s, int64_t B, int64_t T, Precision p, bool checkpointing) {
  // Products of the batch with the dimensions in floating point: a huge micro-batch or width gives
  // a huge estimate (refused with its numbers), never an overflowed one.
  const long double act = p == Precision::kFp32 ? 4 : 2;  // bytes of an activation element under autocast
  const long double tokens = static_cast<long double>(B) * T, d = s.d_model;
  // Tensors saved for backward per token of one decoder layer (counted from what the layer's ops
  // save, ActivationOffload.ThePlansEstimateIsWhatALayerSaves): the two residual inputs and the two
  // normalised outputs in fp32; the normalised inputs cast once per product (q, k, v, gate, up) and
  // the attention output before o, in the compute dtype; the rotated q and k, v, the attention
  // output; gate/up/activation/product of the SwiGLU.
  const bool decoder = s.arch == Arch::kDecoder;
  const long double kv = decoder ? static_cast<long double>(s.n_kv_head) * s.head_dim() : 0;
  const long double q = decoder ? static_cast<long double>(s.n_head) * s.head_dim() : 0;
  // Soft-capped attention (Gemma2) keeps its scores: T per head and token, before and after the
  // cap in the compute dtype and the softmax in fp32.
  const long double scores =
      decoder && s.parts.attn_softcap > 0 ? s.n_head * static_cast<long double>(T) * (2 * act + 4) : 0;
  // ResNet-BK: norms and projections, fp32 sweeps (a, b, c, and complex r, s, G per head), and
  // top_k expert inputs and SwiGLU intermediates per token (capacity slack not counted).
  const long double per_token_layer =
      decoder ? 4 * 4 * d + act * (6 * d + 2 * q + 2 * kv) + act * 4 * s.padded_d_ff() + scores
      : s.arch == Arch::kResNetBk
          ? 2 * 4 * d + act * 2 * d + s.n_head * (3 * 4 + 3 * 8 + 2 * 4) + s.top_k * act * (d + 4.0L * s.d_ff)
          : 4 * d + act * (d + 2.0L * s.padded_d_ff());
  const int64_t per_layer = saturate(tokens * per_token_layer);
  ActivationCost c;
  c.kept_per_layer = checkpointing ? saturate(tokens * d * 4) : per_layer;
  c.layer_working = checkpointing ? per_layer : 0;
  c.logits = saturate(tokens * s.padded_vocab() * (act + 4 + 4));
  return c;
}

int64_t ActivationCost::activations(int64_t layers, int64_t in_flight) const {
  return saturate(static_cast<long double>(kept_per_layer) * layers * in_flight + layer_working);
}

MemoryEstimate estimate_training_memory(const ModelSpec& s, int64_t B, int64_t T, Precision p, bool checkpointing) {
  MemoryEstimate e;
  const int64_t n = s.num_params();
  e.weights = 4 * n;
  e.grads = 4 * n;
  e.optimizer = 8 * n;
  const ActivationCost c = activation_cost(s, B, T, p, checkpointing);
  e.activations = c.activations(s.n_layer, 1);
  e.logits = c.logits;
  return e;
}

}  // namespace tandem
