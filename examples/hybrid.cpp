// Seed 000 in tandem's C++ API: a hybrid model of dense blocks feeding MoE blocks, placed per step
// on the CPU or the GPU by a policy, trained. Usage: tandem_example_hybrid [steps] [run dir]
// (small shapes so that it also runs on a CPU in seconds).

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tandem/api/hybrid.h"
#include "tandem/core/error.h"

int main(int argc, char** argv) try {
  tandem::HybridModel model;
  model.width = 128, model.hidden = 256, model.experts = 8, model.vocab = 256, model.seq_len = 128;
  tandem::Config cfg = tandem::hybrid_config(model);
  tandem::use_threshold(cfg, /*gpu_power_w=*/200, /*cpu_util_pct=*/80);
  cfg.train.steps = argc > 1 ? std::atoll(argv[1]) : 50;
  if (argc > 2) cfg.train.run_dir = argv[2];
  const tandem::TrainSummary s = tandem::train(cfg, {});
  std::printf("%lld steps, loss %.4f -> %.4f, run dir %s\n", static_cast<long long>(s.final_step - s.first_step),
              s.losses.empty() ? 0.0 : s.losses.front(), s.losses.empty() ? 0.0 : s.losses.back(), s.run_dir.c_str());
  return 0;
} catch (const tandem::UserError& e) {
  std::fprintf(stderr, "tandem: %s\n", e.what());
  return 2;
}
