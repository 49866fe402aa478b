// Losing nothing: damaged checkpoints are found and passed over, a kill -9 in the middle of a
// checkpoint write leaves the previous one to resume from, a full disk fails one checkpoint and
// not the run, and SIGTERM stops a run so that resuming it ends exactly where an uninterrupted
// run ends (Note [Checkpoint layout], Note [Checkpoint failures], Note [Stopping on a signal]).

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "../test_util.h"
#include "tandem/core/interrupt.h"
#include "tandem/io/checkpoint.h"
#include "tandem/run/trainer.h"

namespace fs = std::filesystem;

namespace tandem {
namespace {

std::vector<std::string> kTinyArgs = {"train",
                                      "-p",
                                      "tiny",
                                      "--device",
                                      "cpu",
                                      "--set",
                                      "train.micro_batch=8",
                                      "--set",
                                      "train.seq_len=64",
                                      "--set",
                                      "train.eval_every=0",
                                      "--set",
                                      "data.synthetic_bytes=200000",
                                      "--set",
                                      "train.progress=off"};

/// Starts the CLI with these arguments (and env); returns its pid.
pid_t spawn(std::vector<std::string> args, const std::vector<std::string>& env = {}) {
  const pid_t pid = fork();
  if (pid == 0) {
    for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
    setenv("OMP_NUM_THREADS", "1", 1);
    const std::string cli = test::cli_path();
    std::vector<char*> argv{const_cast<char*>(cli.c_str())};
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    execv(cli.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

int wait_status(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

size_t metric_rows(const std::string& path) {
  std::ifstream in(path);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) n += line.find("\"loss\"") != std::string::npos;
  return n;
}

double final_loss(const std::string& run_dir) {
  return nlohmann::json::parse(test::read_text((fs::path(run_dir) / "summary.json").string()))["final_loss"]
      .get<double>();
}

TEST(Resilience, ACorruptedByteInAWeightFileIsFoundAndPassedOver) {
  test::TempDir dir;
  Config c = test::tiny_cpu_config(dir.path(), 4);
  c.train.checkpoint_every = 2;
  train(c, {});
  const auto all = list_checkpoints(dir.file("checkpoints"));
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(verify_checkpoint(all[1]), "");
  const std::string weights = (fs::path(all[1]) / "model.safetensors").string();
  {
    std::fstream f(weights, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(fs::file_size(weights) / 2));
    char b = 0;
    f.read(&b, 1);
    b = static_cast<char>(b ^ 0x10);  // one bit of one weight, same size
    f.seekp(static_cast<std::streamoff>(fs::file_size(weights) / 2));
    f.write(&b, 1);
  }
  EXPECT_NE(verify_checkpoint(all[1]).find("model.safetensors' does not match its SHA-256"), std::string::npos)
      << verify_checkpoint(all[1]);
  std::vector<std::string> skipped;
  EXPECT_EQ(newest_intact_checkpoint(dir.path(), &skipped), all[0]);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(resolve_checkpoint_dir(dir.path()), all[0]) << "a run directory resumes from its newest intact checkpoint";
  Config again = c;
  again.train.steps = 6;
  const std::string err = test::error_of([&] { train(again, {all[1]}); });
  EXPECT_NE(err.find("is damaged"), std::string::npos) << err;
  EXPECT_NE(err.find("--resume auto"), std::string::npos) << err;
}

TEST(Resilience, AKillDuringACheckpointWriteLeavesThePreviousOneToResumeFrom) {
  test::TempDir dir, straight;
  const auto args = with(kTinyArgs, {"--steps", "8", "--set", "train.checkpoint_every=2"});
  // Killed with SIGKILL while writing step 6's checkpoint.
  EXPECT_EQ(wait_status(spawn(with(args, {"--run-dir", dir.path()}), {"TANDEM_FAULTS=kill_in_checkpoint=6"})),
            128 + SIGKILL);
  EXPECT_TRUE(fs::exists(dir.file("checkpoints/.step_00000006.tmp"))) << "the write was cut off";
  const auto all = list_checkpoints(dir.file("checkpoints"));
  ASSERT_EQ(all.back(), dir.file("checkpoints/step_00000004"));
  EXPECT_EQ(wait_status(spawn(with(args, {"--run-dir", dir.path(), "--resume", "auto"}))), 0);
  EXPECT_FALSE(fs::exists(dir.file("checkpoints/.step_00000006.tmp"))) << "the cut-off write is cleaned up";
  EXPECT_EQ(wait_status(spawn(with(args, {"--run-dir", straight.path()}))), 0);
  EXPECT_EQ(final_loss(dir.path()), final_loss(straight.path())) << "resumed from step 4, bit for bit";
}

TEST(Resilience, AFullDiskFailsOneCheckpointKeepsTheEarlierAndTrainingGoesOn) {
  test::TempDir mnt;
  // A 24 MiB tmpfs: the tiny model's first checkpoint (about 10 MB) fits, the second does not.
  if (mount("tmpfs", mnt.path().c_str(), "tmpfs", 0, "size=24m") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << std::strerror(errno);
  {
    Config c = test::tiny_cpu_config(mnt.file("run"), 6);
    c.train.checkpoint_every = 2;
    c.train.keep_checkpoints = 5;
    const TrainSummary s = train(c, {});
    EXPECT_EQ(s.final_step, 6) << "training went on";
    EXPECT_NE(s.checkpoint_error.find("step"), std::string::npos);
    const auto all = list_checkpoints(mnt.file("run/checkpoints"));
    ASSERT_GE(all.size(), 1u);
    for (const auto& ck : all) EXPECT_EQ(verify_checkpoint(ck), "") << ck;
    EXPECT_LT(all.size(), 3u) << "the disk could not have held three";
    for (const auto& e : fs::directory_iterator(mnt.file("run/checkpoints")))
      EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << "left behind: " << e.path();
    EXPECT_NE(test::read_text(mnt.file("run/metrics.jsonl")).find("checkpoint_failed"), std::string::npos);
    EXPECT_TRUE(s.unsaved) << "the final checkpoint (step 6) did not fit";
  }
  umount(mnt.path().c_str());
}

// A run whose every checkpoint fails ends loudly: one line naming the failure, a non-zero exit,
// and summary.json saying so.
TEST(Resilience, ARunThatSavedNothingExitsNonZero) {
  test::TempDir mnt, log;
  // A 2 MiB tmpfs: the run directory's small files fit, no checkpoint of the tiny model (10 MB) does.
  if (mount("tmpfs", mnt.path().c_str(), "tmpfs", 0, "size=2m") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << std::strerror(errno);
  const std::string cmd = "OMP_NUM_THREADS=1 " + test::cli_path() +
                          " train -p tiny --device cpu --steps 2 --set train.seq_len=32 --set train.eval_every=0 "
                          "--set data.synthetic_bytes=20000 --set monitor.enabled=false --run-dir " +
                          mnt.file("run") + " 2>" + log.file("err");
  const int status = std::system(cmd.c_str());
  const std::string err = test::read_text(log.file("err"));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status << "\n" << err;
  EXPECT_NE(err.find("tandem: error: the run ended at step 2 but its checkpoint could not be written"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("nothing of this run is saved"), std::string::npos) << err;
  const auto summary = nlohmann::json::parse(test::read_text(mnt.file("run/summary.json")));
  EXPECT_TRUE(summary["unsaved"].get<bool>());
  umount(mnt.path().c_str());
}

TEST(Resilience, SigtermStopsWithACheckpointAndTheResumedRunEndsAsAnUninterruptedOne) {
  test::TempDir dir, straight;
  const auto args = with(kTinyArgs, {"--steps", "60"});
  const pid_t pid = spawn(with(args, {"--run-dir", dir.path()}));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (metric_rows(dir.file("metrics.jsonl")) < 10 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  kill(pid, SIGTERM);
  EXPECT_EQ(wait_status(pid), 0) << "a stop on request is a normal end";
  const auto summary = nlohmann::json::parse(test::read_text(dir.file("summary.json")));
  EXPECT_TRUE(summary["interrupted"].get<bool>());
  const int64_t stopped_at = summary["final_step"].get<int64_t>();
  EXPECT_LT(stopped_at, 60);
  ASSERT_EQ(list_checkpoints(dir.file("checkpoints")).back(),
            dir.file("checkpoints/step_" + std::string(8 - std::to_string(stopped_at).size(), '0') +
                     std::to_string(stopped_at)));
  EXPECT_EQ(wait_status(spawn(with(args, {"--run-dir", dir.path(), "--resume", "auto"}))), 0);
  EXPECT_EQ(wait_status(spawn(with(args, {"--run-dir", straight.path()}))), 0);
  EXPECT_EQ(final_loss(dir.path()), final_loss(straight.path()));
}

TEST(Resilience, ASecondSignalStopsAtOnceLeavingOnlyIntactCheckpoints) {
  test::TempDir dir;
  // Steps of about a second (B=128, T=128), so the second signal lands while the first one waits.
  const pid_t pid = spawn(with(kTinyArgs, {"--steps", "100000", "--set", "train.micro_batch=128", "--set",
                                           "train.checkpoint_every=2", "--run-dir", dir.path()}));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (metric_rows(dir.file("metrics.jsonl")) < 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  kill(pid, SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // two signals at once coalesce into one
  kill(pid, SIGTERM);
  EXPECT_EQ(wait_status(pid), 128 + SIGTERM);
  EXPECT_FALSE(fs::exists(dir.file("summary.json"))) << "it stopped before the end of the run";
  for (const auto& ck : list_checkpoints(dir.file("checkpoints"))) EXPECT_EQ(verify_checkpoint(ck), "") << ck;
}

TEST(Resilience, BackgroundCheckpointsResumeAsSynchronousOnes) {
  test::TempDir async_dir, sync_dir;
  Config c = test::tiny_cpu_config(async_dir.path(), 9);
  c.train.checkpoint_every = 3;
  c.train.keep_checkpoints = 5;
  c.offload.optimizer = OffloadTarget::kCpu;
  c.offload.update_split = "0.5";  // fixed: an automatic split follows measured times, run by run
  train(c, {});
  const std::string metrics = test::read_text(async_dir.file("metrics.jsonl"));
  EXPECT_NE(metrics.find("checkpoint_write_s"), std::string::npos) << "no checkpoint was written in the background";
  Config s = c;
  s.train.run_dir = sync_dir.path();
  s.train.async_checkpoint = false;
  train(s, {});
  EXPECT_EQ(test::read_text(sync_dir.file("metrics.jsonl")).find("checkpoint_write_s"), std::string::npos);
  // Step 6 written in the background holds what the synchronous run holds at step 6, byte for byte.
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "rng.safetensors"})
    EXPECT_EQ(test::read_text(async_dir.file(std::string("checkpoints/step_00000006/") + f)),
              test::read_text(sync_dir.file(std::string("checkpoints/step_00000006/") + f)))
        << f;
  // And a run resumed from it ends where the uninterrupted one did.
  test::TempDir resumed;
  fs::create_directories(resumed.file("checkpoints"));
  fs::copy(async_dir.file("checkpoints/step_00000006"), resumed.file("checkpoints/step_00000006"));
  Config r = c;
  r.train.run_dir = resumed.path();
  const TrainSummary again = train(r, {resumed.file("checkpoints/step_00000006")});
  EXPECT_EQ(final_loss(resumed.path()), final_loss(async_dir.path()));
  EXPECT_EQ(again.first_step, 6);
}

TEST(Resilience, AStopRequestInProcessEndsTheLoopAfterTheStep) {
  test::TempDir dir;
  Config c = test::tiny_cpu_config(dir.path(), 50);
  c.train.save_final = false;  // a stop checkpoints all the same
  request_stop();
  const TrainSummary s = train(c, {});
  clear_stop_request();
  EXPECT_TRUE(s.interrupted);
  EXPECT_EQ(s.final_step, 1);
  EXPECT_EQ(s.last_checkpoint, dir.file("checkpoints/step_00000001"));
}

}  // namespace
}  // namespace tandem
