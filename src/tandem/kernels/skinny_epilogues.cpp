// The skinny epilogues' dispatch and checks (Note [Skinny epilogues]).

#include "tandem/kernels/skinny_epilogues.h"

#include "tandem/core/error.h"
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
  return ops.silu_mul(x, w, bias);
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> skinny_rope_kv(
    const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias, int64_t heads, int64_t kv_heads,
    const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& k_cache, torch::Tensor& v_cache,
    const torch::Tensor& page, const torch::Tensor& slot) {
  return ops_for(x, w, "skinny_rope_kv").rope_kv(x, w, bias, heads, kv_heads, cos, sin, k_cache, v_cache, page, slot);
}

}  // namespace tandem
