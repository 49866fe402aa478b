// The decode fusions' dispatch (Note [Decode fusions]): CUDA tensors to the registered kernels.

#include "tandem/kernels/decode_fusions.h"

#include "tandem/core/error.h"

namespace tandem {
namespace detail {

const DecodeFusionsCudaOps*& decode_fusions_cuda_ops() {
  static const DecodeFusionsCudaOps* ops = nullptr;
  return ops;
}

}  // namespace detail

namespace {

const detail::DecodeFusionsCudaOps& ops_for(const c10::Device& device, torch::ScalarType dtype) {
  TANDEM_CHECK(decode_fusions_available(device, dtype), "the fused decode kernels take CUDA tensors of ",
               "fp32, fp16 or bf16 in a build with CUDA kernels; got ", device, " ", dtype);
  return *detail::decode_fusions_cuda_ops();
}

}  // namespace

bool decode_fusions_available(const c10::Device& device, torch::ScalarType dtype) {
  return device.is_cuda() && detail::decode_fusions_cuda_ops() != nullptr &&
         (dtype == torch::kFloat32 || dtype == torch::kFloat16 || dtype == torch::kBFloat16);
}

bool fused_norm_takes(int64_t C) { return C > 0 && C % 4 == 0 && C <= 8192; }

torch::Tensor rms_norm_cast(const torch::Tensor& x, const torch::Tensor& w, double eps, bool plus_one,
                            torch::ScalarType dtype) {
  return ops_for(x.device(), dtype).add_rms_norm_cast(x, torch::Tensor(), w, eps, plus_one, dtype).second;
}

std::pair<torch::Tensor, torch::Tensor> add_rms_norm_cast(const torch::Tensor& x, const torch::Tensor& a,
                                                          const torch::Tensor& w, double eps, bool plus_one,
                                                          torch::ScalarType dtype) {
  return ops_for(x.device(), dtype).add_rms_norm_cast(x, a, w, eps, plus_one, dtype);
}

std::pair<torch::Tensor, torch::Tensor> rope_write_kv(const torch::Tensor& qkv, int64_t heads, int64_t kv_heads,
                                                      const torch::Tensor& cos, const torch::Tensor& sin,
                                                      torch::Tensor& k_cache, torch::Tensor& v_cache,
                                                      const torch::Tensor& page, const torch::Tensor& slot) {
  return ops_for(qkv.device(), qkv.scalar_type())
      .rope_write_kv(qkv, heads, kv_heads, cos, sin, k_cache, v_cache, page, slot);
}

torch::Tensor silu_mul(const torch::Tensor& gu) { return ops_for(gu.device(), gu.scalar_type()).silu_mul(gu); }

}  // namespace tandem
