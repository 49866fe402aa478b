#pragma once
// Launcher of the persistent decode step (kernels/decode_step.cu, Note [Persistent decode step] in
// kernels/decode_step.h): raw device pointers and an explicit stream, no LibTorch.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tandem/kernels/decode_step_plan.h"
#include "tandem/kernels/element_type.h"

namespace tandem::detail {

/// One decoder layer's weights and caches, device pointers in the step's dtype (the norms fp32); a
/// bias is null where the layer has none.
struct DecodeStepLayer {
  const void* qkv = nullptr;  ///< ((H + 2 KV) hd, C)
  const void* qkv_bias = nullptr;
  const void* o = nullptr;  ///< (C, H hd)
  const void* o_bias = nullptr;
  const void* gate_up = nullptr;  ///< (2 F, C): gate, then up
  const void* gate_up_bias = nullptr;
  const void* down = nullptr;  ///< (C, F)
  const void* down_bias = nullptr;
  const float* attn_norm = nullptr;  ///< (C)
  const float* ff_norm = nullptr;    ///< (C)
  void* k_cache = nullptr;           ///< (P, KV, page_tokens, hd)
  void* v_cache = nullptr;
  int64_t window = 0;  ///< a sliding window of this many keys; <= 0: none
};

/// Everything one launch reads and writes.
struct DecodeStepArgs {
  DecodeStepDims dims;
  DecodeStepPlan plan;
  ElementType elem = ElementType::kBF16;
  const DecodeStepLayer* layers = nullptr;  ///< (n_layer), in device memory
  const void* embed = nullptr;              ///< (V', C): row tokens[n] is row n's input
  const float* final_norm = nullptr;        ///< (C)
  const void* lm_head = nullptr;            ///< (V, C)
  const void* cos = nullptr;                ///< (positions, rotary): RoPE's table
  const void* sin = nullptr;
  // The step's inputs, int64 (rows) each, and the page tables (rows, pages_stride).
  const int64_t* tokens = nullptr;
  const int64_t* positions = nullptr;
  const int64_t* write_page = nullptr;
  const int64_t* write_slot = nullptr;
  const int64_t* lengths = nullptr;
  const int64_t* pages = nullptr;
  int64_t pages_stride = 0;
  /// The attention's splits of the keys (paged_decode_splits) in layers without a window ([0]) and
  /// with one ([1]).
  int splits[2] = {1, 1};
  int64_t split_keys[2] = {0, 0};
  // Scratch in device memory.
  float* stream = nullptr;    ///< (2, rows, C): the residual stream
  void* ff_out = nullptr;     ///< (rows, C): the feed-forward's output, added at the next norm
  void* attn_proj = nullptr;  ///< (rows, C): the attention's output projection
  void* q = nullptr;          ///< (rows, H, hd)
  void* attn = nullptr;       ///< (rows, H, hd): the attention's output
  void* inner = nullptr;      ///< (rows, F): silu(gate) * up
  float* partial = nullptr;   ///< (rows, H, splits, hd + 2): the attention's splits
  unsigned* sync = nullptr;   ///< decode_step_sync_words(dims) zeroed words, left zeroed
  float* logits = nullptr;    ///< (rows, V): the output
  /// When given, (blocks, decode_step_marks(dims)): each block's clock (clock64) as each part of the
  /// step ends (Note [Persistent step trace]).
  long long* trace = nullptr;
};

/// The parts of a layer the trace marks, and the marks of a step (the layers', then the final norm's
/// and the logits').
constexpr int kDecodeStepLayerMarks = 14;
TANDEM_HOST_DEVICE int64_t decode_step_marks(const DecodeStepDims& d) { return d.n_layer * kDecodeStepLayerMarks + 3; }

/// Words of `sync` a step takes: the grid barrier, the blocks that have ended, and one arrival count
/// per (row, key/value head) for the attention's splits.
inline int64_t decode_step_sync_words(const DecodeStepDims& d) { return 2 + d.rows * d.KV; }

/// Queues the step on `stream`: plan.blocks blocks, all resident at once (a cooperative launch).
void launch_decode_step(const DecodeStepArgs& args, cudaStream_t stream);

}  // namespace tandem::detail
