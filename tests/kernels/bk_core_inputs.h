#pragma once
// Well-conditioned BK-core inputs for the kernels' tests (tests/kernels/bk_core_cpu_test.cpp,
// bk_core_ops_test.cpp).

#include <torch/torch.h>

#include <cstdint>

namespace tandem::test {

struct BkCoreInputs {
  torch::Tensor a, b, c, z;
};

/// (B, N) inputs of dtype `t` from `seed`: b_i c_i > 0 (a real spectrum) and Im z >= 0.5, so the
/// spectrum is at distance >= 0.5 from z and |G_ii| <= 2. z per row or one scalar.
inline BkCoreInputs random_bk_core_inputs(int64_t B, int64_t N, torch::ScalarType t, uint64_t seed, bool z_per_row) {
  torch::manual_seed(seed);
  BkCoreInputs in;
  in.a = (torch::rand({B, N}, torch::kFloat64) * 2 - 1).to(t);
  in.b = (0.2 + torch::rand({B, N - 1}, torch::kFloat64) * 0.8).to(t);
  in.c = (0.2 + torch::rand({B, N - 1}, torch::kFloat64) * 0.8).to(t);
  in.z = z_per_row ? torch::complex(torch::rand({B}, torch::kFloat64) - 0.5, 0.5 + torch::rand({B}, torch::kFloat64))
                   : torch::complex(torch::tensor(0.1, torch::kFloat64), torch::tensor(0.5, torch::kFloat64));
  return in;
}

}  // namespace tandem::test
