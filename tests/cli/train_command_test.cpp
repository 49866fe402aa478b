// `tandem train` in-process (cli/train_command.h): --resume naming a checkpoint or a run directory,
// --resume auto (the run directory's newest intact checkpoint, damaged ones passed over, a fresh start
// in a directory without one), and a run whose checkpoint could not be written ending with exit code 1.

#include "tandem/cli/train_command.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../error_of.h"
#include "../test_util.h"
#include "tandem/core/interrupt.h"
#include "tandem/io/checkpoint.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using test::error_of;

// The SIGINT and SIGTERM handlers train's run installs, put back at scope exit.
class SignalGuard {
 public:
  SignalGuard() {
    sigaction(SIGINT, nullptr, &int_);
    sigaction(SIGTERM, nullptr, &term_);
  }
  ~SignalGuard() {
    sigaction(SIGINT, &int_, nullptr);
    sigaction(SIGTERM, &term_, nullptr);
    clear_stop_request();
  }

 private:
  struct sigaction int_ {
  }, term_{};
};

struct Ran {
  int code = -1;
  std::string err, error;  ///< stderr (the log), the UserError
};

// A short CPU run of the tiny model: `tandem train <kTiny> <argv>`.
Ran train(const std::vector<std::string>& more) {
  std::vector<std::string> argv = {"train",
                                   "-p",
                                   "tiny",
                                   "--device",
                                   "cpu",
                                   "--set",
                                   "train.seq_len=32",
                                   "--set",
                                   "train.micro_batch=2",
                                   "--set",
                                   "train.eval_every=0",
                                   "--set",
                                   "data.synthetic_bytes=20000",
                                   "--set",
                                   "train.progress=off",
                                   "--set",
                                   "monitor.enabled=false"};
  argv.insert(argv.end(), more.begin(), more.end());
  CLI::App app{"train test"};
  TrainCommand command(app);
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());  // CLI11 takes them last first
  app.parse(reversed);
  EXPECT_TRUE(command.chosen());
  SignalGuard signals;
  Ran r;
  testing::internal::CaptureStderr();
  r.error = error_of([&] { r.code = command.run(); });
  r.err = testing::internal::GetCapturedStderr();
  return r;
}

nlohmann::json summary(const std::string& run_dir) {
  return nlohmann::json::parse(test::read_text((fs::path(run_dir) / "summary.json").string()));
}

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

TEST(TrainCommand, IsChosenOnlyWhenNamedAndResumeNeedsAValue) {
  CLI::App app{"train test"};
  app.add_subcommand("other", "another command");
  TrainCommand command(app);
  std::vector<std::string> other = {"other"};
  app.parse(other);
  EXPECT_FALSE(command.chosen());
  CLI::App app2{"train test"};
  TrainCommand named(app2);
  std::vector<std::string> bare = {"--resume", "train"};
  EXPECT_THROW(app2.parse(bare), CLI::ParseError);
}

TEST(TrainCommand, ResumeContinuesFromARunDirectoryOrOneOfItsCheckpoints) {
  test::TempDir dir;
  const std::string run = dir.file("run");
  const Ran first = train({"--steps", "2", "--run-dir", run, "--set", "train.checkpoint_every=1"});
  ASSERT_EQ(first.error, "") << first.err;
  EXPECT_EQ(first.code, 0);
  const std::string step1 = (fs::path(run) / "checkpoints" / step_name(1)).string();
  const std::string step2 = (fs::path(run) / "checkpoints" / step_name(2)).string();
  ASSERT_TRUE(fs::is_directory(step2)) << first.err;

  // A run directory: its newest checkpoint; the run directory is the resumed run's.
  const Ran by_dir = train({"--steps", "3", "--resume", run});
  ASSERT_EQ(by_dir.error, "") << by_dir.err;
  EXPECT_EQ(by_dir.code, 0);
  EXPECT_TRUE(has(by_dir.err, "resumed from " + step2 + " at step 2")) << by_dir.err;
  EXPECT_EQ(summary(run)["final_step"], 3);

  // A checkpoint directory itself, an older one.
  const Ran by_checkpoint = train({"--steps", "4", "--resume", step1});
  ASSERT_EQ(by_checkpoint.error, "") << by_checkpoint.err;
  EXPECT_TRUE(has(by_checkpoint.err, "resumed from " + step1 + " at step 1")) << by_checkpoint.err;
  EXPECT_EQ(summary(run)["final_step"], 4);

  const Ran missing = train({"--steps", "4", "--resume", dir.file("nothing")});
  EXPECT_NE(missing.error.find("not a directory"), std::string::npos) << missing.error;
}

TEST(TrainCommand, ResumeAutoTakesTheNewestIntactCheckpointOfTheRunDirectory) {
  test::TempDir dir;
  const std::string run = dir.file("run");
  ASSERT_EQ(train({"--steps", "2", "--run-dir", run, "--set", "train.checkpoint_every=1"}).code, 0);
  const Ran newest = train({"--steps", "3", "--run-dir", run, "--resume", "auto"});
  ASSERT_EQ(newest.error, "") << newest.err;
  EXPECT_TRUE(has(newest.err, "resumed from " + (fs::path(run) / "checkpoints" / step_name(3 - 1)).string()))
      << newest.err;

  // The newest (step 3) loses its weights: passed over with a warning, step 2 resumed.
  const std::string step3 = (fs::path(run) / "checkpoints" / step_name(3)).string();
  ASSERT_TRUE(fs::is_directory(step3));
  fs::remove(fs::path(step3) / "model.safetensors");
  const Ran damaged = train({"--steps", "4", "--run-dir", run, "--resume", "auto"});
  ASSERT_EQ(damaged.error, "") << damaged.err;
  EXPECT_EQ(damaged.code, 0);
  EXPECT_TRUE(has(damaged.err, "--resume auto: passing over damaged checkpoint " + step3)) << damaged.err;
  EXPECT_TRUE(
      has(damaged.err, "resumed from " + (fs::path(run) / "checkpoints" / step_name(2)).string() + " at step 2"))
      << damaged.err;
  EXPECT_EQ(summary(run)["final_step"], 4);
}

// A launcher's first attempt, or a run killed before its first checkpoint: nothing to resume, and
// the run directory it already wrote into is taken over rather than refused.
TEST(TrainCommand, ResumeAutoWithoutACheckpointStartsAtStepZero) {
  test::TempDir dir;
  const std::string fresh = dir.file("fresh");
  const Ran none = train({"--steps", "2", "--run-dir", fresh, "--resume", "auto"});
  ASSERT_EQ(none.error, "") << none.err;
  EXPECT_TRUE(has(none.err, "--resume auto: no intact checkpoint in " + fresh + "; starting at step 0")) << none.err;
  EXPECT_EQ(summary(fresh)["final_step"], 2);

  const std::string crashed = dir.file("crashed");
  fs::create_directories(crashed);
  std::ofstream(fs::path(crashed) / "metrics.jsonl") << "{\"step\": 1, \"loss\": 5.0}\n";
  const Ran refused = train({"--steps", "2", "--run-dir", crashed});
  EXPECT_NE(refused.error.find("already holds a run"), std::string::npos) << refused.error;
  EXPECT_NE(refused.error.find("--resume auto --run-dir " + crashed), std::string::npos) << refused.error;
  const Ran taken = train({"--steps", "2", "--run-dir", crashed, "--resume", "auto"});
  ASSERT_EQ(taken.error, "") << taken.err;
  EXPECT_EQ(taken.code, 0);
  EXPECT_TRUE(has(taken.err, "starting at step 0")) << taken.err;
}

TEST(TrainCommand, ResumeAutoFindsTheRunDirectoryInAConfigFileToo) {
  test::TempDir dir;
  const Ran bare = train({"--steps", "2", "--resume", "auto"});
  EXPECT_NE(bare.error.find("--resume auto looks in the run directory: give --run-dir (or train.run_dir)"),
            std::string::npos)
      << bare.error;
  const std::string run = dir.file("from-yaml");
  std::ofstream(dir.file("run.yaml")) << "train:\n  run_dir: " << run << "\n";
  const Ran r = train({"--steps", "2", "-c", dir.file("run.yaml"), "--resume", "auto"});
  ASSERT_EQ(r.error, "") << r.err;
  EXPECT_TRUE(has(r.err, "no intact checkpoint in " + run)) << r.err;
  EXPECT_TRUE(fs::exists(fs::path(run) / "summary.json"));
}

// Note [Checkpoint failures]: the run goes on, but an end that is not saved is exit code 1 and one
// line naming the step, the reason and the directory to fix.
TEST(TrainCommand, ARunWhoseCheckpointCouldNotBeWrittenEndsWithExitCode1) {
  test::TempDir dir;
  const std::string run = dir.file("run");
  fs::create_directories(run);
  std::ofstream(fs::path(run) / "checkpoints") << "a file where the checkpoints go\n";
  const Ran r = train({"--steps", "2", "--run-dir", run, "--resume", "auto"});
  ASSERT_EQ(r.error, "") << r.err;
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(has(r.err, "tandem: error: the run ended at step 2 but its checkpoint could not be written (step 2: "))
      << r.err;
  EXPECT_TRUE(has(r.err, "); nothing of this run is saved; free space or fix the permissions of " + run +
                             "/checkpoints and resume\n"))
      << r.err;
  EXPECT_TRUE(summary(run)["unsaved"].get<bool>());
}

}  // namespace
}  // namespace tandem
