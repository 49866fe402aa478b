// Pipeline parallel (Note [Pipeline parallel], Note [Pipeline schedules], Note [Pipeline
// checkpoints]): stages in several processes on loopback with Gloo, started by `tandem launch`,
// against one process with the same global batch.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>

#include "../test_util.h"
#include "dist_runs.h"
#include "tandem/sched/pipeline_schedule.h"

namespace tandem::test {
namespace {

// The tiny preset with its own head (a tied embedding cannot be split over stages), 4 micro-batches.
const std::string kBase = "--set model.tie_embeddings=false --set train.grad_accum=4 ";

// 20 steps, fp32: every layout's losses equal one process's within 1e-6 relative.
TEST(Pipeline, StagesEqualOneProcessForEverySchedule) {
  TempDir tmp;
  for (const std::string offload : {"", "--set offload.optimizer=cpu"}) {
    const std::string one = tmp.file("one" + std::to_string(offload.size()));
    const Result r1 = train_one(one, 20, kBase + "--set train.micro_batch=4 " + offload);
    ASSERT_EQ(r1.code, 0) << r1.out;
    struct Layout {
      int procs;
      std::string args;
    };
    std::vector<Layout> layouts = {{2, "--set dist.pipeline_stages=2 --set dist.pipeline_schedule=1f1b"},
                                   {4, "--set dist.pipeline_stages=4 --set dist.pipeline_schedule=gpipe"}};
    if (!offload.empty())  // every decoder Block of each stage on the device side: stages of unequal sizes split apart
      layouts.push_back(
          {4, "--set dist.pipeline_stages=4 --set dist.pipeline_schedule=1f1b --set offload.update_split=1"});
    if (offload.empty()) {
      layouts.push_back({2, "--set dist.pipeline_stages=2 --set dist.pipeline_schedule=gpipe"});
      layouts.push_back(
          {4, "--set dist.pipeline_stages=4 --set dist.pipeline_schedule=1f1b --set dist.pipeline_cut=1,2,5"});
    }
    int k = 0;
    for (const auto& l : layouts) {
      SCOPED_TRACE(l.args + " " + offload);
      const std::string dir = tmp.file("pp" + std::to_string(k) + "_" + std::to_string(offload.size()));
      const Result r =
          launch(l.procs, port(k++), dir, 20, kBase + "--set train.micro_batch=4 " + l.args + " " + offload);
      ASSERT_EQ(r.code, 0) << r.out;
      EXPECT_NE(r.out.find("stage 1 of"), std::string::npos) << r.out;
      expect_same_losses(losses(one), losses(dir), 1e-6);
    }
  }
}

// MoE layers on both stages (amx-moe-tiny: embedding, 2 dense, 2 MoE layers, head; cut after the
// first MoE layer): each stage's share of the balance loss trains its experts and joins the loss,
// in training and in evaluation, as in one process.
TEST(Pipeline, ExpertBalanceLossesSpanTheStages) {
  TempDir tmp;
  const std::string moe =
      "--set model.preset=amx-moe-tiny --set model.tie_embeddings=false --set train.grad_accum=2 "
      "--set train.micro_batch=4 --set train.eval_every=5 --set train.eval_batches=2 ";
  const Result r1 = train_one(tmp.file("one"), 10, moe);
  ASSERT_EQ(r1.code, 0) << r1.out;
  const Result r =
      launch(2, port(0), tmp.file("pp"), 10, moe + "--set dist.pipeline_stages=2 --set dist.pipeline_cut=4");
  ASSERT_EQ(r.code, 0) << r.out;
  expect_same_losses(losses(tmp.file("one")), losses(tmp.file("pp")), 1e-6);
  expect_same_losses(metric(tmp.file("one"), "eval_loss"), metric(tmp.file("pp"), "eval_loss"), 1e-6);
}

// 2 stages x 2 replicas (2 rows each) against one process with 4 rows.
TEST(Pipeline, StagesTimesReplicasEqualOneProcess) {
  TempDir tmp;
  const Result r1 = train_one(tmp.file("one"), 20, kBase + "--set train.micro_batch=4");
  ASSERT_EQ(r1.code, 0) << r1.out;
  const Result r =
      launch(4, port(0), tmp.file("grid"), 20, kBase + "--set train.micro_batch=2 --set dist.pipeline_stages=2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("replica 1 of 2"), std::string::npos) << r.out;
  expect_same_losses(losses(tmp.file("one")), losses(tmp.file("grid")), 1e-6);
}

// ZeRO-2 within each stage's replicas (offload, 2 stages x 2 replicas): each rank holds half its
// stage's masters and states; the run equals one process, and its sharded checkpoint resumes
// without stages at dp = 2, sharded again, equal to the uninterrupted run.
TEST(Pipeline, ShardedOffloadWithinEachStage) {
  TempDir tmp;
  const std::string offload = "--set offload.optimizer=cpu --set dist.zero_stage=2 ";
  const Result r1 = train_one(tmp.file("one"), 12, kBase + "--set train.micro_batch=4 --set offload.optimizer=cpu");
  ASSERT_EQ(r1.code, 0) << r1.out;
  const Result r = launch(4, port(0), tmp.file("grid"), 12,
                          kBase + offload +
                              "--set train.micro_batch=2 --set dist.pipeline_stages=2 "
                              "--set dist.pipeline_cut=even --set train.checkpoint_every=6");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("replica 1 of 2"), std::string::npos) << r.out;
  expect_same_losses(losses(tmp.file("one")), losses(tmp.file("grid")), 1e-6);
  auto want = losses(tmp.file("grid"));
  for (int64_t s = 1; s <= 6; ++s) want.erase(s);
  const Result dp =
      launch(2, port(1), tmp.file("dp"), 12,
             kBase + offload + "--set train.micro_batch=2 --resume " + tmp.file("grid/checkpoints/step_00000006"));
  ASSERT_EQ(dp.code, 0) << dp.out;
  expect_same_losses(want, losses(tmp.file("dp")), 1e-6);
}

// A checkpoint of 2 stages resumes in one process, in 2 replicas without stages, and in 4 stages,
// each equal to the uninterrupted run.
TEST(Pipeline, ACheckpointOfTwoStagesResumesInAnyLayout) {
  TempDir tmp;
  const Result r2 =
      launch(2, port(0), tmp.file("two"), 12,
             kBase + "--set train.micro_batch=4 --set dist.pipeline_stages=2 --set train.checkpoint_every=6");
  ASSERT_EQ(r2.code, 0) << r2.out;
  const std::string ckpt = " --resume " + tmp.file("two/checkpoints/step_00000006");
  auto want = losses(tmp.file("two"));
  for (int64_t s = 1; s <= 6; ++s) want.erase(s);
  const Result one = train_one(tmp.file("one"), 12, kBase + "--set train.micro_batch=4" + ckpt);
  ASSERT_EQ(one.code, 0) << one.out;
  expect_same_losses(want, losses(tmp.file("one")), 1e-6);
  const Result dp = launch(2, port(1), tmp.file("dp"), 12, kBase + "--set train.micro_batch=2" + ckpt);
  ASSERT_EQ(dp.code, 0) << dp.out;
  expect_same_losses(want, losses(tmp.file("dp")), 1e-6);
  const Result four =
      launch(4, port(2), tmp.file("four"), 12, kBase + "--set train.micro_batch=4 --set dist.pipeline_stages=4" + ckpt);
  ASSERT_EQ(four.code, 0) << four.out;
  expect_same_losses(want, losses(tmp.file("four")), 1e-6);
}

// Per step after the second: the measured bubble, and what it adds to the schedule's own for the
// step's measured stage times (pipeline_bubble_schedule: the stages' imbalance counted, the time
// spent in sends, receives and stalls not). The medians of both.
struct Bubble {
  double measured = -1, excess = -1;
};
Bubble median_bubble(const std::string& dir) {
  std::vector<double> v, excess;
  const auto schedule = metric(dir, "pipeline_bubble_schedule");
  for (const auto& [step, bubble] : metric(dir, "pipeline_bubble"))
    if (step > 2 && schedule.count(step)) {
      v.push_back(bubble);
      excess.push_back(bubble - schedule.at(step));
    }
  if (v.empty()) return {};
  const auto median = [](std::vector<double>& x) {
    std::nth_element(x.begin(), x.begin() + x.size() / 2, x.end());
    return x[x.size() / 2];
  };
  return {median(v), median(excess)};
}

// Note [Pipeline trace]: step 4 drawn with one named track per stage and its 2m passes, each
// starting no earlier than the step's first and ending after it starts.
void expect_stage_tracks(const std::string& path, int stages, int64_t m) {
  const auto trace = nlohmann::json::parse(read_text(path));
  std::map<int, int> spans;
  std::map<int, std::string> names;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") names[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
    if (e["ph"] != "X") continue;
    ++spans[e["tid"].get<int>()];
    EXPECT_GE(e["ts"].get<double>(), 0.0);
    EXPECT_GE(e["dur"].get<double>(), 0.0);
  }
  ASSERT_EQ(static_cast<int>(names.size()), stages) << path;
  for (int s = 0; s < stages; ++s) {
    EXPECT_EQ(names[s].rfind("stage " + std::to_string(s) + ": Blocks", 0), 0u) << names[s];
    EXPECT_EQ(spans[s], 2 * m) << "stage " << s;
  }
}

TEST(Pipeline, TheMeasuredBubbleIsOneFOneBs) {
  TempDir tmp;
  // The mlp preset: MLP layers; 6 Blocks cut 3 | 3 (embedding + 2 layers, 2 layers + head: the
  // second stage is about a tenth slower, which pipeline_bubble_schedule counts).
  const std::string args =
      "--set model.preset=mlp --set model.tie_embeddings=false --set train.seq_len=128 --set train.micro_batch=8 "
      "--set dist.pipeline_stages=2 --set dist.pipeline_cut=even --set dist.pipeline_schedule=1f1b";
  Bubble measured[2];
  int k = 0;
  for (const int64_t m : {2, 8}) {
    const std::string dir = tmp.file("m" + std::to_string(m));
    const Result r = launch(2, port(k), dir, 12, args + " --set train.grad_accum=" + std::to_string(m));
    ASSERT_EQ(r.code, 0) << r.out;
    measured[k] = median_bubble(dir);
    // The schedule's bubble for the measured stage times, plus at most 0.1 for the 2m sends and
    // receives of a step and for the neighbour that loses its core (CI's two cores run the stages
    // and the launcher). Serial stages (no overlap) would measure 0.5 at any m: 0.35 above it at m = 8.
    EXPECT_GT(measured[k].excess, -0.08) << "m = " << m;
    EXPECT_LT(measured[k].excess, 0.1) << "m = " << m;
    EXPECT_NEAR(measured[k].measured, pipeline_bubble(2, m), 0.15) << "m = " << m;
    expect_stage_tracks(dir + "/pipeline_trace.json", 2, m);
    ++k;
  }
  EXPECT_GT(measured[0].measured, measured[1].measured + 0.1);
}

// A stage killed mid-run: the launcher restarts every rank from the newest checkpoint and the run
// ends as the uninterrupted one, bit for bit. The cut is fixed: the partitioner's comes from measured
// times, so on a loaded machine the clean run, the killed one and its restart could cut elsewhere
// (the same function, other rounding).
TEST(Pipeline, AKilledStageIsRestartedFromTheNewestCheckpoint) {
  TempDir tmp;
  const std::string args = kBase +
                           "--set train.micro_batch=4 --set dist.pipeline_stages=2 --set dist.pipeline_cut=even "
                           "--set train.checkpoint_every=5";
  const Result clean = launch(2, port(0), tmp.file("clean"), 15, args);
  ASSERT_EQ(clean.code, 0) << clean.out;
  const Result killed = launch(2, port(1), tmp.file("killed"), 15, args + " --resume auto", "--max-restarts 1",
                               "TANDEM_FAULTS=kill_after_step=1:8");
  ASSERT_EQ(killed.code, 0) << killed.out;
  EXPECT_NE(killed.out.find("restart 1 of 1"), std::string::npos) << killed.out;
  expect_same_losses(losses(tmp.file("clean")), losses(tmp.file("killed")), 0.0);
}

// The partitioner in a run: rank 0 profiles the Blocks and plans over every rank's device, logs the
// plan, and every rank takes its cut. With a stage count it cuts that many stages and the report
// sets the predicted step against the measured one; with auto it may choose stages or replicas, and
// either run equals one process with the same global batch. In one process auto is one stage.
TEST(Pipeline, ThePartitionersCutRunsAndEqualsOneProcess) {
  TempDir tmp;
  const std::string args = kBase + "--set train.micro_batch=4 ";
  const Result two = launch(2, port(0), tmp.file("two"), 10, args + "--set dist.pipeline_stages=2");
  ASSERT_EQ(two.code, 0) << two.out;
  EXPECT_NE(two.out.find("pipeline partition (dist.pipeline_stages=2)"), std::string::npos) << two.out;
  EXPECT_NE(two.out.find("pipeline: step predicted"), std::string::npos) << two.out;
  const Result one4 = train_one(tmp.file("one4"), 10, args);
  ASSERT_EQ(one4.code, 0) << one4.out;
  expect_same_losses(losses(tmp.file("one4")), losses(tmp.file("two")), 1e-6);

  const Result any = launch(2, port(1), tmp.file("auto"), 10, args + "--set dist.pipeline_stages=auto");
  ASSERT_EQ(any.code, 0) << any.out;
  EXPECT_NE(any.out.find("pipeline partition (dist.pipeline_stages=auto)"), std::string::npos) << any.out;
  const bool stages = any.out.find("stage 1 of 2") != std::string::npos;
  const std::string same_batch = stages ? "one4" : "one8";  // 2 replicas of 4 rows each
  if (!stages) {
    ASSERT_EQ(train_one(tmp.file("one8"), 10, kBase + "--set train.micro_batch=8").code, 0);
  }
  expect_same_losses(losses(tmp.file(same_batch)), losses(tmp.file("auto")), 1e-6);

  const Result single = train_one(tmp.file("single"), 2, args + "--set dist.pipeline_stages=auto");
  ASSERT_EQ(single.code, 0) << single.out;
  EXPECT_NE(single.out.find("dist.pipeline_stages=auto: one stage (one process)"), std::string::npos) << single.out;
}

// Note [Stalled ranks]: a stage whose step loop stops leaves its neighbour waiting on the stage
// link; the neighbour ends the run after dist.timeout_s naming the micro-batch, the rank and the link.
TEST(Pipeline, AStalledStageEndsTheRunNamingTheWaitOnTheLink) {
  TempDir tmp;
  const Result r = launch(2, port(0), tmp.file("stall"), 200,
                          kBase +
                              "--set train.micro_batch=4 --set dist.pipeline_stages=2 --set dist.pipeline_cut=even "
                              "--set dist.heartbeat_s=0.5 --set dist.timeout_s=4",
                          "--stop-grace 1", "TANDEM_FAULTS=stall_after_step=1:3");
  EXPECT_EQ(r.code, 75) << r.out;
  EXPECT_NE(r.out.find("rank 0: waited"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gradient from rank 1 (stage 1) over the stage link"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("internal error"), std::string::npos) << r.out;
}

TEST(Pipeline, BadLayoutsAreRefusedWithTheFix) {
  TempDir tmp;
  struct Case {
    int procs;
    std::string args, says;
  };
  const std::vector<Case> cases = {
      {1, "--set dist.pipeline_stages=2", "needs 2 processes or more"},
      {3, "--set dist.pipeline_stages=2", "does not divide the world of 3"},
      {2, "--set dist.pipeline_stages=2 --set dist.pipeline_cut=7", "must rise strictly"},
      {2, "--set dist.pipeline_stages=2 --set model.tie_embeddings=true", "set model.tie_embeddings=false"},
      {2, "--set dist.pipeline_stages=2 --set dist.balance=auto", "set dist.balance=equal"},
      {2, "--set dist.pipeline_stages=x", "dist.pipeline_stages must be auto or a stage count"},
      {2, "--set dist.pipeline_stages=auto --set dist.pipeline_cut=even", "dist.pipeline_cut=even needs a stage count"},
  };
  int k = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const std::string dir = tmp.file("bad" + std::to_string(k));
    const std::string common = "--set model.tie_embeddings=false --set train.micro_batch=2 " + c.args;
    const Result r = c.procs == 1 ? train_one(dir, 2, common) : launch(c.procs, port(k), dir, 2, common);
    ++k;
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("internal error"), std::string::npos) << r.out;
  }
  // More stages than Blocks (the tiny preset has 6).
  const Result many = launch(8, port(k), tmp.file("many"), 2,
                             "--set model.tie_embeddings=false --set train.micro_batch=2 "
                             "--set dist.pipeline_stages=8");
  EXPECT_EQ(many.code, 2) << many.out;
  EXPECT_NE(many.out.find("more stages than the model's 6 Blocks"), std::string::npos) << many.out;
}

}  // namespace
}  // namespace tandem::test

namespace tandem::test {
namespace {

// On two GPUs (NCCL, Note [Stage links]): the arguments of a CUDA run, fp32 without TF32 (whose
// rounding depends on the matmul shapes) and with deterministic kernels, so the stages differ from
// one GPU only in the order of the gradient sums.
std::string on_gpus(const std::string& dir, int steps, const std::string& extra) {
  std::string a = train_args(dir, steps,
                             "--set model.n_layer=4 --set model.d_model=256 --set train.deterministic=true "
                             "--set train.tf32=false " +
                                 extra);
  return a.replace(a.find("--device cpu"), 12, "--device cuda");
}

Result train_one_gpu(const std::string& dir, int steps, const std::string& extra) {
  return sh("NCCL_NVLS_ENABLE=0 " + cli_path() + " train " + on_gpus(dir, steps, extra), dir + ".log");
}

Result launch_gpus(int p, const std::string& dir, int steps, const std::string& extra, const std::string& launcher = "",
                   const std::string& env = "", int procs = 2) {
  return sh("env NCCL_NVLS_ENABLE=0 " + env + " " + cli_path() + " launch --nproc-per-node " + std::to_string(procs) +
                " --master-port " +
                std::to_string(p) + " " + launcher + " -- " + cli_path() + " train " + on_gpus(dir, steps, extra),
            dir + ".log");
}

// GPipe and 1F1B, with and without the offload engine: 2 stages on 2 GPUs equal one GPU with the
// same global batch within 1e-5 relative (the hang this replaces: 1F1B over one NCCL group).
TEST(PipelineGpu, TwoGpuStagesEqualOneGpuForEverySchedule) {
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  TempDir tmp;
  int k = 0;
  for (const std::string offload : {"", "--set offload.optimizer=cpu"}) {
    const std::string one = tmp.file("one" + std::to_string(k));
    const Result r1 = train_one_gpu(one, 20, kBase + "--set train.micro_batch=4 " + offload);
    ASSERT_EQ(r1.code, 0) << r1.out;
    for (const std::string schedule : {"1f1b", "gpipe"}) {
      SCOPED_TRACE(schedule + " " + offload);
      const std::string dir = tmp.file("pp" + std::to_string(k++));
      const Result r = launch_gpus(port(k), dir, 20,
                                   kBase + "--set train.micro_batch=4 --set dist.pipeline_stages=2 "
                                           "--set dist.pipeline_schedule=" +
                                       schedule + " " + offload);
      ASSERT_EQ(r.code, 0) << r.out;
      EXPECT_NE(r.out.find("NCCL"), std::string::npos) << r.out;
      EXPECT_NE(r.out.find("stage 1 of 2"), std::string::npos) << r.out;
      expect_same_losses(losses(one), losses(dir), 1e-5);
    }
  }
}

// bf16 (no deterministic kernels): the stages' losses against one GPU's, beside two one-GPU runs'
// own difference (the run-to-run noise); both printed for docs/benchmarks.md.
TEST(PipelineGpu, Bf16StagesStayWithinTheRunToRunNoise) {
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  TempDir tmp;
  const std::string bf16 = kBase + "--set train.micro_batch=4 --set train.precision=bf16 --set train.deterministic=false ";
  ASSERT_EQ(train_one_gpu(tmp.file("a"), 20, bf16).code, 0);
  ASSERT_EQ(train_one_gpu(tmp.file("b"), 20, bf16).code, 0);
  const Result r = launch_gpus(port(0), tmp.file("pp"), 20, bf16 + "--set dist.pipeline_stages=2");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto worst = [](const std::map<int64_t, double>& x, const std::map<int64_t, double>& y) {
    double w = 0;
    for (const auto& [step, v] : x) w = std::max(w, std::abs(v - y.at(step)) / std::abs(v));
    return w;
  };
  const auto a = losses(tmp.file("a")), b = losses(tmp.file("b")), pp = losses(tmp.file("pp"));
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(pp.size(), 20u);
  const double noise = worst(a, b), stages = worst(a, pp);
  std::printf("bf16, 20 steps: one GPU run to run %.3g relative at most; 2 stages against one GPU %.3g\n", noise,
              stages);
  EXPECT_LE(stages, std::max(4 * noise, 5e-3));
}

// pp x dp on 4 GPUs: 2 stages x 2 replicas of 2 rows against one GPU with 4 rows, fp32, within 1e-5
// relative; then the offload engine with ZeRO-2 within each stage's replicas (each rank holds half
// its stage's masters and Adam states), against one GPU through the offload engine.
TEST(PipelineGpu, StagesTimesReplicasOnFourGpusEqualOneGpu) {
  if (torch::cuda::device_count() < 4) GTEST_SKIP() << "needs 4 GPUs";
  TempDir tmp;
  int k = 0;
  for (const std::string offload : {"", "--set offload.optimizer=cpu "}) {
    SCOPED_TRACE(offload);
    const std::string one = tmp.file("one" + std::to_string(k));
    const Result r1 = train_one_gpu(one, 16, kBase + "--set train.micro_batch=4 " + offload);
    ASSERT_EQ(r1.code, 0) << r1.out;
    const std::string zero = offload.empty() ? "" : "--set dist.zero_stage=2 ";
    const std::string dir = tmp.file("grid" + std::to_string(k));
    const Result r = launch_gpus(port(k), dir, 16,
                                 kBase + "--set train.micro_batch=2 --set dist.pipeline_stages=2 "
                                         "--set dist.pipeline_cut=even " +
                                     offload + zero,
                                 "", "", 4);
    ++k;
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("NCCL"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("replica 1 of 2"), std::string::npos) << r.out;
    expect_same_losses(losses(one), losses(dir), 1e-5);
  }
}

// A pipeline checkpoint on 2 GPUs resumes (as 2 stages again) into the uninterrupted run.
TEST(PipelineGpu, ACheckpointOfTwoGpuStagesResumes) {
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  TempDir tmp;
  const std::string args = kBase + "--set train.micro_batch=4 --set dist.pipeline_stages=2 --set dist.pipeline_cut=even ";
  const Result clean = launch_gpus(port(0), tmp.file("clean"), 12, args + "--set train.checkpoint_every=6");
  ASSERT_EQ(clean.code, 0) << clean.out;
  const Result resumed =
      launch_gpus(port(1), tmp.file("resumed"), 12, args + "--resume " + tmp.file("clean/checkpoints/step_00000006"));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
  auto want = losses(tmp.file("clean"));
  for (int64_t s = 1; s <= 6; ++s) want.erase(s);
  expect_same_losses(want, losses(tmp.file("resumed")), 1e-6);
}

// kill -9 of one rank of a 2-GPU pipeline under --max-restarts 1 --resume auto: the launcher restarts
// both from the newest checkpoint and the run ends as the uninterrupted one.
TEST(PipelineGpu, AKilledGpuStageIsRestartedFromTheNewestCheckpoint) {
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  TempDir tmp;
  const std::string args = kBase +
                           "--set train.micro_batch=4 --set dist.pipeline_stages=2 --set dist.pipeline_cut=even "
                           "--set train.checkpoint_every=5 --set offload.optimizer=cpu ";
  const Result clean = launch_gpus(port(0), tmp.file("clean"), 15, args);
  ASSERT_EQ(clean.code, 0) << clean.out;
  const Result killed = launch_gpus(port(1), tmp.file("killed"), 15, args + "--resume auto", "--max-restarts 1",
                                    "TANDEM_FAULTS=kill_after_step=1:8");
  ASSERT_EQ(killed.code, 0) << killed.out;
  EXPECT_NE(killed.out.find("rank 1 was killed by signal 9"), std::string::npos) << killed.out;
  EXPECT_NE(killed.out.find("restart 1 of 1"), std::string::npos) << killed.out;
  EXPECT_NE(killed.out.find("resumed from"), std::string::npos) << killed.out;
  expect_same_losses(losses(tmp.file("clean")), losses(tmp.file("killed")), 1e-6);
}

// A hung rank (stopped: its heartbeat too) and a stalled one (its step loop stops, its heartbeat goes
// on) on 2 GPUs: one line naming the rank and the wait, exit 75, never NCCL's watchdog and its traces.
TEST(PipelineGpu, AHungOrStalledGpuRankEndsTheRunWithOneLine) {
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  TempDir tmp;
  const std::string args = kBase + "--set train.micro_batch=4 --set dist.pipeline_stages=2 --set dist.pipeline_cut=even ";
  const Result hung = launch_gpus(port(0), tmp.file("hung"), 400,
                                  args + "--set dist.heartbeat_s=0.5 --set dist.heartbeat_timeout_s=4", "--stop-grace 2",
                                  "TANDEM_FAULTS=stop_after_step=1:3");
  EXPECT_EQ(hung.code, 75) << hung.out;
  EXPECT_NE(hung.out.find("rank 1 has not sent a heartbeat"), std::string::npos) << hung.out;
  EXPECT_NE(hung.out.find("(this rank waited"), std::string::npos) << hung.out;
  const Result stalled = launch_gpus(port(1), tmp.file("stalled"), 400,
                                     args + "--set dist.heartbeat_s=0.5 --set dist.timeout_s=6", "--stop-grace 2",
                                     "TANDEM_FAULTS=stall_after_step=1:3");
  EXPECT_EQ(stalled.code, 75) << stalled.out;
  EXPECT_NE(stalled.out.find("rank 0: waited"), std::string::npos) << stalled.out;
  EXPECT_NE(stalled.out.find("from rank 1 (stage 1) over the stage link"), std::string::npos) << stalled.out;
  for (const auto* r : {&hung, &stalled}) {
    EXPECT_EQ(r->out.find("Watchdog"), std::string::npos) << r->out;
    EXPECT_EQ(r->out.find("WorkNCCL"), std::string::npos) << r->out;
    EXPECT_EQ(r->out.find("internal error"), std::string::npos) << r->out;
  }
}

}  // namespace
}  // namespace tandem::test
