// `tandem inspect --partition` end to end on the tiny preset on the CPU (Note [Pipeline profile]).

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "../test_util.h"
#include "cli_run.h"

namespace tandem {
namespace {

using Result = test::CliResult;
using test::run_cli;

const std::string kTiny =
    "inspect -p tiny --device cpu --set train.micro_batch=2 --set train.seq_len=32 --set train.grad_accum=4";

TEST(PartitionCommand, PrintsTheProfileAndThePlan) {
  const Result r = run_cli(kTiny +
                           " --set model.tie_embeddings=false --set dist.pipeline_stages=2 --partition "
                           "--partition-ranks 2");
  EXPECT_EQ(r.code, 0) << r.err;
  for (const char* want :
       {"profile on cpu: micro-batch 2 x 32 tokens", "layer.3", "time/micro", "activations", "devices: cpu (speed 1.00",
        "4 micro-batches, 1f1b schedule", "memory / limit", "predicted step", "bubble"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  EXPECT_EQ(r.out.find("replicas"), std::string::npos) << "2 stages on 2 ranks: one replica\n" << r.out;
}

TEST(PartitionCommand, AutoChoosesTheCountAndAGivenCutIsEvaluated) {
  Result r = run_cli(kTiny + " --set model.tie_embeddings=false --set dist.pipeline_stages=auto --partition-ranks 2 " +
                     "--set dist.pipeline_cut=3 --partition-cpu");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("2 replicas of the pipeline"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dist.pipeline_cut=3, which the run takes instead"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("embed .. layer.1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the host CPU is the training device"), std::string::npos) << r.out;
}

TEST(PartitionCommand, RefusalsAreOneLine) {
  Result r = run_cli(kTiny + " --set dist.pipeline_stages=2 --partition --partition-ranks 2");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("set model.tie_embeddings=false"), std::string::npos) << r.err;
  r = run_cli(kTiny + " --set model.tie_embeddings=false --set dist.pipeline_stages=2 --partition");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.err.find("does not divide the 1 ranks"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tandem
