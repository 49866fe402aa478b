// Several processes on loopback with Gloo, started by `tandem launch` (Note [Data parallel],
// Note [Sharded checkpoints], Note [Launcher], Note [Heartbeat]).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "../test_util.h"
#include "dist_runs.h"
#include "tandem/core/strings.h"
#include "tandem/io/checkpoint.h"
#include "tandem/formats/safetensors.h"

namespace tandem::test {
namespace {

namespace fs = std::filesystem;

const char* kOffload = "--set offload.optimizer=cpu";
const char* kZero = "--set offload.optimizer=cpu --set dist.zero_stage=2";

// 2 processes with 4 rows each against 1 process with 8: the same global batch, the same steps.
TEST(Dist, TwoProcessesEqualOneWithTheSameGlobalBatch) {
  TempDir tmp;
  int k = 0;
  for (const std::string mode : {"", kOffload, kZero}) {
    const std::string one = tmp.file("one" + std::to_string(k)), two = tmp.file("two" + std::to_string(k));
    const Result r1 = train_one(one, 30, "--set train.micro_batch=8 " + mode);
    ASSERT_EQ(r1.code, 0) << r1.out;
    const Result r2 = launch(2, port(k), two, 30, "--set train.micro_batch=4 " + mode);
    ASSERT_EQ(r2.code, 0) << r2.out;
    EXPECT_NE(r2.out.find("[rank 1]"), std::string::npos);
    EXPECT_NE(r2.out.find("rank 1: CPU share"), std::string::npos) << r2.out;  // Note [Core division]
    SCOPED_TRACE("mode '" + mode + "'");
    expect_same_losses(losses(one), losses(two), 2e-5);
    EXPECT_FALSE(fs::exists(two + "/metrics.rank1.jsonl"));
    ++k;
  }
}

// The README's torchrun line: torchrun starts tandem itself with --no-python, and its workers
// train as tandem launch's do.
TEST(Dist, TorchrunStartsTheWorkersWithNoPython) {
  const fs::path torchrun = fs::path(TANDEM_PYTHON).parent_path() / "torchrun";
  if (!fs::exists(torchrun)) GTEST_SKIP() << "no torchrun at " << torchrun << " (scripts/setup.sh installs torch)";
  TempDir tmp;
  const Result ours = launch(2, port(0), tmp.file("ours"), 8, "--set train.micro_batch=4");
  ASSERT_EQ(ours.code, 0) << ours.out;
  const Result theirs = sh("env OMP_NUM_THREADS=1 " + torchrun.string() +
                               " --nnodes 1 --nproc-per-node 2 --master-addr 127.0.0.1 --master-port " +
                               std::to_string(port(1)) + " --no-python " + cli_path() + " train " +
                               train_args(tmp.file("torchrun"), 8, "--set train.micro_batch=4"),
                           tmp.file("torchrun.log"));
  ASSERT_EQ(theirs.code, 0) << theirs.out;
  EXPECT_NE(theirs.out.find("rank 1 of 2 (torchrun"), std::string::npos) << theirs.out;
  expect_same_losses(losses(tmp.file("ours")), losses(tmp.file("torchrun")), 0.0);
}

// Unequal rows per rank (given, then measured) with the loss weighted by each rank's share.
TEST(Dist, UnequalRowsPerRankEqualOneProcess) {
  TempDir tmp;
  const Result r1 = train_one(tmp.file("one"), 12, "--set train.micro_batch=8");
  ASSERT_EQ(r1.code, 0) << r1.out;
  const Result r2 = launch(2, port(0), tmp.file("given"), 12, "--set train.micro_batch=4 --set dist.balance=6,2");
  ASSERT_EQ(r2.code, 0) << r2.out;
  expect_same_losses(losses(tmp.file("one")), losses(tmp.file("given")), 2e-5);
  const Result r3 =
      launch(2, port(1), tmp.file("auto"), 12,
             "--set train.micro_batch=4 --set dist.balance=auto --set dist.balance_after=3 " + std::string(kZero));
  ASSERT_EQ(r3.code, 0) << r3.out;
  expect_same_losses(losses(tmp.file("one")), losses(tmp.file("auto")), 2e-5);
  const Result bad = launch(2, port(2), tmp.file("bad"), 2, "--set train.micro_batch=4 --set dist.balance=5,2");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("sums to 7 rows"), std::string::npos) << bad.out;
}

// Every rank's shard of masters and Adam states, put together, equals one process's whole state.
TEST(Dist, ShardedOptimizerStateEqualsTheUnshardedOne) {
  TempDir tmp;
  const Result r1 = train_one(tmp.file("one"), 10, "--set train.micro_batch=8 " + std::string(kZero));
  ASSERT_EQ(r1.code, 0) << r1.out;
  const Result r2 = launch(2, port(0), tmp.file("two"), 10, "--set train.micro_batch=4 " + std::string(kZero));
  ASSERT_EQ(r2.code, 0) << r2.out;
  const std::string c1 = tmp.file("one/checkpoints/step_00000010"), c2 = tmp.file("two/checkpoints/step_00000010");
  EXPECT_EQ(verify_checkpoint(c2), "");
  ASSERT_EQ(checkpoint_zero_world(c1), 1);
  ASSERT_EQ(checkpoint_zero_world(c2), 2);
  const ZeroShards whole(c1), parts(c2);
  const auto meta =
      nlohmann::json::parse(SafetensorsFile((fs::path(c2) / zero_shard_file(1)).string()).metadata().at("tandem_zero"));
  int compared = 0;
  for (const auto& [block, v] : meta["blocks"].items()) {
    const int64_t n = v[0].get<int64_t>();
    for (const char* kind : {"master", "exp_avg", "exp_avg_sq"}) {
      auto a = torch::empty({n}), b = torch::empty({n});
      whole.read(block, kind, 0, n, a);
      parts.read(block, kind, 0, n, b);
      // The two sums of the gradient differ in order; Adam's lr * m / sqrt(v) turns that last-bit
      // noise into up to ~1e-3 of a step (lr 3e-3) on elements whose gradient is near zero.
      const double atol = std::string(kind) == "master" ? 1e-5 : 1e-7;
      EXPECT_TRUE(AllClose(b, a, 1e-4, atol)) << block << "." << kind;
      ++compared;
    }
  }
  EXPECT_EQ(compared, 3 * 6);  // embedding, 4 layers, head
}

// A checkpoint saved by 2 ranks continues in 1 process exactly where the 2 would have gone on.
TEST(Dist, CheckpointOfWorldTwoResumesAtWorldOne) {
  TempDir tmp;
  const Result r2 = launch(2, port(0), tmp.file("two"), 10,
                           "--set train.micro_batch=4 --set train.checkpoint_every=5 " + std::string(kZero));
  ASSERT_EQ(r2.code, 0) << r2.out;
  const Result r1 = sh("OMP_NUM_THREADS=1 " + cli_path() + " train " +
                           train_args(tmp.file("one"), 10, "--set train.micro_batch=8 " + std::string(kZero)) +
                           " --resume " + tmp.file("two/checkpoints/step_00000005"),
                       tmp.file("one.log"));
  ASSERT_EQ(r1.code, 0) << r1.out;
  EXPECT_NE(r1.out.find("optimizer shards of 2 ranks, now 1"), std::string::npos) << r1.out;
  auto two = losses(tmp.file("two"));
  for (int64_t s = 1; s <= 5; ++s) two.erase(s);
  expect_same_losses(two, losses(tmp.file("one")), 2e-5);
  // A whole-state run cannot take the shards: it says how to resume them.
  const Result plain = sh("OMP_NUM_THREADS=1 " + cli_path() + " train " +
                              train_args(tmp.file("plain"), 10,
                                         "--set train.micro_batch=8 --set dist.zero_stage=0 " + std::string(kOffload)) +
                              " --resume " + tmp.file("two/checkpoints/step_00000005"),
                          tmp.file("plain.log"));
  EXPECT_EQ(plain.code, 2);
  EXPECT_NE(plain.out.find("dist.zero_stage=2"), std::string::npos) << plain.out;
}

// ZeRO-2 with 8-bit host states (Note [8-bit states]), and with a bf16 master beside them (Note
// [bf16 master]: its stochastic rounding hashes each element's index in the whole parameter space,
// so a slice rounds as the whole would): each rank quantises its own slices; the sharded checkpoint
// (written decoded to fp32) resumes at world 2 as the uninterrupted run, and at world 1 (the
// slices' blocks fall elsewhere, so the states are quantised afresh) within 1 %. The split is fixed
// at 0: an adaptive one may update a Block on the device at resume, in fp32.
TEST(Dist, EightBitStatesShardAndResumeAtAnyWorldSize) {
  int p = 0;
  for (const std::string master : {"fp32", "bf16"}) {
    SCOPED_TRACE(master + " master");
    TempDir tmp;
    const std::string q8 = " --set optim.state_dtype=int8 --set optim.master_dtype=" + master +
                           " --set offload.update_split=0 " + std::string(kZero);
    const Result r2 =
        launch(2, port(p++), tmp.file("two"), 10, "--set train.micro_batch=4 --set train.checkpoint_every=5" + q8);
    ASSERT_EQ(r2.code, 0) << r2.out;
    auto want = losses(tmp.file("two"));
    for (int64_t s = 1; s <= 5; ++s) want.erase(s);
    const Result again = launch(2, port(p++), tmp.file("again"), 10,
                                "--set train.micro_batch=4" + q8 + " --resume " + tmp.file("two/checkpoints/step_00000005"));
    ASSERT_EQ(again.code, 0) << again.out;
    expect_same_losses(want, losses(tmp.file("again")), 1e-6);
    const Result r1 = sh("OMP_NUM_THREADS=1 " + cli_path() + " train " +
                             train_args(tmp.file("one"), 10, "--set train.micro_batch=8" + q8) + " --resume " +
                             tmp.file("two/checkpoints/step_00000005"),
                         tmp.file("one.log"));
    ASSERT_EQ(r1.code, 0) << r1.out;
    expect_same_losses(want, losses(tmp.file("one")), 1e-2);
  }
}

// ZeRO-2 with each rank's slices of the last Blocks' states on the NVMe tier (Note [NVMe tier]; the
// ranks share the directory, each its own files): the losses of the run without the tier, bit for
// bit, and the sharded checkpoint of a run without the tier resumes with it as the uninterrupted run.
TEST(Dist, ShardedStatesOnTheNvmeTierEqualTheHostsAndResumeAcrossTheTier) {
  TempDir tmp;
  const std::string zero = " --set offload.update_split=0 --set offload.speculate=never --set optim.state_dtype=int8 "
                           "--set train.micro_batch=4 " + std::string(kZero);
  const std::string tier = " --set offload.nvme_path=" + tmp.file("disk") + " --set offload.nvme_blocks=3";
  const Result host = launch(2, port(0), tmp.file("host"), 10, "--set train.checkpoint_every=5" + zero);
  ASSERT_EQ(host.code, 0) << host.out;
  const Result disk = launch(2, port(1), tmp.file("disk_run"), 10, zero + tier);
  ASSERT_EQ(disk.code, 0) << disk.out;
  EXPECT_NE(disk.out.find("NVMe tier in"), std::string::npos) << disk.out;
  expect_same_losses(losses(tmp.file("host")), losses(tmp.file("disk_run")), 0.0);
  auto want = losses(tmp.file("host"));
  for (int64_t s = 1; s <= 5; ++s) want.erase(s);
  const Result resumed = launch(2, port(2), tmp.file("resumed"), 10,
                                zero + tier + " --resume " + tmp.file("host/checkpoints/step_00000005"));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  expect_same_losses(want, losses(tmp.file("resumed")), 0.0);
  EXPECT_TRUE(fs::is_empty(tmp.file("disk")));
}

// kill -9 of one worker mid-run: the launcher stops the other, restarts both from the newest
// intact checkpoint, and the run ends with the uninterrupted run's loss.
TEST(Dist, KilledWorkerIsRestartedAndTheRunEndsAsUninterrupted) {
  TempDir tmp;
  const std::string args = "--set train.micro_batch=4 --set train.checkpoint_every=10 " + std::string(kZero);
  const Result clean = launch(2, port(0), tmp.file("clean"), 30, args);
  ASSERT_EQ(clean.code, 0) << clean.out;
  const Result killed = launch(2, port(1), tmp.file("killed"), 30, args + " --resume auto", "--max-restarts 1",
                               "TANDEM_FAULTS=kill_after_step=1:15");
  ASSERT_EQ(killed.code, 0) << killed.out;
  EXPECT_NE(killed.out.find("rank 1 was killed by signal 9"), std::string::npos) << killed.out;
  EXPECT_NE(killed.out.find("restart 1 of 1"), std::string::npos) << killed.out;
  EXPECT_NE(killed.out.find("resumed from"), std::string::npos) << killed.out;
  // Exact, whatever split the restarted workers solve (Note [One update kernel on the CPU device]).
  expect_same_losses(losses(tmp.file("clean")), losses(tmp.file("killed")), 0.0);
  // Without restarts the launcher reports the kill.
  const Result no_restart = launch(2, port(2), tmp.file("once"), 30, args, "", "TANDEM_FAULTS=kill_after_step=0:3");
  EXPECT_EQ(no_restart.code, 137) << no_restart.out;
  // Note [Peer loss]: the survivor names the rank that stopped and how to go on, not a transport error.
  EXPECT_NE(no_restart.out.find("rank 0 stopped"), std::string::npos) << no_restart.out;
  EXPECT_NE(no_restart.out.find("--resume auto"), std::string::npos) << no_restart.out;
  EXPECT_EQ(no_restart.out.find("internal error"), std::string::npos) << no_restart.out;
  EXPECT_NE(no_restart.out.find("to continue from the newest checkpoint"), std::string::npos) << no_restart.out;
}

// The update split is solved from measured times, so a resumed run may update other Blocks on the
// device side than the run it continues did: on the CPU device that changes no bit (Note [One
// update kernel on the CPU device]). Forced here: every update on the CPU side before the
// checkpoint, every update on the device side after it.
TEST(Dist, ResumingUnderAnotherUpdateSplitRepeatsTheRunExactly) {
  TempDir tmp;
  const std::string args = "--set train.micro_batch=4 --set train.checkpoint_every=5 " + std::string(kZero);
  const Result cpu = launch(2, port(0), tmp.file("cpu"), 10, args + " --set offload.update_split=0");
  ASSERT_EQ(cpu.code, 0) << cpu.out;
  const Result device =
      launch(2, port(1), tmp.file("device"), 10,
             args + " --set offload.update_split=1 --resume " + tmp.file("cpu/checkpoints/step_00000005"));
  ASSERT_EQ(device.code, 0) << device.out;
  EXPECT_NE(device.out.find("resumed from"), std::string::npos) << device.out;
  EXPECT_NE(device.out.find("4 of 4 decoder blocks updated on the device"), std::string::npos) << device.out;
  auto want = losses(tmp.file("cpu"));
  for (int64_t s = 1; s <= 5; ++s) want.erase(s);
  expect_same_losses(want, losses(tmp.file("device")), 0.0);
}

// A rank that hangs (stopped) is found by the heartbeat; the others exit for a restart.
TEST(Dist, HungRankIsFoundByTheHeartbeat) {
  TempDir tmp;
  const Result r = launch(2, port(0), tmp.file("hung"), 200,
                          "--set train.micro_batch=4 --set dist.heartbeat_s=0.5 --set dist.heartbeat_timeout_s=3",
                          "--stop-grace 1", "TANDEM_FAULTS=stop_after_step=1:3");
  EXPECT_EQ(r.code, 75) << r.out;
  EXPECT_NE(r.out.find("rank 1 has not sent a heartbeat"), std::string::npos) << r.out;
  // Note [Stalled ranks]: and what the survivor was waiting for when it found out.
  EXPECT_NE(r.out.find("(this rank waited"), std::string::npos) << r.out;
}

// Note [Stalled ranks]: rank 1's step loop stops before a collective while its heartbeat goes on;
// rank 0, waiting in the gradient reduction, ends the run after dist.timeout_s with one line naming
// what it waited for, instead of a collective's timeout error.
TEST(Dist, ARankThatNeverReachesTheCollectiveEndsTheRunWithOneLine) {
  TempDir tmp;
  for (const std::string mode : {"", kZero}) {
    SCOPED_TRACE(mode);
    const Result r = launch(2, port(mode.empty() ? 0 : 1), tmp.file("stall" + std::to_string(mode.size())), 200,
                            "--set train.micro_batch=4 --set dist.heartbeat_s=0.5 --set dist.timeout_s=4 " + mode,
                            "--stop-grace 1", "TANDEM_FAULTS=stall_after_step=1:3");
    EXPECT_EQ(r.code, 75) << r.out;
    EXPECT_NE(r.out.find("error rank 0: waited"), std::string::npos) << r.out;
    if (mode.empty()) {
      EXPECT_NE(r.out.find("for the gradient reduction"), std::string::npos) << r.out;
    }
    EXPECT_NE(r.out.find("while every rank still sends heartbeats"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("--resume auto --run-dir " + tmp.file("stall")), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("internal error"), std::string::npos) << r.out;
  }
}

TEST(Dist, RanksWithDifferentConfigsAreRefused) {
  TempDir tmp;
  // Rank 1 gets another learning rate.
  const std::string worker = "sh -c 'exec " + cli_path() + " train " +
                             train_args(tmp.file("run"), 5, "--set train.micro_batch=4") +
                             " $( [ $RANK = 1 ] && echo --set optim.lr=1e-2 )'";
  const Result r = sh("env OMP_NUM_THREADS=1 " + cli_path() + " launch --nproc-per-node 2 --master-port " +
                          std::to_string(port(0)) + " -- " + worker,
                      tmp.file("run.log"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("the ranks run different configurations"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("start every rank with the same config"), std::string::npos) << r.out;
}

// Two "nodes": network namespaces joined by a veth pair, one launcher in each, --nnodes 2.
TEST(Dist, TwoNodesInNetworkNamespacesTrainTogether) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  const std::string a = "tnd_a" + std::to_string(getpid()), b = "tnd_b" + std::to_string(getpid());
  const std::string va = "tva" + std::to_string(getpid() % 100000), vb = "tvb" + std::to_string(getpid() % 100000);
  const std::string setup = "ip netns add " + a + " && ip netns add " + b + " && ip link add " + va +
                            " type veth peer name " + vb + " && ip link set " + va + " netns " + a +
                            " && ip link set " + vb + " netns " + b + " && ip -n " + a + " addr add 10.77.0.1/24 dev " +
                            va + " && ip -n " + b + " addr add 10.77.0.2/24 dev " + vb + " && ip -n " + a +
                            " link set " + va + " up && ip -n " + b + " link set " + vb + " up && ip -n " + a +
                            " link set lo up && ip -n " + b + " link set lo up";
  TempDir tmp;
  if (std::system((setup + " >" + tmp.file("netns.log") + " 2>&1").c_str()) != 0) {
    std::system(("ip netns del " + a + " 2>/dev/null; ip netns del " + b + " 2>/dev/null").c_str());
    GTEST_SKIP() << "this machine cannot make network namespaces: " << read_text(tmp.file("netns.log"));
  }
  const Result r1 = train_one(tmp.file("one"), 12, "--set train.micro_batch=8");
  ASSERT_EQ(r1.code, 0) << r1.out;
  const auto node = [&](const std::string& ns, const std::string& dev, int rank) {
    return "ip netns exec " + ns + " env OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=" + dev + " " + cli_path() +
           " launch --nproc-per-node 1 --nnodes 2 --node-rank " + std::to_string(rank) +
           " --master-addr 10.77.0.1 --master-port 29400 -- " + cli_path() + " train " +
           train_args(tmp.file("two"), 12, "--set train.micro_batch=4");
  };
  const Result r = sh("(" + node(a, va, 0) + " > " + tmp.file("node0.log") + " 2>&1 & " + node(b, vb, 1) +
                          "; n1=$?; wait $!; n0=$?; echo codes $n0 $n1; [ $n0 = 0 ] && [ $n1 = 0 ])",
                      tmp.file("node1.log"));
  std::system(("ip netns del " + a + "; ip netns del " + b).c_str());
  ASSERT_EQ(r.code, 0) << r.out << read_text(tmp.file("node0.log"));
  EXPECT_NE(read_text(tmp.file("node0.log")).find("rank 0 of 2"), std::string::npos);
  expect_same_losses(losses(tmp.file("one")), losses(tmp.file("two")), 2e-5);
}

}  // namespace
}  // namespace tandem::test

namespace tandem::test {
namespace {

// On a machine with two GPUs: NCCL, CUDA streams and the offload engine's overlapped reduction.
TEST(DistGpu, TwoGpusEqualOneWithTheSameGlobalBatch) {
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  TempDir tmp;
  int k = 0;
  for (const std::string mode : {"", kOffload, kZero}) {
    const std::string one = tmp.file("one" + std::to_string(k)), two = tmp.file("two" + std::to_string(k));
    // fp32 without TF32 (whose rounding depends on the matmul shapes, which differ between 8 and 4
    // rows) and deterministic kernels: the runs differ only in the order of the gradient sums.
    const std::string common =
        "--set model.n_layer=4 --set model.d_model=256 --set train.deterministic=true --set train.tf32=false " + mode;
    const auto gpu = [](std::string a) { return a.replace(a.find("--device cpu"), 12, "--device cuda"); };
    const Result r1 = sh("NCCL_NVLS_ENABLE=0 " + cli_path() + " train " +
                             gpu(train_args(one, 20, "--set train.micro_batch=8 " + common)),
                         one + ".log");
    ASSERT_EQ(r1.code, 0) << r1.out;
    const Result r2 = sh("NCCL_NVLS_ENABLE=0 " + cli_path() + " launch --nproc-per-node 2 --master-port " +
                             std::to_string(port(10 + k)) + " -- " + cli_path() + " train " +
                             gpu(train_args(two, 20, "--set train.micro_batch=4 " + common)),
                         two + ".log");
    ASSERT_EQ(r2.code, 0) << r2.out;
    EXPECT_NE(r2.out.find("NCCL"), std::string::npos) << r2.out;
    SCOPED_TRACE("mode '" + mode + "'");
    expect_same_losses(losses(one), losses(two), 1e-4);
    ++k;
  }
}

}  // namespace
}  // namespace tandem::test

namespace tandem::test {
namespace {

// SIGTERM to the launcher reaches every worker; the ranks agree to stop after one step, write one
// checkpoint together and exit 0; --resume auto then continues.
TEST(Dist, SigtermStopsEveryRankAfterTheSameStepWithOneCheckpoint) {
  TempDir tmp;
  const std::string run = tmp.file("run");
  const std::string cmd =
      "env OMP_NUM_THREADS=1 " + cli_path() + " launch --nproc-per-node 2 --master-port " + std::to_string(port(0)) +
      " -- " + cli_path() + " train " + train_args(run, 400, "--set train.micro_batch=4 " + std::string(kZero)) +
      " & pid=$!; while [ \"$(cat " + run +
      "/metrics.jsonl 2>/dev/null | grep -c loss)\" -lt 3 ]; do sleep 0.1; done; kill -TERM $pid; wait $pid";
  const Result r = sh(cmd, tmp.file("run.log"));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto l = losses(run);
  ASSERT_FALSE(l.empty());
  const int64_t last = l.rbegin()->first;
  EXPECT_LT(last, 400);
  const auto all = list_checkpoints(run + "/checkpoints");
  ASSERT_EQ(all.size(), 1u) << r.out;
  EXPECT_EQ(fs::path(all[0]).filename().string(), fs::path(strprintf("step_%08lld", static_cast<long long>(last))));
  EXPECT_EQ(verify_checkpoint(all[0]), "");
  EXPECT_EQ(checkpoint_zero_world(all[0]), 2);
}

}  // namespace
}  // namespace tandem::test

namespace tandem::test {
namespace {

// --nproc-per-node 1:2 with a slot that fails in every attempt: after its second failure the
// launcher goes on with one worker, which reshards the two ranks' optimizer state and finishes.
TEST(Dist, AFailingSlotIsDroppedAndTheRunGoesOnResharded) {
  TempDir tmp;
  const Result r =
      sh("env OMP_NUM_THREADS=1 TANDEM_FAULTS=kill_after_step=1:3,every_attempt=1 " + cli_path() +
             " launch --nproc-per-node 1:2 --max-restarts 3 --stop-grace 2 --master-port " + std::to_string(port(0)) +
             " -- " + cli_path() + " train " +
             train_args(tmp.file("run"), 12,
                        "--set train.micro_batch=4 --set train.checkpoint_every=2 --resume auto " + std::string(kZero)),
         tmp.file("run.log"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("slot 1 failed twice; going on with 1 worker"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("optimizer shards of 2 ranks, now 1"), std::string::npos) << r.out;
  const auto l = losses(tmp.file("run"));
  ASSERT_TRUE(l.count(12));
  EXPECT_TRUE(std::isfinite(l.at(12)));
  const auto all = list_checkpoints(tmp.file("run/checkpoints"));
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(checkpoint_zero_world(all.back()), 1);  // the last ones are the single worker's
}

}  // namespace
}  // namespace tandem::test
