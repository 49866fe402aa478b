// `tandem bench` in-process (cli/bench_command.h): one of its four benchmarks must be named, and
// each one's options reach it: optim's parameter counts and levels, step's configuration flags,
// bk_core's grid and thresholds, nvme's directory and sizes; bad values are refused by the parser
// or as a UserError.

#include "tandem/cli/bench_command.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../bench/bench_guard.h"
#include "../error_of.h"
#include "../test_util.h"
#include "tandem/optim/cpu_update.h"

namespace tandem {
namespace {

using nlohmann::json;
using test::error_of;

using test::BenchGuard;

struct Ran {
  int code = -1;
  std::string out, error;
};

// `tandem <argv>` through BenchCommand: what it printed and returned, or the UserError it threw.
Ran bench(const std::vector<std::string>& argv) {
  CLI::App app{"bench test"};
  BenchCommand command(app);
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());  // CLI11 takes them last first
  app.parse(reversed);
  EXPECT_TRUE(command.chosen());
  Ran r;
  testing::internal::CaptureStdout();
  r.error = error_of([&] { r.code = command.run(); });
  r.out = testing::internal::GetCapturedStdout();
  return r;
}

void expect_parse_error(const std::vector<std::string>& argv) {
  CLI::App app{"bench test"};
  BenchCommand command(app);
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());
  EXPECT_THROW(app.parse(reversed), CLI::ParseError) << argv.back();
}

std::vector<json> json_lines(const std::string& path) {
  std::vector<json> out;
  std::istringstream in(test::read_text(path));
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

TEST(BenchCommand, IsChosenOnlyWhenNamedAndThenNeedsOneBenchmark) {
  CLI::App app{"bench test"};
  app.add_subcommand("other", "another command");
  BenchCommand command(app);
  std::vector<std::string> other = {"other"};
  app.parse(other);
  EXPECT_FALSE(command.chosen());
  expect_parse_error({"bench"});
  expect_parse_error({"bench", "kernels"});
}

TEST(BenchCommand, OptimRunsTheParameterCountsGivenInPlaceOfTheDefaults) {
  BenchGuard guard;
  test::TempDir dir;
  const Ran r = bench({"bench", "optim", "--params", "1K,17", "--repeats", "2", "--warmup", "0", "--threads", "1",
                       "--json", dir.file("o.jsonl")});
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.code, 0);
  const auto lines = json_lines(dir.file("o.jsonl"));
  ASSERT_EQ(lines.size(), 38u) << "19 measurements for each of two sizes";
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["params"], i < 19 ? 1024 : 17) << i;
    EXPECT_EQ(lines[i]["threads"], 1) << i;
    EXPECT_EQ(lines[i]["times_s"].size(), 2u) << "--repeats " << i;
  }
  EXPECT_NE(r.out.find("tandem bench optim: 1 threads, kernels "), std::string::npos) << r.out;

  // Space-separated counts and an extra level, comma-separated with the best one.
  if (best_cpu_isa() == CpuIsa::kScalar) return;
  const Ran levels =
      bench({"bench", "optim", "--params", "5", "9", "--repeats", "1", "--warmup", "0", "--threads", "1", "--isa",
             std::string("scalar,") + to_string(best_cpu_isa()), "--json", dir.file("levels.jsonl")});
  ASSERT_EQ(levels.error, "");
  const auto more = json_lines(dir.file("levels.jsonl"));
  ASSERT_EQ(more.size(), 40u) << "one scalar measurement per size";
  EXPECT_EQ(more[2]["variant"], "AdamW fp32 grads, fp32 states [scalar]");
  EXPECT_EQ(more[2]["params"], 5);
  EXPECT_EQ(more[22]["variant"], "AdamW fp32 grads, fp32 states [scalar]");
  EXPECT_EQ(more[22]["params"], 9);
}

TEST(BenchCommand, OptimRefusesBadCountsThreadsAndLevels) {
  BenchGuard guard;
  const Ran count = bench({"bench", "optim", "--params", "12X", "--repeats", "1", "--threads", "1"});
  EXPECT_NE(count.error.find("cannot read parameter count '12X'"), std::string::npos) << count.error;
  EXPECT_EQ(count.out, "") << "refused before anything ran";
  const Ran level = bench({"bench", "optim", "--params", "8", "--isa", "avx9", "--threads", "1"});
  EXPECT_NE(level.error.find("unknown CPU kernel level 'avx9'"), std::string::npos) << level.error;
  const Ran repeats = bench({"bench", "optim", "--params", "8", "--repeats", "0", "--threads", "1"});
  EXPECT_NE(repeats.error.find("--repeats must be >= 1"), std::string::npos) << repeats.error;
  expect_parse_error({"bench", "optim", "--threads", "-1"});
  expect_parse_error({"bench", "optim", "--repeats", "x"});
}

TEST(BenchCommand, StepTakesTheConfigurationFlagsOfTrain) {
  test::TempDir dir;
  const Ran r = bench({"bench", "step", "-p", "tiny", "--device", "cpu", "--steps", "3", "--set", "train.micro_batch=2",
                       "--set", "train.seq_len=16", "--set", "model.n_layer=2", "--json", dir.file("s.jsonl"),
                       "--model-json", dir.file("config.json")});
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.code, 0);
  const auto lines = json_lines(dir.file("s.jsonl"));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["bench"], "step");
  EXPECT_EQ(lines[0]["batch"], 2);
  EXPECT_EQ(lines[0]["seq"], 16);
  EXPECT_EQ(lines[0]["device"], "cpu");
  EXPECT_EQ(json::parse(test::read_text(dir.file("config.json")))["num_hidden_layers"], 2);
  EXPECT_EQ(r.out.find("tandem bench optim"), std::string::npos) << "only the benchmark named runs";

  const Ran few = bench({"bench", "step", "-p", "tiny", "--device", "cpu", "--steps", "2"});
  EXPECT_NE(few.error.find("--steps >= 3"), std::string::npos) << few.error;
  const Ran key = bench({"bench", "step", "--device", "cpu", "--steps", "3", "--set", "train.micro_btach=2"});
  EXPECT_NE(key.error.find("did you mean 'train.micro_batch'"), std::string::npos) << key.error;
}

TEST(BenchCommand, BkCoreTakesItsGridAndThresholds) {
  expect_parse_error({"bench", "bk_core", "--batch", "0"});
  expect_parse_error({"bench", "bk_core", "--n", "4,0"});
  const Ran repeats = bench({"bench", "bk_core", "--device", "cpu", "--repeats", "0"});
  EXPECT_NE(repeats.error.find("--repeats must be >= 1"), std::string::npos) << repeats.error;
  const Ran device = bench({"bench", "bk_core", "--device", "gpu0", "--batch", "1", "--n", "2"});
  EXPECT_NE(device.error.find("--device"), std::string::npos) << device.error;

  // One run (a second's bandwidth probe): B in {1, 3}, N in {2, 5}, the ops baseline where B*N <= 6.
  test::TempDir dir;
  const Ran r = bench({"bench", "bk_core", "--device", "cpu", "--batch", "1,3", "--n", "2,5", "--repeats", "1",
                       "--ops-max", "6", "--cusparse-max", "1000", "--json", dir.file("bk.jsonl")});
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.code, 0);
  std::vector<std::string> got;
  for (const auto& j : json_lines(dir.file("bk.jsonl")))
    if (j["impl"] == "LibTorch ops complex128")
      got.push_back(std::to_string(j["B"].get<int64_t>()) + "x" + std::to_string(j["N"].get<int64_t>()));
  EXPECT_EQ(got, (std::vector<std::string>{"1x2", "1x5", "3x2"}));
  EXPECT_EQ(json_lines(dir.file("bk.jsonl")).size(), 4u * 3 + 3) << "three kernels at each of four points";
}

// Note [NVMe tier]: a small measurement on the test's directory, both ways of doing the I/O
// (io_uring where the kernel allows it), each with its three rates.
TEST(BenchCommand, NvmeMeasuresTheTiersFilesOnTheDirectoryGiven) {
  expect_parse_error({"bench", "nvme"});
  expect_parse_error({"bench", "nvme", "--dir", "/tmp", "--gib", "0"});
  test::TempDir dir;
  const Ran r = bench({"bench", "nvme", "--dir", dir.file("disk"), "--gib", "0.01", "--block-mib", "1", "--json",
                       dir.file("nvme.jsonl")});
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("pread/pwrite"), std::string::npos) << r.out;
  const auto lines = json_lines(dir.file("nvme.jsonl"));
  ASSERT_GE(lines.size(), 1u);
  for (const auto& j : lines) {
    EXPECT_EQ(j["bytes"].get<int64_t>(), 10 << 20);
    for (const char* k : {"write_gbs", "read_gbs", "read_write_gbs"}) EXPECT_GT(j[k].get<double>(), 0.0) << k;
  }
}

}  // namespace
}  // namespace tandem
