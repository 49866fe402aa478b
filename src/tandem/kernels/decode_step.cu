// The persistent decode step's CUDA kernel (Note [Persistent decode step] in kernels/decode_step.h):
// one launch of one block per multiprocessor runs every layer and the output projection of a decode
// step of up to four rows. In each block a producer warp streams the block's weight rows into a ring
// of shared memory with bulk copies while sixteen consumer warps compute; the consumers of all blocks
// meet at a grid barrier wherever the next part needs every block's outputs.

#include <cuda_runtime.h>

#include <cstdint>

#include "tandem/kernels/bulk_copy.cuh"
#include "tandem/kernels/cuda_check.h"
#include "tandem/kernels/cuda_elements.cuh"
#include "tandem/kernels/decode_fusions.cuh"
#include "tandem/kernels/decode_step_launch.h"
#include "tandem/kernels/grid_sync.cuh"
#include "tandem/kernels/paged_attention.cuh"
#include "tandem/kernels/skinny_epilogues.cuh"
#include "tandem/kernels/skinny_rows.cuh"

// Below compute capability 9.0 the kernel's body is empty (the bulk copies are Hopper's), and its parts
// go unused there.
#pragma nv_diag_suppress 177

namespace tandem::detail {
namespace {

constexpr int kConsumerWarps = 16;
constexpr int kConsumers = 32 * kConsumerWarps;
constexpr int kThreads = kConsumers + 32;  // and the producer warp
constexpr int kConsumerBarrier = 1;        // named barrier of every consumer; 2 + g: group g's
constexpr int kQueryGroupMax = 8;          // the attention's G_MAX
static_assert(kConsumers == kNormThreads, "the consumers compute the fused norm's rows as its block does");
static_assert(kDecodeStepGroups * kPagedWarps == kConsumerWarps, "a group of consumers is one attention item's warps");

// The block's shared memory (Note [Persistent decode step]).
struct Shared {
  uint64_t* full;   // (kDecodeStepMaxSlots): a stage's bytes have arrived
  uint64_t* empty;  // (kDecodeStepMaxSlots): a stage's group is done with it
  float* partial;   // (kConsumerWarps): the norm's warp sums
  int* flags;       // (kDecodeStepGroups): a group's item combines its head's splits
  unsigned char* x;
  unsigned char* ring;
};

__device__ __forceinline__ Shared carve(unsigned char* base, const DecodeStepPlan& p) {
  Shared s;
  s.full = reinterpret_cast<uint64_t*>(base);
  s.empty = s.full + kDecodeStepMaxSlots;
  s.partial = reinterpret_cast<float*>(s.empty + kDecodeStepMaxSlots);
  s.flags = reinterpret_cast<int*>(s.partial + kConsumerWarps);
  s.x = base + kDecodeStepHeaderBytes;
  s.ring = s.x + p.x_bytes;
  return s;
}

// The rows of weight unit `unit` of matrix m in global memory; returns how many (1 or 2).
__device__ __forceinline__ int unit_rows(const DecodeStepDims& d, StepMatrix m, int64_t unit, int64_t (&row)[2]) {
  if (m == StepMatrix::kQkv) {
    const QkvShape s = qkv_shape(d);
    const QkvUnit u = qkv_unit(s, unit);
    row[0] = u.row(s);
    if (u.partner < 0) return 1;
    row[1] = u.partner_row(s);
    return 2;
  }
  row[0] = unit;
  if (m != StepMatrix::kGateUp) return 1;
  row[1] = d.F + unit;
  return 2;
}

// ---------------------------------------------------------------------------------------------
// The producer: the block's weight rows for the whole step, stage after stage, each stage's slot
// taken once the group that read it last is done.

template <class T>
__device__ __forceinline__ void stream_matrix(const DecodeStepArgs& a, const Shared& sh, const void* w, StepMatrix m,
                                              uint32_t& stage) {
  const DecodeStepDims& d = a.dims;
  const BlockUnits bu = block_units(d, a.plan, m, blockIdx.x);
  const MatrixUnits mu = matrix_units(d, m);
  const uint32_t row_bytes = static_cast<uint32_t>(mu.K * sizeof(T));
  for (int64_t t = 0; t < bu.stages; ++t, ++stage) {
    const uint32_t slot = stage % a.plan.slots, use = stage / a.plan.slots;
    if (use > 0) mbarrier_wait(&sh.empty[slot], (use - 1) & 1);
    const int64_t u0 = bu.begin + t * bu.per_stage, u1 = min(u0 + bu.per_stage, bu.end);
    uint32_t bytes = 0;
    int64_t row[2];
    for (int64_t u = u0; u < u1; ++u) bytes += unit_rows(d, m, u, row) * row_bytes;
    mbarrier_arrive_expect_bytes(&sh.full[slot], bytes);
    unsigned char* dst = sh.ring + int64_t{slot} * a.plan.slot_bytes;
    const auto* src = static_cast<const unsigned char*>(w);
    for (int64_t u = u0; u < u1; ++u) {
      const int n = unit_rows(d, m, u, row);
      for (int j = 0; j < n; ++j)
        bulk_copy_to_shared(dst + ((u - u0) * mu.unit_rows + j) * row_bytes, src + row[j] * row_bytes, row_bytes,
                            &sh.full[slot]);
    }
  }
}

template <class T>
__device__ __forceinline__ void produce(const DecodeStepArgs& a, const Shared& sh) {
  uint32_t stage = 0;
  for (int64_t l = 0; l < a.dims.n_layer; ++l) {
    const DecodeStepLayer& L = a.layers[l];
    stream_matrix<T>(a, sh, L.qkv, StepMatrix::kQkv, stage);
    stream_matrix<T>(a, sh, L.o, StepMatrix::kO, stage);
    stream_matrix<T>(a, sh, L.gate_up, StepMatrix::kGateUp, stage);
    stream_matrix<T>(a, sh, L.down, StepMatrix::kDown, stage);
  }
  stream_matrix<T>(a, sh, a.lm_head, StepMatrix::kHead, stage);
}

// ---------------------------------------------------------------------------------------------
// The consumers.

// Where a consumer thread is.
struct Consumer {
  int tid, warp, lane, group;
  uint32_t stage = 0;  // the next matrix's first stage in the block's stream
  GridBarrier grid;

  __device__ __forceinline__ void all() const { named_barrier(kConsumerBarrier, kConsumers); }
  __device__ __forceinline__ void sync_grid() { grid.sync(tid, kConsumerBarrier, kConsumers); }
  // Note [Persistent step trace]: the block's clock once every consumer has ended mark `index`'s part.
  __device__ __forceinline__ void mark(const DecodeStepArgs& a, int64_t index) const {
    if (a.trace == nullptr) return;
    all();
    if (tid == 0) a.trace[blockIdx.x * decode_step_marks(a.dims) + index] = clock64();
  }
};

// Matrix m's stages of this block, each by its group's warps, a unit a warp at a time, against x
// (ROWS rows of K elements in shared memory): finish(unit, sums) with the sums of both rows (the
// second 0 for units of one row) on every lane of the warp.
template <class T, int ROWS, class Finish>
__device__ __forceinline__ void consume_matrix(const DecodeStepArgs& a, const Shared& sh, Consumer& c, StepMatrix m,
                                               const T* x, Finish finish) {
  const DecodeStepDims& d = a.dims;
  const BlockUnits bu = block_units(d, a.plan, m, blockIdx.x);
  const MatrixUnits mu = matrix_units(d, m);
  const int in_group = c.warp % kPagedWarps;
  for (int64_t t = 0; t < bu.stages; ++t) {
    const uint32_t stage = c.stage + static_cast<uint32_t>(t);
    if (static_cast<int>(stage % kDecodeStepGroups) != c.group) continue;
    const uint32_t slot = stage % a.plan.slots, use = stage / a.plan.slots;
    mbarrier_wait(&sh.full[slot], use & 1);
    const int64_t u0 = bu.begin + t * bu.per_stage, n = min(bu.per_stage, bu.end - u0);
    const T* base = reinterpret_cast<const T*>(sh.ring + int64_t{slot} * a.plan.slot_bytes);
    for (int64_t i = in_group; i < n; i += kPagedWarps) {
      int64_t row[2];
      const int rows = unit_rows(d, m, u0 + i, row);
      const T* w0 = base + i * mu.unit_rows * mu.K;
      float sum[2][ROWS];
      if (rows == 2) {
        const T* w[2] = {w0, w0 + mu.K};
        shared_dots<T, ROWS, 2>(x, w, mu.K, c.lane, sum);
      } else {
        const T* w[1] = {w0};
        float one[1][ROWS];
        shared_dots<T, ROWS, 1>(x, w, mu.K, c.lane, one);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) sum[0][r] = one[0][r], sum[1][r] = 0.0f;
      }
      finish(u0 + i, sum);
    }
    __syncwarp();
    if (c.lane == 0) mbarrier_arrive(&sh.empty[slot]);
  }
  c.stage += static_cast<uint32_t>(bu.stages);
}

// Four elements at p, written by other blocks during the step, as floats.
template <class T>
__device__ __forceinline__ void load4_l2(const T* p, float* v) {
  if constexpr (sizeof(T) == 4) {
    const float4 f = coherent_load(reinterpret_cast<const float4*>(p));
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
    const uint2 raw = coherent_load(reinterpret_cast<const uint2*>(p));
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = to_float(e[i]);
  }
}

// The fused norm of each row into x (ROWS rows of C): r = stream + add (add null: the stream alone),
// r written to `out_stream` when given (block 0 only: every block computes the same rows).
template <class T, int ROWS>
__device__ __forceinline__ void norm_rows(const DecodeStepArgs& a, const Shared& sh, const Consumer& c,
                                          const float* stream, const T* add, float* out_stream, const float* w, T* x) {
  const DecodeStepDims& d = a.dims;
  const int C = static_cast<int>(d.C);
  for (int n = 0; n < ROWS; ++n) {
    const float* s = stream + n * d.C;
    const T* an = add == nullptr ? nullptr : add + n * d.C;
    add_rms_norm_row([&](int i, float* v) { load4_l2(s + i, v); }, [&](int i, float* v) { load4_l2(an + i, v); },
                     an != nullptr, out_stream == nullptr ? nullptr : out_stream + n * d.C, w, x + n * d.C, C, d.eps,
                     d.plus_one, c.tid, sh.partial, [&] { c.all(); });
    c.all();  // the warp sums are read before the next row writes them
  }
}

// The first layer's norm, of the embeddings of the rows' tokens; block 0 keeps them as the stream.
template <class T, int ROWS>
__device__ __forceinline__ void embed_rows(const DecodeStepArgs& a, const Shared& sh, const Consumer& c,
                                           float* out_stream, const float* w, T* x) {
  const DecodeStepDims& d = a.dims;
  for (int n = 0; n < ROWS; ++n) {
    const T* e = static_cast<const T*>(a.embed) + a.tokens[n] * d.C;
    add_rms_norm_row([&](int i, float* v) { load4(e + i, v); }, [](int, float*) {}, false,
                     out_stream == nullptr ? nullptr : out_stream + n * d.C, w, x + n * d.C, static_cast<int>(d.C),
                     d.eps, d.plus_one, c.tid, sh.partial, [&] { c.all(); });
    c.all();
  }
}

// elems elements (a multiple of 16 bytes) that other blocks wrote, into x.
template <class T>
__device__ __forceinline__ void load_rows(const Consumer& c, const void* src, int64_t elems, T* x) {
  const int64_t pieces = elems * static_cast<int64_t>(sizeof(T)) / 16;
  for (int64_t i = c.tid; i < pieces; i += kConsumers)
    reinterpret_cast<uint4*>(x)[i] = coherent_load(static_cast<const uint4*>(src) + i);
  c.all();
}

// The layer's attention: the items (row, key/value head, split) over every group of the grid, as
// the paged kernel computes them; the last item of a (row, key/value head) to end combines its splits.
template <class T, int HD>
__device__ __forceinline__ void attend(const DecodeStepArgs& a, const DecodeStepLayer& L, const Shared& sh,
                                       const Consumer& c) {
  const DecodeStepDims& d = a.dims;
  const int w = L.window > 0 ? 1 : 0;
  PagedDecodeArgs p;
  p.q = a.q;
  p.q_stride_b = d.H * d.hd;
  p.q_stride_h = d.hd;
  p.k_cache = L.k_cache;
  p.v_cache = L.v_cache;
  p.pages = a.pages;
  p.pages_stride = a.pages_stride;
  p.lengths = a.lengths;
  p.out = a.attn;
  p.partial = a.partial;
  p.B = d.rows, p.H = d.H, p.KV = d.KV, p.head_dim = d.hd, p.page_tokens = d.page_tokens;
  p.window = L.window;
  p.scale = d.scale;
  p.splits = a.splits[w];
  p.split_keys = a.split_keys[w];
  const int G = static_cast<int>(d.H / d.KV);
  const auto sh_item = PagedItemShared::at(reinterpret_cast<float*>(sh.x) + c.group * paged_item_floats(G, HD), G, HD);
  const int gtid = c.tid % kPagedThreads;
  const auto sync = [&] { named_barrier(2 + c.group, kPagedThreads); };
  unsigned* arrivals = a.sync + 2;
  const int64_t items = d.rows * d.KV * p.splits;
  // One item a block before a second in any (each multiprocessor reads its items' keys alone).
  for (int64_t item = int64_t{c.group} * gridDim.x + blockIdx.x; item < items;
       item += int64_t{gridDim.x} * kDecodeStepGroups) {
    const int64_t b = item / (d.KV * p.splits), kvh = (item / p.splits) % d.KV;
    const int split = static_cast<int>(item % p.splits);
    paged_decode_item<T, HD, kQueryGroupMax, L2Path>(p, sh_item, b, kvh, split, gtid, sync);
    if (p.splits == 1) continue;
    sync();  // every thread's partial sums are written
    if (gtid == 0) {
      __threadfence();
      sh.flags[c.group] = atomicAdd(&arrivals[b * d.KV + kvh], 1u) == static_cast<unsigned>(p.splits - 1);
    }
    sync();
    if (sh.flags[c.group] == 0) continue;
    __threadfence();
    for (int i = gtid; i < G * HD; i += kPagedThreads) {
      const int64_t h = kvh * G + i / HD;
      const float* part = a.partial + (b * d.H + h) * p.splits * (HD + 2);
      static_cast<T*>(a.attn)[(b * d.H + h) * HD + i % HD] =
          from_float<T>(combined_value<HD, L2Path>(part, p.splits, i % HD));
    }
    if (gtid == 0) arrivals[b * d.KV + kvh] = 0;  // every split has arrived: ready for the next layer
  }
}

template <class T, int ROWS>
__device__ __forceinline__ void consume(const DecodeStepArgs& a, const Shared& sh, int tid) {
  const DecodeStepDims& d = a.dims;
  Consumer c{tid, tid / 32, tid % 32, (tid / 32) / kPagedWarps, 0, GridBarrier{a.sync, gridDim.x}};
  T* x = reinterpret_cast<T*>(sh.x);
  float* s0 = a.stream;
  float* s1 = a.stream + ROWS * d.C;
  const bool writer = blockIdx.x == 0;
  const QkvShape qs = qkv_shape(d);
  T* ff_out = static_cast<T*>(a.ff_out);
  T* attn_proj = static_cast<T*>(a.attn_proj);
  T* inner = static_cast<T*>(a.inner);
  const T* cos = static_cast<const T*>(a.cos);
  const T* sin = static_cast<const T*>(a.sin);
  for (int64_t l = 0; l < d.n_layer; ++l) {
    const DecodeStepLayer& L = a.layers[l];
    const int64_t m0 = l * kDecodeStepLayerMarks;
    c.mark(a, m0);
    // The attention's norm (the previous layer's feed-forward output added), q, k and v.
    if (l == 0)
      embed_rows<T, ROWS>(a, sh, c, writer ? s1 : nullptr, L.attn_norm, x);
    else
      norm_rows<T, ROWS>(a, sh, c, s0, ff_out, writer ? s1 : nullptr, L.attn_norm, x);
    c.mark(a, m0 + 1);
    RopeKvArgs r;
    r.q_out = a.q;
    r.k_cache = L.k_cache;
    r.v_cache = L.v_cache;
    r.H = d.H, r.KV = d.KV, r.head_dim = d.hd, r.rotary = d.rotary, r.page_tokens = d.page_tokens;
    const T* qkv_bias = static_cast<const T*>(L.qkv_bias);
    consume_matrix<T, ROWS>(a, sh, c, StepMatrix::kQkv, x, [&](int64_t unit, const float(&sum)[2][ROWS]) {
      const int n = c.lane;  // lane n stores row n
      if (n >= ROWS) return;
      float va = 0.0f, vb = 0.0f;
#pragma unroll
      for (int i = 0; i < ROWS; ++i)
        if (i == n) va = sum[0][i], vb = sum[1][i];
      const int64_t pos = a.positions[n];
      finish_qkv_unit<T>(r, nullptr, qs, qkv_unit(qs, unit), qkv_bias, cos + pos * d.rotary, sin + pos * d.rotary, n,
                         a.write_page[n], a.write_slot[n], va, vb);
    });
    c.mark(a, m0 + 2);
    c.sync_grid();
    c.mark(a, m0 + 3);
    // Attention over the pages.
    switch (d.hd) {
      case 64:
        attend<T, 64>(a, L, sh, c);
        break;
      default:
        attend<T, 128>(a, L, sh, c);
    }
    c.mark(a, m0 + 4);
    c.sync_grid();
    c.mark(a, m0 + 5);
    // The output projection.
    load_rows<T>(c, a.attn, ROWS * d.H * d.hd, x);
    c.mark(a, m0 + 6);
    const T* o_bias = static_cast<const T*>(L.o_bias);
    consume_matrix<T, ROWS>(a, sh, c, StepMatrix::kO, x, [&](int64_t unit, const float(&sum)[2][ROWS]) {
      if (c.lane != 0) return;
#pragma unroll
      for (int n = 0; n < ROWS; ++n) {
        float v = sum[0][n];
        if (o_bias != nullptr) v += to_float(o_bias[unit]);
        attn_proj[n * d.C + unit] = from_float<T>(v);
      }
    });
    c.mark(a, m0 + 7);
    c.sync_grid();
    c.mark(a, m0 + 8);
    // The feed-forward's norm (the attention's output added), silu(gate) * up.
    norm_rows<T, ROWS>(a, sh, c, s1, attn_proj, writer ? s0 : nullptr, L.ff_norm, x);
    c.mark(a, m0 + 9);
    const T* gu_bias = static_cast<const T*>(L.gate_up_bias);
    consume_matrix<T, ROWS>(a, sh, c, StepMatrix::kGateUp, x, [&](int64_t unit, const float(&sum)[2][ROWS]) {
      if (c.lane != 0) return;
#pragma unroll
      for (int n = 0; n < ROWS; ++n) {
        const float g = product(sum[0][n], gu_bias, unit), u = product(sum[1][n], gu_bias, d.F + unit);
        inner[n * d.F + unit] = from_float<T>(silu_times<T>(g, u));
      }
    });
    c.mark(a, m0 + 10);
    c.sync_grid();
    c.mark(a, m0 + 11);
    // down.
    load_rows<T>(c, a.inner, ROWS * d.F, x);
    c.mark(a, m0 + 12);
    const T* down_bias = static_cast<const T*>(L.down_bias);
    consume_matrix<T, ROWS>(a, sh, c, StepMatrix::kDown, x, [&](int64_t unit, const float(&sum)[2][ROWS]) {
      if (c.lane != 0) return;
#pragma unroll
      for (int n = 0; n < ROWS; ++n) {
        float v = sum[0][n];
        if (down_bias != nullptr) v += to_float(down_bias[unit]);
        ff_out[n * d.C + unit] = from_float<T>(v);
      }
    });
    c.mark(a, m0 + 13);
    c.sync_grid();
  }
  // The final norm and the logits.
  const int64_t last = d.n_layer * kDecodeStepLayerMarks;
  c.mark(a, last);
  norm_rows<T, ROWS>(a, sh, c, s0, ff_out, nullptr, a.final_norm, x);
  c.mark(a, last + 1);
  consume_matrix<T, ROWS>(a, sh, c, StepMatrix::kHead, x, [&](int64_t unit, const float(&sum)[2][ROWS]) {
    if (c.lane != 0) return;
#pragma unroll
    for (int n = 0; n < ROWS; ++n) a.logits[n * d.V + unit] = round_to<T>(sum[0][n]);
  });
  c.mark(a, last + 2);
  // The last block to end leaves the barrier's words zeroed for the next step.
  c.all();
  if (tid == 0) {
    __threadfence();
    if (atomicAdd(a.sync + 1, 1u) == gridDim.x - 1) {
      a.sync[0] = 0;
      a.sync[1] = 0;
      __threadfence();
    }
  }
}

template <class T, int ROWS>
__global__ void __launch_bounds__(kThreads, 1) decode_step_kernel(const DecodeStepArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char shared[];
  const Shared sh = carve(shared, a.plan);
  if (threadIdx.x == 0) {
    for (int i = 0; i < a.plan.slots; ++i) {
      mbarrier_init(&sh.full[i], 1);
      mbarrier_init(&sh.empty[i], kPagedWarps);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x >= kConsumers) {
    if (threadIdx.x == kConsumers) produce<T>(a, sh);
    return;
  }
  consume<T, ROWS>(a, sh, static_cast<int>(threadIdx.x));
#endif
}

template <class T, int ROWS>
void launch_rows(const DecodeStepArgs& a, cudaStream_t stream) {
  const auto kernel = decode_step_kernel<T, ROWS>;
  TANDEM_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(a.plan.smem_bytes)));
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeCooperative;
  attribute[0].val.cooperative = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(a.plan.blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(a.plan.smem_bytes);
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = 1;
  TANDEM_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, a));
}

template <class T>
void launch_type(const DecodeStepArgs& a, cudaStream_t stream) {
  switch (a.dims.rows) {
    case 1:
      return launch_rows<T, 1>(a, stream);
    case 2:
      return launch_rows<T, 2>(a, stream);
    case 3:
      return launch_rows<T, 3>(a, stream);
    default:
      return launch_rows<T, 4>(a, stream);
  }
}

}  // namespace

void launch_decode_step(const DecodeStepArgs& a, cudaStream_t stream) {
  TANDEM_ASSERT(a.dims.rows >= 1 && a.dims.rows <= 4 && a.elem != ElementType::kF32,
                "the persistent decode step given ", a.dims.rows, " rows or fp32");
  if (a.elem == ElementType::kBF16)
    launch_type<__nv_bfloat16>(a, stream);
  else
    launch_type<__half>(a, stream);
}

}  // namespace tandem::detail
