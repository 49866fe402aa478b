#include "tandem/cli/bench_command.h"

#include <CLI/CLI.hpp>

#include "tandem/bench/step_bench.h"

namespace tandem {

BenchCommand::BenchCommand(CLI::App& app) {
  command_ = app.add_subcommand("bench", "benchmarks");
  command_->require_subcommand(1);
  add_optim(*command_);
  add_step(*command_);
  add_bk_core(*command_);
  add_nvme(*command_);
  add_skinny_linear(*command_);
}

void BenchCommand::add_skinny_linear(CLI::App& bench) {
  auto* c = skinny_ = bench.add_subcommand(
      "skinny_linear",
      "the decode step's matrix-vector products: the skinny linear against cuBLAS, weights read from memory, from a "
      "CUDA graph");
  auto& o = skinny_options_;
  c->add_option("--shapes", o.shapes,
                "weight shapes OxK (default: a 1B Llama layer's and a Llama-2-7B layer's q/k/v, o, gate/up, down)")
      ->delimiter(',');
  c->add_option("--rows", o.rows, "rows of x, the decode batch (1 to 4, default 1)");
  c->add_option("--repeats", o.repeats, "timed replays per shape (median reported)")->check(CLI::PositiveNumber);
  c->add_option("--json", o.json_path, "append one JSON object per shape to this file");
}

void BenchCommand::add_nvme(CLI::App& bench) {
  auto* c = nvme_ = bench.add_subcommand(
      "nvme", "the NVMe tier's bound: its files' write, read, and read+write bandwidth on a disk (offload.nvme_path)");
  auto& o = nvme_options_;
  c->add_option("--dir", o.dir, "directory on the disk to measure")->required();
  c->add_option("--gib", o.gib, "GiB written and read per measurement (default 4)")->check(CLI::PositiveNumber);
  c->add_option("--block-mib", o.block_mib, "MiB per transfer, a Block's states (default 256)")
      ->check(CLI::PositiveNumber);
  c->add_option("--json", o.json_path, "append one JSON object per measurement to this file");
}

void BenchCommand::add_optim(CLI::App& bench) {
  auto* c = optim_ = bench.add_subcommand(
      "optim", "CPU optimizer kernels vs LibTorch's CPU AdamW (fused, foreach) and copy bandwidth");
  auto& o = optim_options_;
  c->add_option("--params", optim_sizes_,
                "parameter counts in binary multiples, e.g. --params 256M 1B: 256 x 2^20 and 2^30, printed in decimal "
                "(268.4 M, 1.07 B) (default 256M 1B)")
      ->delimiter(',');
  c->add_option("--repeats", o.repeats, "timed steps per variant (median reported)");
  c->add_option("--warmup", o.warmup, "untimed steps first");
  c->add_option("--threads", o.threads, "threads (default: TANDEM_CPU_THREADS, OMP_NUM_THREADS or all cores)")
      ->check(CLI::NonNegativeNumber);
  c->add_flag("--pin", o.pin, "pin kernel threads to cores");
  c->add_option("--isa", o.isas, "also time the fp32 variant at these levels: scalar avx2 avx512")->delimiter(',');
  c->add_option("--json", o.json_path, "append one JSON object per measurement to this file");
}

void BenchCommand::add_step(CLI::App& bench) {
  auto* c = step_ = bench.add_subcommand(
      "step",
      "forward+backward alone, weights and gradients resident on the device, no optimizer: the GPU-only bound of a "
      "training step (same model and batch keys as train)");
  step_args_.add_to(c, true);
  c->add_option("--json", step_json_, "append one JSON object with the result to this file");
  c->add_option("--model-json", step_model_json_, "write the model's HF config.json here (for peers)");
}

void BenchCommand::add_bk_core(CLI::App& bench) {
  auto* c = bk_core_ = bench.add_subcommand(
      "bk_core", "BK-core kernels vs the same sweeps in LibTorch ops, cuSPARSE gtsv2 and the bandwidth floor");
  auto& o = bk_options_;
  c->add_option("--batch", o.batches, "batch sizes (default 1,32,256)")->delimiter(',')->check(CLI::PositiveNumber);
  c->add_option("--n", o.lengths, "sequence lengths (default 1024,4096,65536,1000000)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  c->add_option("--device", o.device, "auto | cpu | cuda");
  c->add_option("--repeats", o.repeats, "timed calls per measurement (median reported)");
  c->add_option("--ops-max", o.ops_max_elements, "run the LibTorch-ops baseline where B*N <= this");
  c->add_option("--cusparse-max", o.cusparse_max_elements,
                "run the cuSPARSE comparison where B*N*N <= this (it needs B*N*N complex values, 4 times)");
  c->add_option("--json", o.json_path, "append one JSON object per measurement to this file");
}

bool BenchCommand::chosen() const { return command_->parsed(); }

int BenchCommand::run() {
  if (*bk_core_) return run_bk_core_bench(bk_options_);
  if (*nvme_) return run_nvme_bench(nvme_options_);
  if (*skinny_) return run_skinny_linear_bench(skinny_options_);
  if (*step_) return run_step_bench(step_args_.resolve(""), step_json_, step_model_json_);
  if (!optim_sizes_.empty()) {
    optim_options_.sizes.clear();
    for (const auto& s : optim_sizes_) optim_options_.sizes.push_back(parse_param_count(s));
  }
  return run_optim_bench(optim_options_);
}

}  // namespace tandem
