#pragma once
// `tandem bench optim | step | bk_core | nvme | skinny_linear`: the CPU optimizer kernels against
// LibTorch's, a training step's forward+backward alone (the GPU-only bound), the BK-core kernels
// against their baselines, the NVMe tier's disk bandwidth, the decode step's products against cuBLAS.

#include <string>
#include <vector>

#include "tandem/bench/bk_core_bench.h"
#include "tandem/bench/nvme_bench.h"
#include "tandem/bench/optim_bench.h"
#include "tandem/bench/skinny_linear_bench.h"
#include "tandem/cli/command.h"
#include "tandem/cli/config_args.h"

namespace CLI {
class App;
}

namespace tandem {

class BenchCommand : public Command {
 public:
  explicit BenchCommand(CLI::App& app);
  bool chosen() const override;
  int run() override;

 private:
  void add_optim(CLI::App& bench);
  void add_step(CLI::App& bench);
  void add_bk_core(CLI::App& bench);
  void add_nvme(CLI::App& bench);
  void add_skinny_linear(CLI::App& bench);

  CLI::App *command_ = nullptr, *optim_ = nullptr, *step_ = nullptr, *bk_core_ = nullptr, *nvme_ = nullptr,
           *skinny_ = nullptr;
  OptimBenchOptions optim_options_;
  std::vector<std::string> optim_sizes_;
  ConfigArgs step_args_;
  std::string step_json_, step_model_json_;
  BkCoreBenchOptions bk_options_;
  NvmeBenchOptions nvme_options_;
  SkinnyLinearBenchOptions skinny_options_;
};

}  // namespace tandem
