#pragma once
// A whole decode step of a decoder, every layer and the output projection, in one kernel launch.
//
// Note [Persistent decode step]
// A batch-1 decode step of the 1B folder ran as about 170 kernels (norm, q/k/v with RoPE, attention,
// output projection, norm, gate/up with silu, down, for each of 22 layers) at 45 % of its
// weight-read bound on an H100 even with dependent launches (Note [Dependent launch]): between two
// kernels the memory stands idle while one drains and the next ramps up, and the small kernels
// (norms, attention) read almost nothing while they run. Here one cooperative launch of one block
// per multiprocessor runs the step:
// - Weights stream without pause. Each block owns a fixed share of the units of every matrix (a
//   unit is what one warp computes: a row, a rotated pair of q/k rows, a (gate, up) pair; the same
//   units as Note [Skinny epilogues]). Its producer warp walks the block's units for the whole step,
//   layer after layer, and copies their rows with Hopper's bulk copies into a ring of stages in
//   shared memory (mbarriers count the bytes in and the readers out). It never waits for the
//   activations, only for a free stage, so while the consumers normalise, attend or wait at a
//   barrier the next matrix's rows are already arriving.
// - Sixteen consumer warps in four groups: stage s is read by group s % 4 (the ring's slots are a
//   multiple of four, so a slot is always one group's), one unit a warp, against the step's rows of
//   x held in shared memory.
// - The consumers of all blocks meet at a grid barrier where the next part needs every block's
//   outputs: after q/k/v (the attention needs every head), after the attention, after the output
//   projection and after gate/up and down (each norm and product needs the whole row): five a layer.
//   Each block computes the norms itself from the fp32 residual stream (block 0 writes the stream);
//   the attention's items (row, key/value head, split of the keys) are spread over every group of
//   the grid, and the last item of a (row, head) to end combines its splits.
// - Bits. The products' sums walk each lane's pieces in the skinny kernels' order, the norm is the
//   fused norm's row with the same 512 threads, the attention is the paged kernel's item with the
//   same splits, and the epilogues are the same functions (kernels/*.cuh): a step's logits equal the
//   layered kernels' bit for bit (tests/kernels/decode_step_test.cpp).
// - Reach. Rows 1 to 4 (batches of 1, 2 and 4 are what recorded decode steps pad to), fp16 and bf16,
//   RMS norms, a gated silu feed-forward, RoPE (any rotary fraction), heads of 64 or 128 dimensions
//   with up to 8 query heads a key/value head, biases, sliding windows; every layer resident; a GPU of
//   compute capability 9.0 or more (the bulk copies). Anything else runs the layered kernels.
// - Measured (docs/benchmarks.md, "Decode as one launch"): slower than the layered kernels, so it is
//   not the default (TANDEM_DECODE_KERNELS=persistent turns it on). On an H200 the 1B folder's batch-1
//   step took 1.66-1.76 ms against 1.07-1.11 ms, the 7B shape's 6.82-6.86 against 4.31. The products
//   stream at 2.0-4.6 TB/s (gate/up near the bandwidth), but per layer the attention's items take
//   22-30 us (the layered kernels' whole layer takes about 49; why an item is this slow here is not
//   yet known: its chain of dependent loads under this kernel's 96-register cap is the suspect), and
//   the five grid barriers wait 3.3-6.4 us each. Note [Persistent step trace] shows a step part by part.

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem {

/// One layer as the step reads it, in its dtype (the norms fp32): q/k/v stacked ((H + 2 KV) hd, C),
/// o (C, H hd), gate and up stacked (2 F, C), down (C, F), biases undefined where there are none;
/// its key and value caches (P, KV, page_tokens, hd); its sliding window (0: none).
struct DecodeStepLayerWeights {
  torch::Tensor qkv, qkv_bias, o, o_bias, gate_up, gate_up_bias, down, down_bias;
  torch::Tensor attn_norm, ff_norm;
  torch::Tensor k_cache, v_cache;
  int64_t window = 0;
};

/// What a step reads besides its inputs: the layers, the embedding (V', C), the final norm (C) fp32,
/// the output projection (V, C) and RoPE's tables (positions, rotary), all on one device.
struct DecodeStepModel {
  std::vector<DecodeStepLayerWeights> layers;
  torch::Tensor embed, final_norm, lm_head, cos, sin;
  int64_t n_head = 0, n_kv_head = 0, head_dim = 0;
  double eps = 1e-5;
  double scale = 0;       ///< the scores' scale; 0: 1 / sqrt(head_dim)
  bool plus_one = false;  ///< norms scale by 1 + w
};

/// A step's inputs on the model's device, int64: the new token, its position, where its key and value
/// go (page, slot) and its sequence's length with it, (B) each; the page tables (B, P).
struct DecodeStepInputs {
  torch::Tensor tokens, positions, write_page, write_slot, lengths, pages;
};

/// A model prepared for the persistent step (Note [Persistent decode step]); one thread at a time.
class DecodeStep {
 public:
  virtual ~DecodeStep() = default;
  /// The most rows a step takes.
  static constexpr int64_t kMaxRows = 4;
  /// Whether a step of `rows` rows runs here.
  virtual bool takes(int64_t rows) const = 0;
  /// The step's fp32 logits (B, V), the layered kernels' bits, and its keys and values written into
  /// the caches. Queues device work only (it may be recorded into a CUDA graph).
  virtual torch::Tensor run(const DecodeStepInputs& in) = 0;
};

/// The step for `model`, prepared on its device (call it outside a recording), or null with *why
/// naming what it does not take: no CUDA build, a GPU before compute capability 9.0, the model's
/// shapes or dtype.
std::unique_ptr<DecodeStep> make_decode_step(const DecodeStepModel& model, std::string* why);

namespace detail {

/// The CUDA implementation, registered by the CUDA build (kernels/decode_step_cuda.cpp).
using MakeDecodeStepFn = std::unique_ptr<DecodeStep> (*)(const DecodeStepModel& model, std::string* why);
MakeDecodeStepFn& decode_step_cuda();

}  // namespace detail
}  // namespace tandem
