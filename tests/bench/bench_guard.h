#pragma once
// Puts back what the optimizer benchmark changes for the process (LibTorch's threads and the kernel
// level), for the tests that run it (tests/bench/optim_bench_test.cpp, tests/cli/bench_command_test.cpp).

#include <torch/torch.h>

#include "tandem/optim/cpu_update.h"

namespace tandem::test {

class BenchGuard {
 public:
  BenchGuard() : threads_(at::get_num_threads()), isa_(active_cpu_isa()) {}
  ~BenchGuard() {
    at::set_num_threads(threads_);
    set_cpu_isa(isa_);
  }

 private:
  int threads_;
  CpuIsa isa_;
};

}  // namespace tandem::test
