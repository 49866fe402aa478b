// Paged decode-attention CUDA kernels (Note [Paged decode attention]), launched as dependents (Note
// [Dependent launch]).

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "tandem/kernels/cuda_check.h"
#include "tandem/kernels/cuda_elements.cuh"
#include "tandem/kernels/dependent_launch.cuh"
#include "tandem/kernels/paged_attention.cuh"
#include "tandem/kernels/paged_attention_launch.h"

namespace tandem::detail {
namespace {

// One block per (sequence, key/value head, split): one item (paged_decode_item); G_MAX >= the
// query heads per key/value head.
template <class T, int HD, int G_MAX>
__global__ void __launch_bounds__(kPagedThreads) paged_decode_kernel(const PagedDecodeArgs a) {
  release_dependents();
  wait_for_prior_grids();
  __shared__ float shared[paged_item_floats(G_MAX, HD)];
  const auto sh = PagedItemShared::at(shared, G_MAX, HD);
  paged_decode_item<T, HD, G_MAX, ReadOnlyPath>(a, sh, blockIdx.x, blockIdx.y, static_cast<int>(blockIdx.z),
                                                static_cast<int>(threadIdx.x), [] { __syncthreads(); });
}

// The splits' partial sums of one (sequence, query head) combined: one block, a thread a dimension.
template <class T, int HD>
__global__ void __launch_bounds__(HD) paged_decode_combine(const PagedDecodeArgs a) {
  release_dependents();
  wait_for_prior_grids();
  const int64_t b = blockIdx.x, h = blockIdx.y;
  const int d = static_cast<int>(threadIdx.x);
  const float* p = a.partial + (b * a.H + h) * a.splits * (HD + 2);
  static_cast<T*>(a.out)[(b * a.H + h) * HD + d] = from_float<T>(combined_value<HD, ReadOnlyPath>(p, a.splits, d));
}

template <class T, int HD, int G_MAX>
void launch_shape(const PagedDecodeArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.B), static_cast<unsigned>(a.KV), static_cast<unsigned>(a.splits));
  launch_dependent(paged_decode_kernel<T, HD, G_MAX>, grid, dim3(kPagedThreads), 0, stream, a);
  if (a.splits > 1)
    launch_dependent(paged_decode_combine<T, HD>, dim3(static_cast<unsigned>(a.B), static_cast<unsigned>(a.H)),
                     dim3(HD), 0, stream, a);
}

template <class T, int HD>
void launch_group(const PagedDecodeArgs& a, cudaStream_t stream) {
  const int64_t G = a.H / a.KV;
  if (G == 1)
    launch_shape<T, HD, 1>(a, stream);
  else if (G <= 4)
    launch_shape<T, HD, 4>(a, stream);
  else
    launch_shape<T, HD, 8>(a, stream);
}

template <class T>
void launch_type(const PagedDecodeArgs& a, cudaStream_t stream) {
  switch (a.head_dim) {
    case 64:
      return launch_group<T, 64>(a, stream);
    case 128:
      return launch_group<T, 128>(a, stream);
    default:
      return launch_group<T, 256>(a, stream);
  }
}

}  // namespace

bool paged_decode_shape_supported(int64_t head_dim, int64_t group) {
  return (head_dim == 64 || head_dim == 128 || head_dim == 256) && group >= 1 && group <= 8;
}

int paged_decode_splits(int64_t B, int64_t KV, int64_t max_keys, int sm_count, int64_t* split_keys) {
  const int64_t blocks = std::max<int64_t>(1, B * KV);
  const int64_t want = std::max<int64_t>(1, (2 * int64_t{sm_count} + blocks - 1) / blocks);
  const int64_t by_keys = std::max<int64_t>(1, (max_keys + 127) / 128);
  int64_t splits = std::min(want, by_keys);
  int64_t keys = (max_keys + splits - 1) / splits;
  keys = std::max<int64_t>(32, (keys + 31) / 32 * 32);
  splits = (max_keys + keys - 1) / keys;
  *split_keys = keys;
  return static_cast<int>(std::max<int64_t>(1, splits));
}

void launch_paged_decode(const PagedDecodeArgs& a, cudaStream_t stream) {
  if (a.B == 0) return;
  with_element_type(a.elem, [&](auto tag) { launch_type<decltype(tag)>(a, stream); });
}

}  // namespace tandem::detail
