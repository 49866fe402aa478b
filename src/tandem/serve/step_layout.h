#pragma once
// Where each new token of a generation step goes: the device tensors one forward of Decoder
// reads besides the weights and the KV cache (Note [Generation forward]). Built on the host from the
// sequences' chunks (Decoder::layout), or on the device from a recorded decode step's inputs
// (Decoder::decode_layout, Note [Decode graphs]).

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace tandem {

/// A step's prefill chunks packed for FlashAttention's variable-length kernel (Note [Packed
/// prefill attention]): chunk i's query rows are [cu_q[i], cu_q[i + 1]) of the prefill rows, its
/// sequence's keys (the cached ones and its own) [cu_k[i], cu_k[i + 1]) of the packed keys.
struct PackedPrefills {
  int64_t max_q = 0, max_k = 0;      // the longest chunk, the longest sequence with it
  torch::Tensor cu_q, cu_k;          // (S + 1) int32
  torch::Tensor key_page, key_slot;  // (K) int64: where each packed key lies in the cache
};

/// Rows are in "step order": the one-token chunks first, then the others, each chunk's tokens
/// consecutive.
struct StepLayout {
  int64_t rows = 0;
  torch::Tensor tokens;                  // (N) int64
  torch::Tensor positions;               // (N) int64
  torch::Tensor cos, sin;                // (N, 1, rotary_dim) compute dtype; undefined with learned positions
  torch::Tensor write_page, write_slot;  // (N) int64: where each token's keys and values go
  int64_t decodes = 0;                   // rows [0, decodes) are one-token chunks
  torch::Tensor decode_pages;            // (B_d, P) int64, padded with any page
  torch::Tensor decode_lengths;          // (B_d) int64: each sequence's tokens with the new one
  // Note [Decode masks once a step]: additive (0 or -inf, compute dtype) unless scores are soft-capped;
  // undefined where the paged kernel attends (Note [Paged decode attention]).
  torch::Tensor decode_mask;         // (B_d, 1, 1, P * page_tokens): key within the sequence
  torch::Tensor decode_window_mask;  // the same, and within the sliding window (models with one)
  struct Prefill {
    int64_t row = 0, count = 0, start = 0;
    bool grouped = false;       // attends in `fresh` with the other new sequences
    torch::Tensor pages;        // (1, P) int64 (start > 0 only)
    torch::Tensor mask;         // (1, 1, count, start + count) bool (start > 0 only)
    torch::Tensor window_mask;  // mask within the sliding window; (count, count) causal when start = 0
  };
  std::vector<Prefill> prefills;
  /// Several sequences starting at 0 attend together, padded to the longest (B, T).
  struct FreshGroup {
    int64_t count = 0, width = 0;  // B, T
    torch::Tensor gather;          // (B * T) int64: the step row of each padded place (padding: the first)
    torch::Tensor mask;            // (B, 1, T, T) bool: key s <= min(t, length - 1)
    torch::Tensor window_mask;     // mask within the sliding window
    torch::Tensor places, rows;    // (M) int64: the padded places of real tokens and their step rows
  } fresh;
  /// Note [Packed prefill attention]: every prefill of the step in one call (max_q 0: none, or
  /// the per-chunk layout above).
  PackedPrefills packed;
  torch::Tensor logit_rows;  // (B) or (N) int64: the rows whose logits are returned, in batch order
  bool every_row = false;    // logit_rows is 0 to rows - 1: every row's logits, in order
};

/// A decode step (one new token per sequence) as device tensors of fixed shapes, which a recorded
/// step reads (Note [Decode graphs]).
struct DecodeInputs {
  torch::Tensor tokens, positions;       // (B) int64: the new token and its position
  torch::Tensor write_page, write_slot;  // (B) int64: where its keys and values go
  torch::Tensor lengths;                 // (B) int64: the sequence's tokens with the new one
  torch::Tensor pages;                   // (B, P) int64: the sequence's page table, padded
};

}  // namespace tandem
