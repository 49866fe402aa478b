#include "tandem/run/trainer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "tandem/core/error.h"
#include "tandem/io/hf.h"
#include "tandem/formats/safetensors.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

Config small_run(const std::string& dir, int64_t steps) { return test::tiny_cpu_config(dir, steps); }

double mean(const std::vector<double>& v, size_t from, size_t to) {
  double s = 0;
  for (size_t i = from; i < to; ++i) s += v[i];
  return s / double(to - from);
}

TEST(Trainer, LossFallsOnTheDefaultCorpusWithin200Steps) {
  test::TempDir dir;
  Config c = small_run(dir.path(), 200);
  c.train.eval_every = 100;
  c.train.save_final = false;
  const auto s = train(c, {});
  ASSERT_EQ(s.losses.size(), 200u);
  const double first = s.losses[0], last = mean(s.losses, 190, 200);
  EXPECT_NEAR(first, std::log(256.0), 0.3);  // uniform over bytes at the start
  EXPECT_LT(last, 0.4 * first) << "first " << first << " last " << last;
  EXPECT_GT(s.last_eval_loss, 0);
  EXPECT_LT(s.last_eval_loss, 0.5 * first);
  // metrics.jsonl: one line per step plus evaluations, with the documented fields.
  std::ifstream in(dir.file("metrics.jsonl"));
  std::string line;
  int steps = 0, evals = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("eval_loss")) {
      ++evals;
      continue;
    }
    ++steps;
    for (const char* k : {"step", "loss", "lr", "tokens_per_s", "step_time_s", "mem_host_peak_bytes", "grad_norm"})
      EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_EQ(steps, 200);
  EXPECT_EQ(evals, 2);
}

// Note: N steps straight and N/2 + resume + N/2 must give bitwise-identical losses (fp32, CPU),
// with gradient accumulation and clipping active.
TEST(Trainer, ResumeContinuesBitwiseIdentically) {
  test::TempDir straight_dir, split_dir;
  Config c = small_run(straight_dir.path(), 12);
  c.train.micro_batch = 4;
  c.train.seq_len = 32;
  c.train.grad_accum = 2;
  c.train.grad_clip = 0.5;
  const auto straight = train(c, {});
  ASSERT_EQ(straight.losses.size(), 12u);

  Config first = c;
  first.train.run_dir = split_dir.path();
  first.train.steps = 6;
  const auto a = train(first, {});
  ASSERT_FALSE(a.last_checkpoint.empty());
  Config second = c;
  second.train.run_dir = split_dir.path();
  TrainOptions resume;
  resume.resume = a.last_checkpoint;
  const auto b = train(second, resume);
  ASSERT_EQ(b.first_step, 6);
  ASSERT_EQ(b.losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(a.losses[i], straight.losses[i]) << "step " << i + 1;
    EXPECT_EQ(b.losses[i], straight.losses[6 + i]) << "step " << 7 + i;
  }
  // Resuming the run directory picks its newest checkpoint; nothing left to do.
  resume.resume = split_dir.path();
  const auto c2 = train(second, resume);
  EXPECT_EQ(c2.first_step, 12);
  EXPECT_TRUE(c2.losses.empty());
}

TEST(Trainer, CheckpointIsAnHfDirectory) {
  test::TempDir dir;
  Config c = small_run(dir.path(), 3);
  c.train.checkpoint_every = 1;
  c.train.keep_checkpoints = 2;
  const auto s = train(c, {});
  const auto ckpts = fs::path(dir.path()) / "checkpoints";
  EXPECT_FALSE(fs::exists(ckpts / "step_00000001"));  // pruned: keep 2
  EXPECT_TRUE(fs::exists(ckpts / "step_00000002"));
  EXPECT_TRUE(fs::exists(ckpts / "step_00000003"));
  for (auto& e : fs::directory_iterator(ckpts))
    EXPECT_EQ(e.path().filename().string().rfind(".", 0), std::string::npos);
  const ModelSpec spec = spec_from_hf_config(s.last_checkpoint + "/config.json");
  EXPECT_EQ(spec.n_layer, 4);
  SafetensorsFile w(s.last_checkpoint + "/model.safetensors");
  EXPECT_TRUE(w.contains("model.layers.3.self_attn.q_proj.weight"));
  EXPECT_EQ(w.entry("model.embed_tokens.weight").shape, (std::vector<int64_t>{256, 128}));
}

TEST(Trainer, ShapeMismatchOnResumeNamesTheTensor) {
  test::TempDir dir;
  Config c = small_run(dir.path(), 2);
  const auto s = train(c, {});
  Config other = c;
  other.model.d_ff = 256;
  other.train.steps = 4;
  TrainOptions r;
  r.resume = s.last_checkpoint;
  const auto read = [](const std::string& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  const std::string config_before = read(dir.file("config.yaml"));
  try {
    train(other, r);
    FAIL() << "expected a shape error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.mlp.gate_proj.weight"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read(dir.file("config.yaml")), config_before) << "a failed resume rewrote the run's config";
}

TEST(Trainer, IncompleteOrDamagedCheckpointIsRefused) {
  test::TempDir dir;
  const auto s = train(small_run(dir.path(), 1), {});
  TrainOptions r;
  r.resume = s.last_checkpoint;
  // Truncate the weights: the recorded size no longer matches.
  fs::resize_file(s.last_checkpoint + "/model.safetensors", 100);
  Config c = small_run(dir.path(), 2);
  EXPECT_THROW(train(c, r), UserError);
  fs::remove(s.last_checkpoint + "/trainer_state.json");
  EXPECT_THROW(train(c, r), UserError);
}

TEST(Trainer, UnwritableRunDirectoryIsAUserError) {
  Config c = small_run("/proc/tandem-cannot-write-here", 1);
  EXPECT_THROW(train(c, {}), UserError);
}

TEST(Trainer, Fp16LossScalingBacksOffOnOverflowAndSkipsTheStep) {
  test::TempDir dir;
  Config c = small_run(dir.path(), 6);
  c.train.precision = Precision::kFp16;
  c.scaler.init_scale = 1e30;  // guaranteed overflow in fp16 gradients
  c.scaler.backoff_factor = 1e-6;
  c.train.save_final = false;
  const auto s = train(c, {});
  EXPECT_GE(s.skipped_steps, 1);
  EXPECT_LT(s.skipped_steps, 6);
  std::ifstream in(dir.file("metrics.jsonl"));
  std::string line;
  std::vector<double> scales;
  while (std::getline(in, line)) scales.push_back(nlohmann::json::parse(line).at("loss_scale").get<double>());
  ASSERT_EQ(scales.size(), 6u);
  EXPECT_LT(scales.back(), 1e30);
  for (double l : s.losses) EXPECT_TRUE(std::isfinite(l));
}

TEST(Trainer, Bf16AutocastAndCheckpointingTrain) {
  test::TempDir dir;
  Config c = small_run(dir.path(), 30);
  c.train.precision = Precision::kBf16;
  c.model.checkpointing = true;
  c.train.save_final = false;
  const auto s = train(c, {});
  EXPECT_LT(mean(s.losses, 25, 30), mean(s.losses, 0, 5) - 0.5);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// `c` trained in `dir` up to step `steps`, resumed from checkpoint `from` when given.
auto train_in(Config c, const std::string& dir, int64_t steps, const std::string& from = "") {
  c.train.run_dir = dir;
  c.train.steps = steps;
  TrainOptions options;
  options.resume = from;
  return train(c, options);
}

// offload.optimizer=cpu through the whole trainer, the CPU as the device: the same losses as the
// fused optimizer, with accumulation and clipping; a bitwise resume; checkpoints of fp32 masters.
TEST(TrainerOffload, MatchesTheDefaultOptimizerAndResumesBitwise) {
  test::TempDir plain_dir, off_dir, split_dir;
  Config c = test::tiny_cpu_config(plain_dir.path(), 10);
  c.train.micro_batch = 4;
  c.train.seq_len = 32;
  c.train.grad_accum = 2;
  c.train.grad_clip = 0.5;
  const auto plain = train(c, {});
  Config o = c;
  o.train.run_dir = off_dir.path();
  o.offload.optimizer = OffloadTarget::kCpu;
  // A fixed split: auto solves from measured times, so a resumed run may choose another split and
  // round differently in the last bit (the CPU kernel and the fused device AdamW are not bitwise twins).
  o.offload.update_split = "0.5";
  const auto off = train(o, {});
  ASSERT_EQ(off.losses.size(), plain.losses.size());
  for (size_t i = 0; i < off.losses.size(); ++i)
    EXPECT_NEAR(off.losses[i], plain.losses[i], 1e-5 * std::abs(plain.losses[i])) << "step " << i + 1;

  const auto a = train_in(o, split_dir.path(), 5);
  const auto b = train_in(o, split_dir.path(), 10, a.last_checkpoint);
  ASSERT_EQ(b.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(b.losses[i], off.losses[5 + i]) << "step " << 6 + i;
  // The checkpoint holds fp32 weights (the masters), readable by the plain trainer.
  const auto p = train_in(c, split_dir.path(), 6, a.last_checkpoint);
  ASSERT_EQ(p.losses.size(), 1u);
  EXPECT_NEAR(p.losses[0], off.losses[5], 1e-5 * off.losses[5]);
}

// Ten offloaded steps with clipping at a fixed split, set as `tweak` says, and the same in two runs
// of 5 with a resume: bitwise the uninterrupted run. Then across settings: a checkpoint of
// `plain`'s run resumes into `tweak`'s (close), and `tweak`'s checkpoint into `plain` (step 6's loss
// exact: the weights are those of step 5).
void expect_offload_resumes(const std::function<void(Config&)>& tweak, const std::function<void(Config&)>& plain) {
  test::TempDir full_dir, split_dir, plain_dir;
  Config o = test::tiny_cpu_config(full_dir.path(), 10);
  o.train.micro_batch = 4;
  o.train.seq_len = 32;
  o.train.grad_clip = 0.5;
  o.offload.optimizer = OffloadTarget::kCpu;
  o.offload.update_split = "0";
  tweak(o);
  const auto full = train(o, {});
  EXPECT_LT(full.losses.back(), full.losses.front());
  const auto a = train_in(o, split_dir.path(), 5);
  const auto b = train_in(o, split_dir.path(), 10, a.last_checkpoint);
  ASSERT_EQ(b.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(b.losses[i], full.losses[5 + i]) << "step " << 6 + i;

  Config other = o;
  plain(other);
  const auto c = train_in(other, plain_dir.path(), 5);
  const auto d = train_in(o, plain_dir.path(), 6, c.last_checkpoint);
  ASSERT_EQ(d.losses.size(), 1u);
  EXPECT_NEAR(d.losses[0], full.losses[5], 1e-2 * full.losses[5]);
  const auto e = train_in(other, plain_dir.path(), 6, a.last_checkpoint);
  ASSERT_EQ(e.losses.size(), 1u);
  EXPECT_EQ(e.losses[0], full.losses[5]);
}

// optim.state_dtype=int8 through the trainer: a resume from its checkpoint is bitwise the
// uninterrupted run (the states are written decoded to fp32 and encode to the same codes), and a
// checkpoint of fp32 states resumes into 8-bit states and back.
TEST(TrainerOffload, EightBitStatesResumeBitwiseAndFromOtherStateDtypes) {
  expect_offload_resumes([](Config& c) { c.optim.state_dtype = StateDtype::kInt8; },
                         [](Config& c) { c.optim.state_dtype = StateDtype::kFp32; });
}

// optim.master_dtype=bf16 through the trainer (Note [bf16 master]), with 8-bit states: a resume
// from its checkpoint is bitwise the uninterrupted run for both roundings (the bf16 master is the
// checkpoint's weights, a Kahan master's compensation is in its optimizer state, stochastic rounding
// hashes the step), and checkpoints of an fp32 master resume into a bf16 one and back.
TEST(TrainerOffload, Bf16MastersResumeBitwiseAndFromAnFp32Master) {
  for (const auto rounding : {MasterRounding::kStochastic, MasterRounding::kKahan}) {
    SCOPED_TRACE(to_string(rounding));
    expect_offload_resumes(
        [&](Config& c) {
          c.optim.master_dtype = MasterDtype::kBf16;
          c.optim.master_rounding = rounding;
          c.optim.state_dtype = StateDtype::kInt8;
        },
        [](Config& c) {
          c.optim.master_dtype = MasterDtype::kFp32;
          c.optim.master_rounding = MasterRounding::kStochastic;
        });
  }
}

TEST(TrainerOffload, UnsupportedCombinationsAreRefusedUpFront) {
  test::TempDir dir;
  Config c = test::tiny_cpu_config(dir.path(), 2);
  c.offload.optimizer = OffloadTarget::kCpu;
  c.optim.type = OptimizerType::kLion;
  EXPECT_NE(test::error_of([&] { train(c, {}); }).find("offload.optimizer=none for sgd and lion"), std::string::npos);
  c.optim.type = OptimizerType::kAdamW;
  c.optim.state_dtype = StateDtype::kInt8;
  c.offload.optimizer = OffloadTarget::kNone;
  EXPECT_NE(test::error_of([&] { train(c, {}); }).find("optim.state_dtype=int8 keeps Adam's states"), std::string::npos);
  c.offload.optimizer = OffloadTarget::kNone;
  c.optim.state_dtype = StateDtype::kFp32;
  c.optim.master_dtype = MasterDtype::kBf16;
  EXPECT_NE(test::error_of([&] { train(c, {}); }).find("optim.master_dtype=bf16 keeps the master weights in bf16"),
            std::string::npos);
  c.optim.master_dtype = MasterDtype::kFp32;
  c.optim.master_rounding = MasterRounding::kKahan;
  EXPECT_NE(test::error_of([&] { train(c, {}); }).find("optim.master_rounding=kahan compensates a bf16 master"),
            std::string::npos);
  c.optim.master_rounding = MasterRounding::kStochastic;
  c.offload.optimizer = OffloadTarget::kCpu;
  c.offload.update_split = "1.5";
  EXPECT_NE(test::error_of([&] { train(c, {}); }).find("offload.update_split must be auto or a fraction"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem
