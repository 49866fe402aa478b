// Note [NVMe tier] as a user meets it: `tandem train` with offload.nvme_path gives the losses of
// the run without it, bit for bit; a checkpoint resumes across a change of tier (on to off, off to
// on); a run killed while writing a checkpoint resumes from the one before; `tandem inspect --plan` places the states past the host on the tier; bad settings are one
// line and exit 2.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "../test_util.h"
#include "cli_run.h"

namespace tandem {
namespace {

using test::run_cli;

const std::string kRun =
    " --preset tiny --device cpu --set train.seq_len=32 --set data.synthetic_bytes=60000 --set train.eval_every=0"
    " --set monitor.enabled=false --set train.progress=off --set offload.optimizer=cpu --set offload.speculate=never"
    " --set optim.state_dtype=int8 --set train.checkpoint_every=4 --set optim.warmup_steps=2 --set optim.decay_steps=8"
    // every Block CPU-updated: a solved split would move 8-bit states to the device side, where they
    // are fp32, at steps that follow measured times
    " --set offload.update_split=0";

std::map<int64_t, double> losses(const std::string& dir) {
  std::map<int64_t, double> out;
  std::ifstream in(dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return out;
}

TEST(NvmeTierRuns, TrainAndResumeAcrossAChangeOfTierGiveTheSameLosses) {
  test::TempDir tmp;
  const std::string nvme = " --set offload.nvme_path=" + tmp.file("disk") + " --set offload.nvme_blocks=3";
  const auto plain = run_cli("train --steps 8 --run-dir " + tmp.file("plain") + kRun);
  ASSERT_EQ(plain.code, 0) << plain.err;
  const auto want = losses(tmp.file("plain"));
  ASSERT_EQ(want.size(), 8u);

  const auto tier = run_cli("train --steps 8 --run-dir " + tmp.file("tier") + kRun + nvme);
  ASSERT_EQ(tier.code, 0) << tier.err;
  EXPECT_NE(tier.err.find("NVMe tier in " + tmp.file("disk") + ": the states of 3 blocks"), std::string::npos)
      << tier.err;
  EXPECT_EQ(losses(tmp.file("tier")), want);

  // Checkpointed at step 4 with the tier, resumed without it; and the other way round.
  for (const bool tier_first : {true, false}) {
    SCOPED_TRACE(tier_first ? "on, then off" : "off, then on");
    const std::string dir = tmp.file(tier_first ? "on_off" : "off_on");
    const auto first = run_cli("train --steps 4 --run-dir " + dir + kRun + (tier_first ? nvme : ""));
    ASSERT_EQ(first.code, 0) << first.err;
    const auto second = run_cli("train --steps 8 --resume auto --run-dir " + dir + kRun + (tier_first ? "" : nvme));
    ASSERT_EQ(second.code, 0) << second.err;
    EXPECT_EQ(losses(dir), want);
  }
  // Killed while writing step 8's checkpoint (its states read from the tier): the checkpoint of step
  // 4 is intact, and the run resumed from it ends as the uninterrupted one.
  const std::string killed = tmp.file("killed");
  ::setenv("TANDEM_FAULTS", "kill_in_checkpoint=8", 1);
  const auto cut = run_cli("train --steps 8 --run-dir " + killed + kRun + nvme);
  ::unsetenv("TANDEM_FAULTS");
  EXPECT_NE(cut.code, 0) << cut.err;
  const auto resumed = run_cli("train --steps 8 --resume auto --run-dir " + killed + kRun + nvme);
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("at step 4"), std::string::npos) << resumed.err;
  EXPECT_EQ(losses(killed), want);
  EXPECT_TRUE(std::filesystem::is_empty(tmp.file("disk"))) << "the tier's files go with their run, killed or not";
}

TEST(NvmeTierRuns, ThePlanPutsTheStatesPastTheHostOnTheTier) {
  // 7B, bf16, a GPU of 80 GiB and a host of 48 GiB: per-block buffers do not fit, a ring does not
  // either; the tier takes the last blocks' states.
  const auto r = run_cli(
      "inspect -p 7B --device cpu --plan --gpu-memory 80 --host-memory 48 --set train.precision=bf16 --set "
      "model.checkpointing=true --set offload.optimizer=cpu --set offload.nvme_path=/tmp/x");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("offload.nvme_blocks=auto: the states of the last "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("states on NVMe: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("NVMe           optimizer states m, v"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("NVMe bounce slots"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the plan fits"), std::string::npos) << r.out;
  // Without the tier the same host refuses, naming it.
  const auto refused = run_cli(
      "inspect -p 7B --device cpu --plan --gpu-memory 80 --host-memory 48 --set train.precision=bf16 --set "
      "model.checkpointing=true --set offload.optimizer=cpu");
  EXPECT_EQ(refused.code, 2) << refused.out << refused.err;
  EXPECT_NE(refused.err.find("offload.nvme_path=DIR"), std::string::npos) << refused.err;
}

void expect_user_error(const std::string& args, const std::string& needle) {
  const auto r = run_cli(args);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
  const size_t at = r.err.find("tandem: error: ");
  ASSERT_NE(at, std::string::npos) << r.err;
  const std::string line = r.err.substr(at);
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1) << r.err;
  EXPECT_NE(line.find(needle), std::string::npos) << r.err;
}

TEST(NvmeTierRuns, BadSettingsAreOneLineAndExitTwo) {
  test::TempDir tmp;
  { std::ofstream(tmp.file("a-file")) << "x"; }
  expect_user_error("train --steps 1 --run-dir " + tmp.file("r1") + kRun + " --set offload.nvme_path=" +
                        tmp.file("a-file") + "/under --set offload.nvme_blocks=1",
                    "offload.nvme_path");
  expect_user_error("train --steps 1 --run-dir " + tmp.file("r2") + kRun + " --set offload.nvme_blocks=2",
                    "set offload.nvme_path");
  expect_user_error("train --steps 1 --run-dir " + tmp.file("r3") + " --preset tiny --device cpu --set "
                    "offload.nvme_path=" + tmp.file("d"),
                    "offload.optimizer=cpu");
  expect_user_error("train --steps 1 --run-dir " + tmp.file("r4") + kRun + " --set offload.speculate=always --set "
                    "offload.nvme_path=" + tmp.file("d"),
                    "offload.speculate");
}

}  // namespace
}  // namespace tandem
