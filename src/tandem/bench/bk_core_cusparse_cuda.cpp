// The benchmark's cuSPARSE comparison: diag((H - zI)^-1) by solving the tridiagonal systems with
// gtsv2StridedBatch, one system per (batch row, column j) with right-hand side e_j, whose j-th
// entry is G_jj. O(B N^2) memory and work: the way a general tridiagonal solver gets a diagonal.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cusparse.h>

#include "tandem/bench/bk_core_bench.h"
#include "tandem/core/error.h"

namespace tandem::detail {
namespace {

void check(cusparseStatus_t s, const char* what) {
  TANDEM_CHECK(s == CUSPARSE_STATUS_SUCCESS, what, " failed: ", cusparseGetErrorString(s));
}

cusparseHandle_t handle() {
  static cusparseHandle_t h = [] {
    cusparseHandle_t x = nullptr;
    check(cusparseCreate(&x), "cusparseCreate");
    return x;
  }();
  return h;
}

torch::Tensor cusparse_diagonal(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c,
                                const torch::Tensor& z) {
  torch::NoGradGuard no_grad;
  const c10::cuda::CUDAGuard guard(a.device());
  const int64_t B = a.size(0), N = a.size(1);
  const auto ct = a.options().dtype(torch::kComplexDouble);
  const auto zb = z.to(a.device(), torch::kComplexDouble).expand({B}).reshape({B, 1});
  // System (r, j): dl, d, du of row r; x = e_j on entry, G e_j on exit.
  const auto d = (a.to(torch::kComplexDouble) - zb).unsqueeze(1).expand({B, N, N}).contiguous();
  auto dl1 = torch::zeros({B, N}, ct), du1 = torch::zeros({B, N}, ct);
  if (N > 1) {
    dl1.narrow(1, 1, N - 1).copy_(c);
    du1.narrow(1, 0, N - 1).copy_(b);
  }
  const auto dl = dl1.unsqueeze(1).expand({B, N, N}).contiguous();
  const auto du = du1.unsqueeze(1).expand({B, N, N}).contiguous();
  auto x = torch::eye(N, ct).unsqueeze(0).expand({B, N, N}).contiguous();
  const auto h = handle();
  check(cusparseSetStream(h, c10::cuda::getCurrentCUDAStream()), "cusparseSetStream");
  const auto cx = [](const torch::Tensor& t) { return reinterpret_cast<cuDoubleComplex*>(t.data_ptr()); };
  TANDEM_CHECK(B * N * N < (int64_t(1) << 28), "cuSPARSE comparison: B*N*N = ", B * N * N,
               " systems x entries overflows its 32-bit indexing; use smaller B or N");
  const int m = static_cast<int>(N), batch = static_cast<int>(B * N);
  size_t bytes = 0;
  check(cusparseZgtsv2StridedBatch_bufferSizeExt(h, m, cx(dl), cx(d), cx(du), cx(x), batch, m, &bytes),
        "cusparseZgtsv2StridedBatch_bufferSizeExt");
  auto work = torch::empty({static_cast<int64_t>(bytes) + 1}, a.options().dtype(torch::kUInt8));
  check(cusparseZgtsv2StridedBatch(h, m, cx(dl), cx(d), cx(du), cx(x), batch, m, work.data_ptr()),
        "cusparseZgtsv2StridedBatch");
  return x.diagonal(0, 1, 2);
}

struct Register {
  Register() { bk_core_cusparse() = &cusparse_diagonal; }
} register_cusparse;

}  // namespace
}  // namespace tandem::detail
