// BK-core on the CPU: Note [BK-core ratio form] as batch-parallel sweeps (one batch row per task),
// complex64 for float inputs and complex128 for double inputs; and the autograd Function.

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/kernels/bk_core.h"

namespace tandem {
namespace {

// Plain complex arithmetic: std::complex's operators guard against intermediate overflow (and
// call into libgcc), which the ratio form does not need: its values stay of the order of H's entries.
template <class T>
struct Cx {
  T re, im;
};
template <class T>
inline Cx<T> operator+(Cx<T> x, Cx<T> y) {
  return {x.re + y.re, x.im + y.im};
}
template <class T>
inline Cx<T> operator-(Cx<T> x, Cx<T> y) {
  return {x.re - y.re, x.im - y.im};
}
template <class T>
inline Cx<T> operator*(Cx<T> x, Cx<T> y) {
  return {x.re * y.re - x.im * y.im, x.re * y.im + x.im * y.re};
}
template <class T>
inline Cx<T> operator/(Cx<T> x, Cx<T> y) {
  const T den = y.re * y.re + y.im * y.im;
  return {(x.re * y.re + x.im * y.im) / den, (x.im * y.re - x.re * y.im) / den};
}
template <class T>
inline Cx<T> conj(Cx<T> x) {
  return {x.re, -x.im};
}

}  // namespace

torch::ScalarType detail::bk_core_complex_type(torch::ScalarType real) {
  return real == torch::kFloat64 ? torch::kComplexDouble : torch::kComplexFloat;
}

void detail::bk_core_validate(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c,
                              const torch::Tensor& z, BkCoreMode mode) {
  TANDEM_CHECK(a.dim() == 2 && a.size(1) >= 1, "bk_core: a must be (B, N) with N >= 1, got ", a.sizes());
  const int64_t B = a.size(0), N = a.size(1);
  TANDEM_CHECK(b.dim() == 2 && b.size(0) == B && b.size(1) == N - 1 && c.sizes() == b.sizes(),
               "bk_core: b and c must be (B, N-1) = (", B, ", ", N - 1, "), got ", b.sizes(), " and ", c.sizes());
  TANDEM_CHECK(a.scalar_type() == torch::kFloat32 || a.scalar_type() == torch::kFloat64,
               "bk_core: a, b, c must be float32 or float64, got ", a.scalar_type());
  TANDEM_CHECK(b.scalar_type() == a.scalar_type() && c.scalar_type() == a.scalar_type(),
               "bk_core: a, b and c must share one dtype");
  TANDEM_CHECK(z.is_complex() && (z.dim() == 0 || (z.dim() == 1 && z.size(0) == B)),
               "bk_core: z must be a complex scalar tensor or (B) = (", B, "), got ", z.sizes(), " ", z.scalar_type());
  TANDEM_CHECK(b.device() == a.device() && c.device() == a.device(), "bk_core: a, b and c must be on one device");
  TANDEM_CHECK(mode == BkCoreMode::kNative || a.scalar_type() == torch::kFloat32,
               "bk_core: the mixed mode takes float32 inputs, got ", a.scalar_type());
}

namespace {

template <class T>
inline T mag(Cx<T> x) {
  return std::max(std::abs(x.re), std::abs(x.im));
}

// Note [Chunked ratio sweep]
// u_0 = d(0), u_j = d(j) - q(j) / u_{j-1} is the ratio x_j / y_j of (x_j, y_j) = S_j (x_{j-1}, y_{j-1})
// with S_j = [[d(j), -q(j)], [1, 0]]: a product of 2x2 transfer matrices, so a long row is cut into
// chunks whose products are formed in parallel (rescaled as they grow: only ratios matter), then
// the states at chunk boundaries follow in one short sequential pass, then every chunk re-runs
// the plain recurrence from its boundary value in parallel. About three times the arithmetic of
// the plain sweep, spread over all cores: it serves rows too few to keep the cores busy.
template <class T, class D, class Q, class Out>
void ratio_sweep(int64_t N, const D& d, const Q& q, const Out& out, int64_t chunks) {
  using C = Cx<T>;
  if (chunks <= 1 || N < 2 * chunks) {
    C u = d(0);
    out(0, u);
    for (int64_t j = 1; j < N; ++j) {
      u = d(j) - q(j) / u;
      out(j, u);
    }
    return;
  }
  // Chunk k covers [lo(k), lo(k+1)) of j = 1 .. N-1.
  const auto lo = [&](int64_t k) { return 1 + (N - 1) * k / chunks; };
  struct Mat {
    C m00, m01, m10, m11;
  };
  std::vector<Mat> prod(chunks);
  at::parallel_for(0, chunks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      Mat M{C{T(1), T(0)}, C{T(0), T(0)}, C{T(0), T(0)}, C{T(1), T(0)}};
      for (int64_t j = lo(k); j < lo(k + 1); ++j) {
        const C dj = d(j), qj = q(j);
        const Mat Nm{dj * M.m00 - qj * M.m10, dj * M.m01 - qj * M.m11, M.m00, M.m01};
        const T s = std::max(std::max(mag(Nm.m00), mag(Nm.m01)), std::max(mag(Nm.m10), mag(Nm.m11)));
        const C inv{T(1) / s, T(0)};
        M = {Nm.m00 * inv, Nm.m01 * inv, Nm.m10 * inv, Nm.m11 * inv};
      }
      prod[k] = M;
    }
  });
  std::vector<C> start(chunks);  // u at lo(k) - 1
  C x = d(0), y{T(1), T(0)};
  out(0, x);
  for (int64_t k = 0; k < chunks; ++k) {
    start[k] = x / y;
    const Mat& M = prod[k];
    const C nx = M.m00 * x + M.m01 * y, ny = M.m10 * x + M.m11 * y;
    const T s = std::max(mag(nx), mag(ny));
    const C inv{T(1) / s, T(0)};
    x = nx * inv, y = ny * inv;
  }
  at::parallel_for(0, chunks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      C u = start[k];
      for (int64_t j = lo(k); j < lo(k + 1); ++j) {
        u = d(j) - q(j) / u;
        out(j, u);
      }
    }
  });
}

template <class T>
void forward_rows(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c, const torch::Tensor& zb,
                  torch::Tensor& g, torch::Tensor& r, torch::Tensor& s, bool mixed, bool causal) {
  using C = Cx<T>;
  const int64_t B = a.size(0), N = a.size(1);
  const T* pa = a.data_ptr<T>();
  const T* pb = b.data_ptr<T>();
  const T* pc = c.data_ptr<T>();
  const C* pz = reinterpret_cast<const C*>(zb.data_ptr());
  C* pg = reinterpret_cast<C*>(g.data_ptr());
  C* pr = reinterpret_cast<C*>(r.data_ptr());
  C* ps = reinterpret_cast<C*>(s.data_ptr());
  // Rows in parallel when there are enough of them; otherwise each row's sweeps in chunks
  // (Note [Chunked ratio sweep]).
  const int64_t threads = at::get_num_threads();
  const int64_t chunks = B >= threads || N < (int64_t(1) << 14) ? 1 : threads * 4;
  const auto row_fn = [&](int64_t row) {
    const T* ar = pa + row * N;
    const T* br = pb + row * (N - 1);
    const T* cr = pc + row * (N - 1);
    C* rr = pr + row * N;
    C* sr = ps + row * N;
    C* gr = pg + row * N;
    const C z = pz[row];
    const auto d = [&](int64_t i) { return C{ar[i], T(0)} - z; };
    ratio_sweep<T>(
        N, d,
        [&](int64_t j) {
          return C{br[j - 1] * cr[j - 1], T(0)};
        },
        [&](int64_t j, C u) { rr[j] = u; }, chunks);
    if (causal) {  // s_i = d_i: G_ii = 1 / r_i
      for (int64_t i = 0; i < N; ++i) sr[i] = d(i);
    } else {  // the same sweep from the far end: j = N-1-i
      ratio_sweep<T>(
          N, [&](int64_t j) { return d(N - 1 - j); },
          [&](int64_t j) {
            return C{br[N - 1 - j] * cr[N - 1 - j], T(0)};
          },
          [&](int64_t j, C u) { sr[N - 1 - j] = u; }, chunks);
    }
    if (mixed) {
      for (int64_t i = 0; i < N; ++i) {
        const Cx<double> q{double(rr[i].re) + double(sr[i].re) - (double(ar[i]) - double(z.re)),
                           double(rr[i].im) + double(sr[i].im) + double(z.im)};
        const Cx<double> gi = Cx<double>{1.0, 0.0} / q;
        gr[i] = C{T(gi.re), T(gi.im)};
      }
    } else {
      for (int64_t i = 0; i < N; ++i) gr[i] = C{T(1), T(0)} / (rr[i] + sr[i] - (C{ar[i], T(0)} - z));
    }
  };
  if (chunks == 1)
    at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) row_fn(row);
    });
  else
    for (int64_t row = 0; row < B; ++row) row_fn(row);
}

// Reverse-mode derivative of forward_rows, with PyTorch's convention for complex gradients
// (for holomorphic w = f(u): grad_u += grad_w * conj(f'(u)); a real input takes the real part).
template <class T>
void backward_rows(const torch::Tensor& gg, const torch::Tensor& b, const torch::Tensor& c, const torch::Tensor& g,
                   const torch::Tensor& r, const torch::Tensor& s, torch::Tensor& ga, torch::Tensor& gb,
                   torch::Tensor& gc, torch::Tensor& gz, bool causal) {
  using C = Cx<T>;
  const int64_t B = g.size(0), N = g.size(1);
  const C* pgg = reinterpret_cast<const C*>(gg.data_ptr());
  const C* pg = reinterpret_cast<const C*>(g.data_ptr());
  const C* pr = reinterpret_cast<const C*>(r.data_ptr());
  const C* ps = reinterpret_cast<const C*>(s.data_ptr());
  const T* pb = b.data_ptr<T>();
  const T* pc = c.data_ptr<T>();
  T* pga = ga.data_ptr<T>();
  T* pgb = gb.data_ptr<T>();
  T* pgc = gc.data_ptr<T>();
  C* pgz = reinterpret_cast<C*>(gz.data_ptr());
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    std::vector<C> rbar(N), sbar(N), dbar(N), pbar(N > 1 ? N - 1 : 1);
    for (int64_t row = begin; row < end; ++row) {
      const C* gr = pg + row * N;
      const C* ggr = pgg + row * N;
      const C* rr = pr + row * N;
      const C* sr = ps + row * N;
      const T* br = pb + row * (N - 1);
      const T* cr = pc + row * (N - 1);
      // G_i = 1 / q_i, q_i = r_i + s_i - d_i
      for (int64_t i = 0; i < N; ++i) {
        const C qbar = C{T(0), T(0)} - ggr[i] * conj(gr[i] * gr[i]);
        rbar[i] = qbar;
        sbar[i] = qbar;
        dbar[i] = C{T(0), T(0)} - qbar;
      }
      for (int64_t i = 0; i + 1 < N; ++i) pbar[i] = C{T(0), T(0)};
      // s_i = d_i - p_i / s_{i+1}, computed downwards: its adjoint runs upwards.
      for (int64_t i = 0; i + 1 < N; ++i) {
        dbar[i] = dbar[i] + sbar[i];
        if (causal) continue;  // s_i = d_i
        const C p{br[i] * cr[i], T(0)};
        const C inv = C{T(1), T(0)} / sr[i + 1];
        pbar[i] = pbar[i] - sbar[i] * conj(inv);
        sbar[i + 1] = sbar[i + 1] + sbar[i] * conj(p * inv * inv);
      }
      dbar[N - 1] = dbar[N - 1] + sbar[N - 1];
      // r_i = d_i - p_{i-1} / r_{i-1}, computed upwards: its adjoint runs downwards.
      for (int64_t i = N - 1; i >= 1; --i) {
        const C p{br[i - 1] * cr[i - 1], T(0)};
        const C inv = C{T(1), T(0)} / rr[i - 1];
        dbar[i] = dbar[i] + rbar[i];
        pbar[i - 1] = pbar[i - 1] - rbar[i] * conj(inv);
        rbar[i - 1] = rbar[i - 1] + rbar[i] * conj(p * inv * inv);
      }
      dbar[0] = dbar[0] + rbar[0];
      C zsum{T(0), T(0)};
      for (int64_t i = 0; i < N; ++i) {
        pga[row * N + i] = dbar[i].re;  // d_i = a_i - z
        zsum = zsum - dbar[i];
      }
      for (int64_t i = 0; i + 1 < N; ++i) {  // p_i = b_i c_i
        pgb[row * (N - 1) + i] = pbar[i].re * cr[i];
        pgc[row * (N - 1) + i] = pbar[i].re * br[i];
      }
      pgz[row] = zsum;
    }
  });
}

class BkCoreFunction : public torch::autograd::Function<BkCoreFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& a, const torch::Tensor& b,
                               const torch::Tensor& c, const torch::Tensor& z, int64_t mode, bool causal) {
    torch::Tensor g, r, s;
    if (a.is_cuda()) {
      const auto* ops = detail::bk_core_cuda_ops();
      TANDEM_CHECK(ops != nullptr, "bk_core on ", a.device(),
                   " tensors needs the CUDA kernels, and this build has none; run it on CPU tensors");
      const bool keep_ratios = a.requires_grad() || b.requires_grad() || c.requires_grad() || z.requires_grad();
      std::tie(g, r, s) = ops->forward(a, b, c, z, static_cast<BkCoreMode>(mode), causal, keep_ratios);
    } else {
      std::tie(g, r, s) = detail::bk_core_forward_cpu(a, b, c, z, static_cast<BkCoreMode>(mode), causal);
    }
    ctx->save_for_backward({b, c, z, g, r, s});
    ctx->saved_data["z_scalar"] = z.dim() == 0;
    ctx->saved_data["causal"] = causal;
    return g;
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool causal = ctx->saved_data["causal"].toBool();
    torch::Tensor ga, gb, gc, gz;
    if (saved[3].is_cuda())
      std::tie(ga, gb, gc, gz) =
          detail::bk_core_cuda_ops()->backward(grads[0], saved[0], saved[1], saved[3], saved[4], saved[5], causal);
    else
      std::tie(ga, gb, gc, gz) =
          detail::bk_core_backward_cpu(grads[0], saved[0], saved[1], saved[3], saved[4], saved[5], causal);
    if (ctx->saved_data["z_scalar"].toBool()) gz = gz.sum();
    return {ga, gb, gc, gz.to(saved[2].scalar_type()), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

namespace detail {

const BkCoreCudaOps*& bk_core_cuda_ops() {
  static const BkCoreCudaOps* ops = nullptr;
  return ops;
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> bk_core_forward_cpu(const torch::Tensor& a_in,
                                                                            const torch::Tensor& b_in,
                                                                            const torch::Tensor& c_in,
                                                                            const torch::Tensor& z_in, BkCoreMode mode,
                                                                            bool causal) {
  bk_core_validate(a_in, b_in, c_in, z_in, mode);
  torch::NoGradGuard no_grad;
  const auto a = a_in.contiguous(), b = b_in.contiguous(), c = c_in.contiguous();
  const int64_t B = a.size(0), N = a.size(1);
  const auto ct = bk_core_complex_type(a.scalar_type());
  const auto zb = z_in.detach().resolve_conj().resolve_neg().to(ct).expand({B}).contiguous();
  auto g = torch::empty({B, N}, ct), r = torch::empty({B, N}, ct), s = torch::empty({B, N}, ct);
  if (a.scalar_type() == torch::kFloat64)
    forward_rows<double>(a, b, c, zb, g, r, s, false, causal);
  else
    forward_rows<float>(a, b, c, zb, g, r, s, mode == BkCoreMode::kMixed, causal);
  return {g, r, s};
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> bk_core_backward_cpu(
    const torch::Tensor& grad_g, const torch::Tensor& b_in, const torch::Tensor& c_in, const torch::Tensor& g,
    const torch::Tensor& r, const torch::Tensor& s, bool causal) {
  torch::NoGradGuard no_grad;
  const auto b = b_in.contiguous(), c = c_in.contiguous();
  const auto gg = grad_g.to(g.scalar_type()).contiguous();
  const int64_t B = g.size(0), N = g.size(1);
  const auto rt = b.scalar_type();
  auto ga = torch::empty({B, N}, rt), gb = torch::empty({B, N - 1}, rt), gc = torch::empty({B, N - 1}, rt);
  auto gz = torch::empty({B}, g.scalar_type());
  if (rt == torch::kFloat64)
    backward_rows<double>(gg, b, c, g, r, s, ga, gb, gc, gz, causal);
  else
    backward_rows<float>(gg, b, c, g, r, s, ga, gb, gc, gz, causal);
  return {ga, gb, gc, gz};
}

}  // namespace detail

torch::Tensor bk_core(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c, const torch::Tensor& z,
                      BkCoreMode mode, BkCoreDiagonal diagonal) {
  return BkCoreFunction::apply(a, b, c, z, static_cast<int64_t>(mode), diagonal == BkCoreDiagonal::kCausal);
}

}  // namespace tandem
