// Where a run executes: the device string, one process's context, and the numeric switches
// restored after a run.
#include "tandem/run/run_setup.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../test_util.h"

namespace tandem {
namespace {

TEST(RunSetup, DeviceStringsAreResolvedOrRefused) {
  EXPECT_TRUE(resolve_device("cpu").is_cpu());
  EXPECT_EQ(resolve_device("auto").is_cuda(), torch::cuda::is_available());
  EXPECT_NE(test::error_of([] {
              resolve_device("tpu");
            }).find("train.device 'tpu' is not a device; give auto, cpu, cuda or cuda:N"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { resolve_device("tpu", "dist.pipeline_devices"); }).find("dist.pipeline_devices 'tpu'"),
            std::string::npos);
  if (!torch::cuda::is_available()) {
    EXPECT_NE(test::error_of([] { resolve_device("cuda:0"); }).find("no CUDA device is visible"), std::string::npos);
  } else {
    EXPECT_NE(test::error_of([] { resolve_device("cuda:x"); }).find("is not a device"), std::string::npos);
    EXPECT_NE(test::error_of([] { resolve_device("cuda:99"); }).find("are visible"), std::string::npos);
  }
}

TEST(RunSetup, OneProcessHasNoRendezvous) {
  if (std::getenv("WORLD_SIZE") || std::getenv("SLURM_NTASKS") || std::getenv("OMPI_COMM_WORLD_SIZE"))
    GTEST_SKIP() << "started by a launcher";
  Config c;
  c.train.device.kind = DeviceSpec::Kind::kCpu;
  const RunContext ctx = open_run_context(c);
  EXPECT_TRUE(ctx.main_rank());
  EXPECT_EQ(ctx.world(), 1);
  EXPECT_EQ(ctx.comm, nullptr);
  EXPECT_EQ(ctx.device_index, -1);
  EXPECT_EQ(ctx.cpu_share, 0);
}

TEST(RunSetup, DeterministicRunsRestoreTheSwitchesTheyChanged) {
  at::Context& c = at::globalContext();
  const bool det = c.deterministicAlgorithms();
  TrainConfig t;
  t.deterministic = true;
  {
    const NumericsGuard guard(t, torch::Device(torch::kCPU));
    EXPECT_TRUE(c.deterministicAlgorithms());
  }
  EXPECT_EQ(c.deterministicAlgorithms(), det);
}

}  // namespace
}  // namespace tandem
