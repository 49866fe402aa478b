#include "tandem/serve/decoder.h"

#include <ATen/Context.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <string>

#include "tandem/core/env_choice.h"
#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/kernels/decode_fusions.h"
#include "tandem/kernels/dependent_launch.h"
#include "tandem/kernels/paged_attention.h"
#include "tandem/kernels/skinny_epilogues.h"
#include "tandem/kernels/skinny_linear.h"
#include "tandem/models/decoder.h"
#include "tandem/models/norm.h"
#include "tandem/serve/packed_prefill.h"

namespace tandem {

using torch::indexing::Slice;

namespace {

torch::Tensor int64_tensor(const std::vector<int64_t>& v, const c10::Device& device) {
  return torch::tensor(v, torch::kInt64).to(device);
}

// keys or values of the pages (B, P) gathered per sequence: (B, KV, P * page_tokens, hd).
torch::Tensor gather_pages(const torch::Tensor& cache, const torch::Tensor& pages) {
  const int64_t B = pages.size(0), P = pages.size(1);
  auto g = cache.index_select(0, pages.reshape({-1}));  // (B * P, KV, pt, hd)
  g = g.view({B, P, cache.size(1), cache.size(2), cache.size(3)}).permute({0, 2, 1, 3, 4});
  return g.reshape({B, cache.size(1), P * cache.size(2), cache.size(3)});
}

// (B, 1, 1, keys) bool: key k of row b lies within its sequence's `lengths[b]` tokens.
torch::Tensor length_mask(const torch::Tensor& lengths, int64_t keys) {
  const auto key = torch::arange(keys, lengths.options());
  return (key.unsqueeze(0) < lengths.unsqueeze(1)).view({lengths.size(0), 1, 1, keys});
}

// Note [Paged decode attention], Note [Decode fusions], Note [Skinny epilogues] and Note [Norm in
// the product]: the CUDA kernels layer by layer with the products' epilogues and the norms inside
// the products (`fused`, the default), unless TANDEM_DECODE_KERNELS asks for the whole decode step
// in one launch where that takes the model (`persistent`, Note [Persistent decode step]: slower so
// far), for the norms in kernels of their own (`norms-apart`), for the kernels without the
// epilogues (`separate`) or for LibTorch's ops only (`torch`), to compare.
std::string decode_kernels() {
  const std::string k = env_choice("TANDEM_DECODE_KERNELS", "decode kernels",
                                   {"fused", "norms-apart", "persistent", "separate", "torch"});
  return k.empty() ? "fused" : k;
}

// Note [No per-shape attention plans]
// cuDNN's attention, LibTorch's first choice on Hopper for a masked or grouped-query SDPA, builds a
// plan for every new shape (45 to 700 ms for its first call at a key length on an H100,
// bench/sdpa_first_call.py) and runs fast after it. The prefills of a serving step have shapes
// that hardly repeat (each prompt's length, each cached prefix's), so every step that prefilled
// paid plans: under the 64-client load on an H100 such a step took 50.8 ms against 1.87 ms for a
// decode step, 45 % of the server's busy time, and the time to first token followed. A step that
// prefills runs its attention with cuDNN's backend switched off, and none of the others plans per
// shape: flash attention takes a prompt from its start (causal, grouped queries), the memory-
// efficient kernel a masked one (a continuation, prompts padded together, a window). That kernel
// takes no grouped queries, and LibTorch's math backend, which would, holds every score (a 2048-token
// chunk over a 128 K-token prefix: 17 GB at 32 heads), so a masked attention of grouped queries gets
// its key and value heads repeated first (attend_without_plans). Decode steps keep LibTorch's choice
// (the paged kernel takes them, or under TANDEM_DECODE_KERNELS=torch a few recorded shapes), and so
// do steps whose prefills are packed into one call (Note [Packed prefill attention]). The
// switch is LibTorch's process-wide one: the first step in flight that prefills turns it off, the
// last one to end restores it, so decoders on several threads leave it as they found it.
class NoCudnnAttention {
 public:
  explicit NoCudnnAttention(bool on) : on_(on) {
    if (!on_) return;
    State& s = state();
    const std::lock_guard<std::mutex> lock(s.mutex);
    if (s.depth++ == 0) {
      s.saved = at::globalContext().userEnabledCuDNNSDP();
      at::globalContext().setSDPUseCuDNN(false);
    }
  }
  ~NoCudnnAttention() {
    if (!on_) return;
    State& s = state();
    const std::lock_guard<std::mutex> lock(s.mutex);
    if (--s.depth == 0) at::globalContext().setSDPUseCuDNN(s.saved);
  }
  NoCudnnAttention(const NoCudnnAttention&) = delete;
  NoCudnnAttention& operator=(const NoCudnnAttention&) = delete;

 private:
  struct State {
    std::mutex mutex;
    int depth = 0;
    bool saved = true;
  };
  static State& state() {
    static State s;
    return s;
  }
  bool on_;
};

// Note [No per-shape attention plans]: attend() for a step that prefills, a masked attention's
// key and value heads repeated to the queries' so that the memory-efficient kernel takes it.
torch::Tensor attend_without_plans(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                   const torch::Tensor& mask, const AttentionOptions& o) {
  if (!mask.defined() || o.softcap > 0 || k.size(1) == q.size(1)) return attend(q, k, v, mask, o);
  const int64_t groups = q.size(1) / k.size(1);
  return attend(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), mask, o);
}

}  // namespace

Decoder::Decoder(std::shared_ptr<DecoderWeights> weights) : weights_(std::move(weights)) {
  TANDEM_CHECK(spec().arch == Arch::kDecoder, "generation runs decoder models; this checkpoint is ",
               to_string(spec().arch));
  if (!spec().parts.learned_positions) rope_ = std::make_unique<RopeTable>(spec());
  attention_options_.scale = spec().parts.query_scale;
  attention_options_.softcap = spec().parts.attn_softcap;
  detail::check_dependent_launch_setting();  // Note [Dependent launch]
  const std::string kernels = decode_kernels();
  const bool fused = kernels != "torch" && decode_fusions_available(device(), dtype());
  paged_attention_ =
      fused &&
      paged_decode_attention_supported(device(), dtype(), spec().n_head, spec().n_kv_head, spec().head_dim()) &&
      spec().parts.attn_softcap <= 0;
  const auto& p = spec().parts;
  fused_norms_ =
      fused && (p.norm == NormKind::kRms || p.norm == NormKind::kRmsPlusOne) && fused_norm_takes(spec().d_model);
  fused_rope_ = fused && rope_ != nullptr;
  fused_act_ = fused && p.gated_ffn && p.act == Activation::kSilu;
  skinny_linear_ = fused;
  skinny_epilogues_ = fused && kernels != "separate";
  norms_in_products_ = skinny_epilogues_ && fused_norms_ && kernels != "norms-apart";
  packed_prefill_ = fused && packed_prefill_supported(device(), dtype(), spec().head_dim(), p.attn_softcap);
  // Note [Persistent decode step]: what the one launch computes is this path's, fused throughout.
  persistent_ = fused && kernels == "persistent" && paged_attention_ && fused_norms_ && fused_rope_ && fused_act_ &&
                !rope_->depends_on_length() && !p.scale_embedding && !p.sandwich_norms && p.final_softcap <= 0 &&
                p.norm != NormKind::kLayerNorm && weights_->all_resident();
}

DecodeStepModel Decoder::decode_step_model(const KvCache& cache) {
  const auto& s = spec();
  DecodeStepModel m;
  for (int64_t i = 0; i < s.n_layer; ++i) {
    const LayerWeights w = weights_->acquire(i);
    DecodeStepLayerWeights l;
    l.qkv = w.qkv, l.qkv_bias = w.qkv_bias, l.o = w.o, l.o_bias = w.o_bias;
    l.gate_up = w.gate_up, l.gate_up_bias = w.gate_up_bias, l.down = w.down, l.down_bias = w.down_bias;
    l.attn_norm = w.attn_norm, l.ff_norm = w.ff_norm;
    l.k_cache = cache.keys(i), l.v_cache = cache.values(i);
    l.window = s.window(i);
    weights_->release(i);
    m.layers.push_back(l);
  }
  m.embed = weights_->embed();
  m.final_norm = weights_->final_norm();
  m.lm_head = weights_->lm_head();
  auto [cos, sin] = rope_->get(s.max_seq_len, device(), dtype());
  m.cos = cos.contiguous(), m.sin = sin.contiguous();
  m.n_head = s.n_head, m.n_kv_head = s.n_kv_head, m.head_dim = s.head_dim();
  m.eps = s.norm_eps;
  m.scale = attention_options_.scale;
  m.plus_one = s.parts.norm == NormKind::kRmsPlusOne;
  return m;
}

void Decoder::prepare_decode_step(const KvCache& cache) {
  if (!persistent_ || step_cache_ == cache.id()) return;
  const c10::DeviceGuard device_guard(device());
  step_kernel_ = make_decode_step(decode_step_model(cache), &persistent_refusal_);
  step_cache_ = cache.id();
  if (step_kernel_ == nullptr)
    log::debug("decode steps run layer by layer: the persistent step does not take " + persistent_refusal_);
}

bool Decoder::persistent_step(const KvCache& cache, int64_t rows) const {
  return step_kernel_ != nullptr && step_cache_ == cache.id() && step_kernel_->takes(rows);
}

// Note [Skinny linear]: a step of a few rows (a small decode batch) reads each matrix at the
// memory's speed through the skinny kernel, a larger one through cuBLAS.
torch::Tensor Decoder::linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) const {
  if (skinny_linear_ && skinny_linear_takes(x, w)) return skinny_linear(x, w, b);
  return torch::nn::functional::linear(x, w, b);
}

KvCacheShape Decoder::cache_shape(int64_t page_tokens) const {
  KvCacheShape s;
  s.n_layer = spec().n_layer;
  s.n_kv_head = spec().n_kv_head;
  s.head_dim = spec().head_dim();
  s.page_tokens = page_tokens;
  s.dtype = dtype();
  s.device = device();
  return s;
}

StepLayout Decoder::layout(const std::vector<SequenceChunk>& batch, const KvCache& cache, LogitRows rows) {
  const int64_t pt = cache.page_tokens();
  std::vector<size_t> order;  // step order: the one-token chunks, then the others
  for (size_t b = 0; b < batch.size(); ++b)
    if (batch[b].tokens.size() == 1) order.push_back(b);
  StepLayout s;
  s.decodes = static_cast<int64_t>(order.size());
  for (size_t b = 0; b < batch.size(); ++b)
    if (batch[b].tokens.size() != 1) order.push_back(b);

  std::vector<int64_t> tokens, positions, page, slot, first_row(batch.size());
  for (const size_t b : order) {
    const auto& c = batch[b];
    const auto T = static_cast<int64_t>(c.tokens.size()), end = c.start + T;
    TANDEM_ASSERT(T > 0 && c.pages != nullptr && c.start >= 0, "empty chunk or no page table");
    TANDEM_ASSERT(c.pages->capacity(pt) >= end, "page table holds ", c.pages->capacity(pt), " tokens, step needs ",
                  end);
    TANDEM_ASSERT(end <= spec().max_seq_len, "sequence of ", end, " tokens beyond the context of ", spec().max_seq_len);
    first_row[b] = static_cast<int64_t>(tokens.size());
    if (T > 1) s.prefills.push_back({first_row[b], T, c.start, false, {}, {}, {}});
    for (int64_t t = 0; t < T; ++t) {
      const TokenId id = c.tokens[static_cast<size_t>(t)];
      TANDEM_ASSERT(id >= 0 && id < spec().vocab_size, "token id ", id, " outside the vocabulary");
      tokens.push_back(id);
      positions.push_back(c.start + t);
      page.push_back(c.pages->pages[static_cast<size_t>((c.start + t) / pt)]);
      slot.push_back((c.start + t) % pt);
    }
  }
  s.rows = static_cast<int64_t>(tokens.size());
  const auto device = this->device();
  s.tokens = int64_tensor(tokens, device);
  set_positions(s, int64_tensor(positions, device));
  if (rope_ && rope_->depends_on_length()) set_dynamic_rope(batch, order, s);
  s.write_page = int64_tensor(page, device);
  s.write_slot = int64_tensor(slot, device);
  layout_decodes(batch, order, cache, s);
  layout_prefills(batch, order, cache, s);

  std::vector<int64_t> logit_rows;
  for (size_t b = 0; b < batch.size(); ++b) {
    const auto T = static_cast<int64_t>(batch[b].tokens.size());
    for (int64_t t = rows == LogitRows::kAll ? 0 : T - 1; t < T; ++t) logit_rows.push_back(first_row[b] + t);
  }
  s.logit_rows = int64_tensor(logit_rows, device);
  s.every_row = static_cast<int64_t>(logit_rows.size()) == s.rows;
  for (size_t i = 0; i < logit_rows.size() && s.every_row; ++i) s.every_row = logit_rows[i] == static_cast<int64_t>(i);
  return s;
}

void Decoder::layout_decodes(const std::vector<SequenceChunk>& batch, const std::vector<size_t>& order,
                             const KvCache& cache, StepLayout& s) const {
  if (s.decodes == 0) return;
  int64_t widest = 0;  // pages of the longest one-token chunk
  for (int64_t i = 0; i < s.decodes; ++i) {
    const auto& c = batch[order[static_cast<size_t>(i)]];
    widest = std::max(widest, cache.pages_for(c.start + 1));
  }
  std::vector<int64_t> pages, lengths;
  for (int64_t i = 0; i < s.decodes; ++i) {
    const auto& c = batch[order[static_cast<size_t>(i)]];
    for (int64_t p = 0; p < widest; ++p)
      pages.push_back(p < cache.pages_for(c.start + 1) ? c.pages->pages[static_cast<size_t>(p)] : 0);
    lengths.push_back(c.start + 1);
  }
  const auto device = this->device();
  const int64_t keys = widest * cache.page_tokens();
  s.decode_pages = int64_tensor(pages, device).view({s.decodes, widest});
  set_decode_masks(s, int64_tensor(lengths, device), keys);
}

// The decode masks of one-token chunks of `lengths` tokens over `keys` keys: within the sequence,
// and within the window of its query (at position length - 1) for models with one.
//
// Note [Decode masks once a step]
// scaled_dot_product_attention turns a boolean mask into an additive one (0 where a key is allowed,
// -inf where not) at every call: two kernels a layer at every step. The step's masks are made
// additive in the compute dtype once here, with those values (cuDNN's attention, when chosen, would
// put -65504 for -inf: every decode row has its own key, so no row is wholly masked and both give
// zero weights). Soft-capped scores (Gemma2) mask in attend itself and keep the boolean masks.
void Decoder::set_decode_masks(StepLayout& s, const torch::Tensor& lengths, int64_t keys) const {
  s.decode_lengths = lengths;
  if (paged_attention_) return;  // Note [Paged decode attention]: no masks
  const auto mask = length_mask(lengths, keys);
  const int64_t window = spec().parts.sliding_window;
  torch::Tensor windowed;
  if (window > 0) {
    const auto key = torch::arange(keys, lengths.options()).unsqueeze(0);        // (1, S)
    const auto inside = within_window(key, (lengths - 1).unsqueeze(1), window);  // (B, S)
    windowed = mask & inside.view({lengths.size(0), 1, 1, keys});
  }
  const bool additive = spec().parts.attn_softcap <= 0;
  const auto bias = [&](const torch::Tensor& m) {
    if (!m.defined() || !additive) return m;
    return torch::zeros(m.sizes(), m.options().dtype(dtype()))
        .masked_fill_(m.logical_not(), -std::numeric_limits<double>::infinity());
  };
  s.decode_mask = bias(mask);
  s.decode_window_mask = bias(windowed);
}

void Decoder::layout_prefills(const std::vector<SequenceChunk>& batch, const std::vector<size_t>& order,
                              const KvCache& cache, StepLayout& s) const {
  if (packed_prefill_) {  // Note [Packed prefill attention]: no masks, no page tables of their own
    std::vector<PrefillChunk> chunks;
    for (size_t j = 0; j < s.prefills.size(); ++j)
      chunks.push_back(
          {batch[order[static_cast<size_t>(s.decodes) + j]].pages, s.prefills[j].start, s.prefills[j].count});
    s.packed = pack_prefills(chunks, cache.page_tokens(), device());
    return;
  }
  const auto opts = torch::TensorOptions().dtype(torch::kInt64).device(device());
  const int64_t window = spec().parts.sliding_window;
  for (size_t j = 0; j < s.prefills.size(); ++j) {
    auto& p = s.prefills[j];
    if (p.start == 0) {  // attends over its fresh keys, causally
      if (window > 0) p.window_mask = causal_mask(p.count, window, device());
      continue;
    }
    const auto& c = batch[order[static_cast<size_t>(s.decodes) + j]];
    const int64_t n = cache.pages_for(p.start + p.count);
    p.pages =
        int64_tensor(std::vector<int64_t>(c.pages->pages.begin(), c.pages->pages.begin() + n), device()).view({1, n});
    const auto q_pos = torch::arange(p.start, p.start + p.count, opts).unsqueeze(1);  // (T, 1)
    const auto key = torch::arange(p.start + p.count, opts).unsqueeze(0);             // (1, L)
    p.mask = (key <= q_pos).view({1, 1, p.count, p.start + p.count});
    if (window > 0) p.window_mask = p.mask & within_window(key, q_pos, window).view(p.mask.sizes());
  }
  layout_fresh(s);
}

// Note [Fresh prefills together]
// Sequences that join in the same step (their chunk starts at 0) attend in one call, padded to the
// longest: a padded query row attends to its sequence's keys (never to none, which would give NaN)
// and is dropped after. One alone attends causally without a mask, as Model::forward does.
void Decoder::layout_fresh(StepLayout& s) const {
  std::vector<StepLayout::Prefill*> fresh;
  for (auto& p : s.prefills)
    if (p.start == 0) fresh.push_back(&p);
  if (fresh.size() < 2) return;
  auto& g = s.fresh;
  g.count = static_cast<int64_t>(fresh.size());
  for (const auto* p : fresh) g.width = std::max(g.width, p->count);
  std::vector<int64_t> gather, last, places, rows;
  for (int64_t b = 0; b < g.count; ++b) {
    auto& p = *fresh[static_cast<size_t>(b)];
    p.grouped = true;
    last.push_back(p.count - 1);
    for (int64_t t = 0; t < g.width; ++t) {
      gather.push_back(p.row + (t < p.count ? t : 0));
      if (t >= p.count) continue;
      places.push_back(b * g.width + t);
      rows.push_back(p.row + t);
    }
  }
  const auto opts = torch::TensorOptions().dtype(torch::kInt64).device(device());
  const auto t = torch::arange(g.width, opts);
  const auto query_end = torch::minimum(t.view({1, g.width}), int64_tensor(last, device()).view({g.count, 1}));
  g.mask = (t.view({1, 1, g.width}) <= query_end.unsqueeze(2)).unsqueeze(1);  // (B, 1, T, T)
  if (spec().parts.sliding_window > 0)  // a padded row's query end is the last real one's
    g.window_mask = g.mask & within_window(t.view({1, 1, 1, g.width}), query_end.view({g.count, 1, g.width, 1}),
                                           spec().parts.sliding_window);
  g.gather = int64_tensor(gather, device());
  g.places = int64_tensor(places, device());
  g.rows = int64_tensor(rows, device());
}

torch::Tensor Decoder::attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t index,
                                 const StepLayout& step, KvCache& cache) {
  const bool windowed = spec().window(index) > 0;  // the step's window masks, else its plain ones
  const auto& o = attention_options_;
  const bool prefills = step.rows > step.decodes;  // Note [No per-shape attention plans]
  const double scale = o.scale > 0 ? o.scale : 1.0 / std::sqrt(double(q.size(2)));
  const auto attend_step = [&](const torch::Tensor& q_, const torch::Tensor& k_, const torch::Tensor& v_,
                               const torch::Tensor& mask) {
    return prefills ? attend_without_plans(q_, k_, v_, mask, o) : attend(q_, k_, v_, mask, o);
  };
  const auto kc = cache.keys(index);  // (P, KV, page_tokens, hd), holding this step's keys and values
  const auto vc = cache.values(index);
  torch::Tensor decoded;  // (B_d, H, hd)
  if (step.decodes > 0 && paged_attention_) {
    decoded = paged_decode_attention(q.narrow(0, 0, step.decodes), kc, vc, step.decode_pages, step.decode_lengths,
                                     spec().window(index), scale);
  } else if (step.decodes > 0) {
    const auto qd = q.narrow(0, 0, step.decodes).unsqueeze(2);  // (B_d, H, 1, hd)
    const auto kd = gather_pages(kc, step.decode_pages);        // (B_d, KV, S, hd)
    const auto vd = gather_pages(vc, step.decode_pages);
    decoded = attend_step(qd, kd, vd, windowed ? step.decode_window_mask : step.decode_mask).squeeze(2);
  }
  if (step.decodes > 0 && step.decodes == step.rows)
    return decoded;  // Note [Decode step kernels]: the rows, not a copy
  auto y = torch::empty({q.size(0), q.size(1), q.size(2)}, q.options());  // (N, H, hd), contiguous
  if (decoded.defined()) y.narrow(0, 0, step.decodes).copy_(decoded);
  if (step.packed.max_q > 0) {  // Note [Packed prefill attention]
    const int64_t n = step.rows - step.decodes;
    y.narrow(0, step.decodes, n)
        .copy_(
            packed_prefill_attention(q.narrow(0, step.decodes, n), kc, vc, step.packed, spec().window(index), scale));
    return y;
  }
  if (step.fresh.count > 0) {
    const auto& g = step.fresh;
    const auto pad = [&](const torch::Tensor& t) {  // (N, heads, hd) -> (B, heads, T, hd)
      return t.index_select(0, g.gather).view({g.count, g.width, t.size(1), t.size(2)}).transpose(1, 2);
    };
    const auto a = attend_step(pad(q), pad(k), pad(v), windowed ? g.window_mask : g.mask);
    y.index_copy_(0, g.rows, a.transpose(1, 2).reshape({-1, q.size(1), q.size(2)}).index_select(0, g.places));
  }
  for (const auto& p : step.prefills) {
    if (p.grouped) continue;
    const auto qp = q.narrow(0, p.row, p.count).transpose(0, 1).unsqueeze(0);  // (1, H, T, hd)
    torch::Tensor a;
    if (p.start == 0) {
      const auto kp = k.narrow(0, p.row, p.count).transpose(0, 1).unsqueeze(0);  // (1, KV, T, hd)
      const auto vp = v.narrow(0, p.row, p.count).transpose(0, 1).unsqueeze(0);
      a = attend_step(qp, kp, vp, windowed ? p.window_mask : torch::Tensor());  // undefined: causal
    } else {
      const int64_t L = p.start + p.count;
      const auto kp = gather_pages(kc, p.pages).narrow(2, 0, L);  // (1, KV, L, hd)
      const auto vp = gather_pages(vc, p.pages).narrow(2, 0, L);
      a = attend_step(qp, kp, vp, windowed ? p.window_mask : p.mask);
    }
    y.narrow(0, p.row, p.count).copy_(a.squeeze(0).transpose(0, 1));
  }
  return y;
}

// Note [Residual carried into the next norm]: the layer's input is the residual stream x plus
// `pending` (the previous layer's feed-forward output, undefined before the first layer), added
// here together with the norm that follows it; the layer returns its own stream and output the same
// way. The values are those of adding at the end of each layer.
std::pair<torch::Tensor, torch::Tensor> Decoder::layer(const torch::Tensor& x, const torch::Tensor& pending,
                                                       int64_t index, const StepLayout& step, KvCache& cache) {
  const auto& s = spec();
  const int64_t N = step.rows, H = s.n_head, hd = s.head_dim();
  const LayerWeights w = weights_->acquire(index);
  // Attention. x: (N, C) fp32 residual stream.
  const auto [stream, q, k, v] = normed_queries_keys_values(x, pending, w, index, step, cache);
  const auto y = attention(q, k, v, index, step, cache);  // (N, H, hd)
  // Note [Decode step kernels]: the add converts the compute-dtype output to fp32 itself.
  auto a = linear(y.reshape({N, H * hd}), w.o, w.o_bias);
  if (w.attn_out_norm.defined()) a = norm_fp32(a, w.attn_out_norm, {}, s.norm_eps, s.parts.norm);
  // Feed-forward: gated (act(gate) * up, stacked) or not (GPT-2).
  const auto [r, inner] = normed_gated(stream, a, w);  // (N, F)
  auto f = linear(inner, w.down, w.down_bias);
  if (w.ff_out_norm.defined()) f = norm_fp32(f, w.ff_out_norm, {}, s.norm_eps, s.parts.norm);
  weights_->release(index);
  return {r, f};
}

// The norm of x in the compute dtype (Note [Generation forward]): one kernel where the fused norm
// takes it (Note [Decode fusions]).
torch::Tensor Decoder::norm_in(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias) const {
  const auto& s = spec();
  if (fused_norms_) return rms_norm_cast(x, w, s.norm_eps, s.parts.norm == NormKind::kRmsPlusOne, dtype());
  return norm_fp32(x, w, bias, s.norm_eps, s.parts.norm).to(dtype());
}

// r = x + a (a undefined: r = x) and r's norm in the compute dtype.
std::pair<torch::Tensor, torch::Tensor> Decoder::add_and_norm(const torch::Tensor& x, const torch::Tensor& a,
                                                              const torch::Tensor& w, const torch::Tensor& bias) const {
  if (!a.defined()) return {x, norm_in(x, w, bias)};
  const auto& s = spec();
  if (fused_norms_) return add_rms_norm_cast(x, a, w, s.norm_eps, s.parts.norm == NormKind::kRmsPlusOne, dtype());
  const auto r = x + a;
  return {r, norm_in(r, w, bias)};
}

// q and k rotated (RoPE) and v, the projections of h; the new keys and values written into the
// layer's cache at the step's slots. One kernel where the skinny products take h (Note [Skinny
// epilogues]), two where the decode fusions do.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> Decoder::queries_keys_values(
    const torch::Tensor& h, const LayerWeights& w, int64_t index, const StepLayout& step, KvCache& cache) const {
  const auto& s = spec();
  const int64_t N = step.rows, H = s.n_head, KV = s.n_kv_head, hd = s.head_dim(), Q = H * hd;
  auto kc = cache.keys(index), vc = cache.values(index);
  if (fused_rope_ && skinny_epilogues_ && skinny_linear_takes(h, w.qkv))
    return skinny_rope_kv(h, w.qkv, w.qkv_bias, H, KV, step.cos, step.sin, kc, vc, step.write_page, step.write_slot);
  const auto qkv = linear(h, w.qkv, w.qkv_bias);  // (N, Q+2KVhd)
  const auto v = qkv.narrow(1, Q + KV * hd, KV * hd).view({N, KV, hd});
  if (fused_rope_) {
    auto [q, k] = rope_write_kv(qkv, H, KV, step.cos, step.sin, kc, vc, step.write_page, step.write_slot);
    return {q, k, v};
  }
  auto qk = qkv.narrow(1, 0, Q + KV * hd).view({N, H + KV, hd});
  if (rope_) qk = apply_rope(qk, step.cos, step.sin);
  const auto k = qk.narrow(1, H, KV);
  kc.index_put_({step.write_page, Slice(), step.write_slot}, k);
  vc.index_put_({step.write_page, Slice(), step.write_slot}, v);
  return {qk.narrow(1, 0, H), k, v};
}

// {r, q, k, v}: r = x + pending, then q, k and v of r's attention norm (queries_keys_values). One
// kernel where the q/k/v product takes the norm (Note [Norm in the product]).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> Decoder::normed_queries_keys_values(
    const torch::Tensor& x, const torch::Tensor& pending, const LayerWeights& w, int64_t index, const StepLayout& step,
    KvCache& cache) const {
  const auto& s = spec();
  if (norms_in_products_ && fused_rope_ && !w.attn_norm_bias.defined()) {
    const NormedInput in{x, pending, w.attn_norm, s.norm_eps, s.parts.norm == NormKind::kRmsPlusOne};
    if (skinny_norm_in_takes(in, w.qkv, dtype())) {
      ++normed_products_;
      auto kc = cache.keys(index), vc = cache.values(index);
      return skinny_rope_kv(in, w.qkv, w.qkv_bias, s.n_head, s.n_kv_head, step.cos, step.sin, kc, vc, step.write_page,
                            step.write_slot);
    }
  }
  const auto [r, h] = add_and_norm(x, pending, w.attn_norm, w.attn_norm_bias);
  auto [q, k, v] = queries_keys_values(h, w, index, step, cache);
  return {r, q, k, v};
}

// {r, inner}: r = x + a, then the feed-forward's inner activation of r's norm (gated). One kernel
// where the (gate, up) product takes the norm (Note [Norm in the product]).
std::pair<torch::Tensor, torch::Tensor> Decoder::normed_gated(const torch::Tensor& x, const torch::Tensor& a,
                                                              const LayerWeights& w) const {
  const auto& s = spec();
  if (norms_in_products_ && fused_act_ && !w.ff_norm_bias.defined()) {
    const NormedInput in{x, a, w.ff_norm, s.norm_eps, s.parts.norm == NormKind::kRmsPlusOne};
    if (skinny_norm_in_takes(in, w.gate_up, dtype())) {
      ++normed_products_;
      return skinny_silu_mul(in, w.gate_up, w.gate_up_bias);
    }
  }
  const auto [r, h] = add_and_norm(x, a, w.ff_norm, w.ff_norm_bias);
  return {r, gated(h, w)};
}

// The feed-forward's inner activation of h: act(gate) * up of the stacked (gate, up) product, or
// act(up) for an ungated feed-forward. One kernel where the skinny products take h (Note [Skinny
// epilogues]).
torch::Tensor Decoder::gated(const torch::Tensor& h, const LayerWeights& w) const {
  const auto& p = spec().parts;
  if (fused_act_ && skinny_epilogues_ && skinny_linear_takes(h, w.gate_up))
    return skinny_silu_mul(h, w.gate_up, w.gate_up_bias);
  const auto gu = linear(h, w.gate_up, w.gate_up_bias);
  if (fused_act_) return silu_mul(gu);
  const int64_t F = spec().d_ff;
  return p.gated_ffn ? activate(gu.narrow(1, 0, F), p.act) * gu.narrow(1, F, F) : activate(gu, p.act);
}

torch::Tensor Decoder::forward(const std::vector<SequenceChunk>& batch, KvCache& cache, LogitRows rows) {
  TANDEM_ASSERT(!batch.empty(), "a step without sequences");
  const c10::InferenceMode inference;
  const c10::DeviceGuard device_guard(device());
  const StepLayout step = layout(batch, cache, rows);
  // Note [No per-shape attention plans]: a step that prefills calls SDPA for its prefills unless they
  // are packed (Note [Packed prefill attention]), and for its decode rows without the paged kernel.
  const bool sdpa = step.packed.max_q == 0 || (step.decodes > 0 && !paged_attention_);
  const NoCudnnAttention no_plans(step.rows > step.decodes && sdpa);
  prepare_decode_step(cache);
  return run(step, cache);
}

void Decoder::set_positions(StepLayout& s, const torch::Tensor& positions) {
  s.positions = positions;
  if (!rope_ || rope_->depends_on_length()) return;  // dynamic: set_dynamic_rope
  auto [cos, sin] = rope_->get(spec().max_seq_len, device(), dtype());
  s.cos = cos.index_select(0, positions).unsqueeze(1);
  s.sin = sin.index_select(0, positions).unsqueeze(1);
}

// Dynamic RoPE: each chunk's rows from the table of its sequence's length with them, as
// transformers computes a sequence's new tokens (Note [Generation forward]).
void Decoder::set_dynamic_rope(const std::vector<SequenceChunk>& batch, const std::vector<size_t>& order,
                               StepLayout& s) {
  std::vector<torch::Tensor> cos, sin;
  for (const size_t b : order) {
    const auto& c = batch[b];
    const auto T = static_cast<int64_t>(c.tokens.size());
    auto [tc, ts] = rope_->get(c.start + T, device(), dtype());
    cos.push_back(tc.narrow(0, c.start, T));
    sin.push_back(ts.narrow(0, c.start, T));
  }
  s.cos = torch::cat(cos).unsqueeze(1);
  s.sin = torch::cat(sin).unsqueeze(1);
}

StepLayout Decoder::decode_layout(const DecodeInputs& in, const KvCache& cache) {
  StepLayout s;
  s.rows = s.decodes = in.tokens.size(0);
  s.tokens = in.tokens;
  TANDEM_ASSERT(!(rope_ && rope_->depends_on_length()), "a recorded step with dynamic RoPE");
  set_positions(s, in.positions);
  s.write_page = in.write_page;
  s.write_slot = in.write_slot;
  s.decode_pages = in.pages;
  set_decode_masks(s, in.lengths, in.pages.size(1) * cache.page_tokens());
  s.logit_rows = torch::arange(s.rows, in.tokens.options());
  s.every_row = true;
  return s;
}

torch::Tensor Decoder::run(const StepLayout& step, KvCache& cache) {
  TANDEM_ASSERT(cache.shape().n_layer == spec().n_layer && cache.shape().dtype == dtype(),
                "KV cache of another shape or dtype");
  const c10::InferenceMode inference;
  const c10::DeviceGuard device_guard(device());
  if (step.rows == step.decodes && persistent_step(cache, step.rows))  // Note [Persistent decode step]
    return step_kernel_->run(
        {step.tokens, step.positions, step.write_page, step.write_slot, step.decode_lengths, step.decode_pages});
  const auto& w = *weights_;
  const auto& p = spec().parts;
  auto x = torch::embedding(w.embed(), step.tokens).to(torch::kFloat32);  // (N, C) fp32
  if (w.positions().defined()) x = x + torch::embedding(w.positions(), step.positions).to(torch::kFloat32);
  if (p.scale_embedding) x = x * std::sqrt(double(spec().d_model));
  torch::Tensor pending;  // Note [Residual carried into the next norm]
  for (int64_t i = 0; i < spec().n_layer; ++i) std::tie(x, pending) = layer(x, pending, i, step, cache);
  torch::Tensor h;
  if (step.every_row) {  // the add and the norm in one kernel, the same values (Note [Decode fusions])
    h = add_and_norm(x, pending, w.final_norm(), w.final_norm_bias()).second;
  } else {
    if (pending.defined()) x = x + pending;
    h = norm_in(x.index_select(0, step.logit_rows), w.final_norm(), w.final_norm_bias());
  }
  auto logits = linear(h, w.lm_head(), {}).to(torch::kFloat32);  // (B or N, V) fp32
  return p.final_softcap > 0 ? torch::tanh(logits / p.final_softcap) * p.final_softcap : logits;
}

}  // namespace tandem
