// BK-core CUDA kernels: Note [BK-core ratio form], one batch row per thread. These are the
// correctness kernels the reference and CPU path are checked against on the GPU; the parallel
// scan over the recursion (Moebius-transform composition) is the performance path still to come.

#include <cuda_runtime.h>

#include "tandem/kernels/bk_core_launch.h"
#include "tandem/kernels/cuda_check.h"

namespace tandem::detail {
namespace {

template <class T>
struct Cx {
  T re, im;
};
template <class T>
__device__ __forceinline__ Cx<T> add(Cx<T> x, Cx<T> y) {
  return {x.re + y.re, x.im + y.im};
}
template <class T>
__device__ __forceinline__ Cx<T> sub(Cx<T> x, Cx<T> y) {
  return {x.re - y.re, x.im - y.im};
}
template <class T>
__device__ __forceinline__ Cx<T> mul(Cx<T> x, Cx<T> y) {
  return {x.re * y.re - x.im * y.im, x.re * y.im + x.im * y.re};
}
template <class T>
__device__ __forceinline__ Cx<T> div(Cx<T> x, Cx<T> y) {
  const T den = y.re * y.re + y.im * y.im;
  return {(x.re * y.re + x.im * y.im) / den, (x.im * y.re - x.re * y.im) / den};
}
template <class T>
__device__ __forceinline__ Cx<T> conj(Cx<T> x) {
  return {x.re, -x.im};
}

template <class T>
__global__ void forward_kernel(const T* a, const T* b, const T* c, const Cx<T>* z, Cx<T>* g, Cx<T>* r, Cx<T>* s,
                               int64_t B, int64_t N, bool mixed, bool causal) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (row >= B) return;
  const T* ar = a + row * N;
  const T* br = b + row * (N - 1);
  const T* cr = c + row * (N - 1);
  Cx<T>* rr = r + row * N;
  Cx<T>* sr = s + row * N;
  Cx<T>* gr = g + row * N;
  const Cx<T> zz = z[row];
  Cx<T> prev = sub(Cx<T>{ar[0], T(0)}, zz);
  rr[0] = prev;
  for (int64_t i = 1; i < N; ++i) {
    prev = sub(sub(Cx<T>{ar[i], T(0)}, zz), div(Cx<T>{br[i - 1] * cr[i - 1], T(0)}, prev));
    rr[i] = prev;
  }
  prev = sub(Cx<T>{ar[N - 1], T(0)}, zz);
  sr[N - 1] = prev;
  for (int64_t i = N - 2; i >= 0; --i) {
    prev =
        causal ? sub(Cx<T>{ar[i], T(0)}, zz) : sub(sub(Cx<T>{ar[i], T(0)}, zz), div(Cx<T>{br[i] * cr[i], T(0)}, prev));
    sr[i] = prev;
  }
  for (int64_t i = 0; i < N; ++i) {
    if (mixed) {
      const Cx<T> ri = rr[i], si = sr[i];
      const Cx<double> q{double(ri.re) + double(si.re) - (double(ar[i]) - double(zz.re)),
                         double(ri.im) + double(si.im) + double(zz.im)};
      const Cx<double> gi = div(Cx<double>{1.0, 0.0}, q);
      gr[i] = Cx<T>{T(gi.re), T(gi.im)};
    } else {
      gr[i] = div(Cx<T>{T(1), T(0)}, sub(add(rr[i], sr[i]), sub(Cx<T>{ar[i], T(0)}, zz)));
    }
  }
}

// The reverse-mode derivative of forward_kernel (see bk_core_cpu.cpp for the same sweeps).
template <class T>
__global__ void backward_kernel(const Cx<T>* gg, const T* b, const T* c, const Cx<T>* g, const Cx<T>* r, const Cx<T>* s,
                                T* ga, T* gb, T* gc, Cx<T>* gz, Cx<T>* work, int64_t B, int64_t N, bool causal) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (row >= B) return;
  const Cx<T> zero{T(0), T(0)}, one{T(1), T(0)};
  Cx<T>* rbar = work + row * 3 * N;
  Cx<T>* sbar = rbar + N;
  Cx<T>* dbar = sbar + N;
  const Cx<T>* gr = g + row * N;
  const Cx<T>* ggr = gg + row * N;
  const Cx<T>* rr = r + row * N;
  const Cx<T>* sr = s + row * N;
  const T* br = b + row * (N - 1);
  const T* cr = c + row * (N - 1);
  T* pb_out = gb + row * (N - 1);
  T* pc_out = gc + row * (N - 1);
  for (int64_t i = 0; i < N; ++i) {
    const Cx<T> qbar = sub(zero, mul(ggr[i], conj(mul(gr[i], gr[i]))));
    rbar[i] = qbar;
    sbar[i] = qbar;
    dbar[i] = sub(zero, qbar);
  }
  // pbar accumulates in two passes; the s sweep writes it, the r sweep adds to it.
  for (int64_t i = 0; i + 1 < N; ++i) {
    dbar[i] = add(dbar[i], sbar[i]);
    if (causal) {  // s_i = d_i
      pb_out[i] = T(0);
      continue;
    }
    const Cx<T> p{br[i] * cr[i], T(0)};
    const Cx<T> inv = div(one, sr[i + 1]);
    const T pbar_re = -mul(sbar[i], conj(inv)).re;
    pb_out[i] = pbar_re;  // Re(pbar_i) so far
    sbar[i + 1] = add(sbar[i + 1], mul(sbar[i], conj(mul(p, mul(inv, inv)))));
  }
  dbar[N - 1] = add(dbar[N - 1], sbar[N - 1]);
  for (int64_t i = N - 1; i >= 1; --i) {
    const Cx<T> p{br[i - 1] * cr[i - 1], T(0)};
    const Cx<T> inv = div(one, rr[i - 1]);
    dbar[i] = add(dbar[i], rbar[i]);
    pb_out[i - 1] += -mul(rbar[i], conj(inv)).re;
    rbar[i - 1] = add(rbar[i - 1], mul(rbar[i], conj(mul(p, mul(inv, inv)))));
  }
  dbar[0] = add(dbar[0], rbar[0]);
  Cx<T> zsum = zero;
  for (int64_t i = 0; i < N; ++i) {
    ga[row * N + i] = dbar[i].re;
    zsum = sub(zsum, dbar[i]);
  }
  for (int64_t i = 0; i + 1 < N; ++i) {
    const T pbar = pb_out[i];
    pb_out[i] = pbar * cr[i];
    pc_out[i] = pbar * br[i];
  }
  gz[row] = zsum;
}

constexpr int kThreads = 128;

}  // namespace

template <class T>
void launch_bk_core_forward(const T* a, const T* b, const T* c, const T* z, T* g, T* r, T* s, int64_t B, int64_t N,
                            bool mixed, bool causal, cudaStream_t stream) {
  const int blocks = static_cast<int>((B + kThreads - 1) / kThreads);
  forward_kernel<T><<<blocks, kThreads, 0, stream>>>(a, b, c, reinterpret_cast<const Cx<T>*>(z),
                                                     reinterpret_cast<Cx<T>*>(g), reinterpret_cast<Cx<T>*>(r),
                                                     reinterpret_cast<Cx<T>*>(s), B, N, mixed, causal);
  TANDEM_CUDA_LAUNCH_CHECK();
}

template <class T>
void launch_bk_core_backward(const T* grad_g, const T* b, const T* c, const T* g, const T* r, const T* s, T* ga, T* gb,
                             T* gc, T* gz, T* work, int64_t B, int64_t N, bool causal, cudaStream_t stream) {
  const int blocks = static_cast<int>((B + kThreads - 1) / kThreads);
  backward_kernel<T>
      <<<blocks, kThreads, 0, stream>>>(reinterpret_cast<const Cx<T>*>(grad_g), b, c, reinterpret_cast<const Cx<T>*>(g),
                                        reinterpret_cast<const Cx<T>*>(r), reinterpret_cast<const Cx<T>*>(s), ga, gb,
                                        gc, reinterpret_cast<Cx<T>*>(gz), reinterpret_cast<Cx<T>*>(work), B, N, causal);
  TANDEM_CUDA_LAUNCH_CHECK();
}

template void launch_bk_core_forward<float>(const float*, const float*, const float*, const float*, float*, float*,
                                            float*, int64_t, int64_t, bool, bool, cudaStream_t);
template void launch_bk_core_forward<double>(const double*, const double*, const double*, const double*, double*,
                                             double*, double*, int64_t, int64_t, bool, bool, cudaStream_t);
template void launch_bk_core_backward<float>(const float*, const float*, const float*, const float*, const float*,
                                             const float*, float*, float*, float*, float*, float*, int64_t, int64_t,
                                             bool, cudaStream_t);
template void launch_bk_core_backward<double>(const double*, const double*, const double*, const double*, const double*,
                                              const double*, double*, double*, double*, double*, double*, int64_t,
                                              int64_t, bool, cudaStream_t);

}  // namespace tandem::detail
