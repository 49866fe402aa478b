#pragma once
// Launcher of the paged decode-attention kernels (kernels/paged_attention.cu): raw device pointers
// and an explicit stream, no LibTorch. See Note [Paged decode attention].

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tandem/kernels/element_type.h"
#include "tandem/kernels/paged_item.h"

namespace tandem::detail {

struct PagedDecodeArgs {
  const void* q = nullptr;  ///< (B, H, hd), strides q_stride_b, q_stride_h, 1
  int64_t q_stride_b = 0, q_stride_h = 0;
  const void* k_cache = nullptr;  ///< (P, KV, page_tokens, hd) contiguous
  const void* v_cache = nullptr;
  const int64_t* pages = nullptr;  ///< (B, W), row stride pages_stride
  int64_t pages_stride = 0;
  const int64_t* lengths = nullptr;  ///< (B)
  void* out = nullptr;               ///< (B, H, hd) contiguous
  float* partial = nullptr;          ///< (B, H, splits, hd + 2) fp32 scratch when splits > 1
  int64_t B = 0, H = 0, KV = 0, head_dim = 0, page_tokens = 0;
  int64_t window = 0;  ///< <= 0: none
  float scale = 1.0f;
  int splits = 1;                        ///< blocks a sequence's keys are split over
  int64_t split_keys = 0;                ///< keys a split covers (a multiple of 32)
  ElementType elem = ElementType::kF32;  ///< of the queries, the caches and the output
};

/// Whether a kernel is compiled for this shape: head_dim 64, 128 or 256, at most 8 query heads a
/// key/value head.
bool paged_decode_shape_supported(int64_t head_dim, int64_t group);

/// Splits of at most `max_keys` keys a sequence for B sequences over KV heads on `sm_count`
/// multiprocessors: enough blocks to fill the GPU twice, at least 128 keys a split. Sets
/// *split_keys.
int paged_decode_splits(int64_t B, int64_t KV, int64_t max_keys, int sm_count, int64_t* split_keys);

/// Queues the kernel (and the combining one when args.splits > 1) on `stream`.
void launch_paged_decode(const PagedDecodeArgs& args, cudaStream_t stream);

}  // namespace tandem::detail
