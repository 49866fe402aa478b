// The skinny epilogues' dispatch and checks (Note [Skinny epilogues]).

#include "tandem/kernels/skinny_epilogues.h"

#include "tandem/core/error.h"
#include "tandem/kernels/decode_fusions.h"
#include "tandem/kernels/skinny_linear.h"

namespace tandem {
namespace detail {

const SkinnyEpiloguesCudaOps*& skinny_epilogues_cuda_ops() {
  static const SkinnyEpiloguesCudaOps* ops = nullptr;
  return ops;
}

}  // namespace detail

namespace {

const detail::SkinnyEpiloguesCudaOps& ops_for(const torch::Tensor& x, const torch::Tensor& w, const char* what) {
  require_skinny_linear_takes(x, w, what);
  const auto* ops = detail::skinny_epilogues_cuda_ops();
  TANDEM_ASSERT(ops != nullptr, what, " in a build whose skinny linear runs but whose epilogues are missing");
  return *ops;
}

}  // namespace


torch::Tensor skinny_silu_mul(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias) {
  const auto& ops = ops_for(x, w, "skinny_silu_mul");
  TANDEM_CHECK(w.size(0) % 2 == 0, "skinny_silu_mul: the gate and up rows stacked, an even count; got ", w.size(0));
  return ops.silu_mul(nullptr, x, w, bias).second;
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> skinny_rope_kv(
    const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias, int64_t heads, int64_t kv_heads,
    const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& k_cache, torch::Tensor& v_cache,
    const torch::Tensor& page, const torch::Tensor& slot) {
  auto [r, q, k, v] = ops_for(x, w, "skinny_rope_kv")
                          .rope_kv(nullptr, x, w, bias, heads, kv_heads, cos, sin, k_cache, v_cache, page, slot);
  return {q, k, v};
}

bool skinny_norm_in_takes(const NormedInput& in, const torch::Tensor& w, torch::ScalarType dtype) {
  const auto& x = in.stream;
  if (detail::skinny_epilogues_cuda_ops() == nullptr || !x.defined() || !x.is_cuda() || x.dim() != 2 ||
      x.scalar_type() != torch::kFloat32 || w.dim() != 2 || w.device() != x.device() || w.scalar_type() != dtype)
    return false;
  const int64_t N = x.size(0), K = x.size(1);
  const auto elem = static_cast<int64_t>(c10::elementSize(dtype));
  const bool added_fits = !in.added.defined() || (in.added.scalar_type() == dtype && in.added.sizes() == x.sizes() &&
                                                  in.added.device() == x.device());
  const bool dtype_fits = dtype == torch::kFloat32 || dtype == torch::kFloat16 || dtype == torch::kBFloat16;
  return dtype_fits && added_fits && N >= 1 && N <= kSkinnyRows && w.size(1) == K && K % 8 == 0 &&
         fused_norm_takes(K) && in.scale.numel() == K && N * K * elem <= kSkinnyNormedBytes && w.is_contiguous() &&
         reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 == 0;
}

namespace {

const detail::SkinnyEpiloguesCudaOps& normed_ops_for(const NormedInput& in, const torch::Tensor& w,
                                                     torch::ScalarType dtype, const char* what) {
  TANDEM_CHECK(skinny_norm_in_takes(in, w, dtype), what, " takes a CUDA fp32 stream (N <= ", kSkinnyRows,
               ", K), K a multiple of 8 within the fused norm's width and N K elements within ", kSkinnyNormedBytes,
               " bytes, the added rows and w (O, K) of one float dtype; got stream ", in.stream.sizes(), ", w ",
               w.sizes(), " ", w.scalar_type());
  return *detail::skinny_epilogues_cuda_ops();
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> skinny_silu_mul(const NormedInput& in, const torch::Tensor& w,
                                                        const torch::Tensor& bias) {
  const auto& ops = normed_ops_for(in, w, w.scalar_type(), "skinny_silu_mul");
  TANDEM_CHECK(w.size(0) % 2 == 0, "skinny_silu_mul: the gate and up rows stacked, an even count; got ", w.size(0));
  return ops.silu_mul(&in, {}, w, bias);
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> skinny_rope_kv(
    const NormedInput& in, const torch::Tensor& w, const torch::Tensor& bias, int64_t heads, int64_t kv_heads,
    const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& k_cache, torch::Tensor& v_cache,
    const torch::Tensor& page, const torch::Tensor& slot) {
  return normed_ops_for(in, w, w.scalar_type(), "skinny_rope_kv")
      .rope_kv(&in, {}, w, bias, heads, kv_heads, cos, sin, k_cache, v_cache, page, slot);
}

}  // namespace tandem
