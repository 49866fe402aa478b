// Note [Host fit]: a run is measured against the host's memory before anything is allocated.
#include "tandem/memory/host_fit.h"

#include <gtest/gtest.h>

#include "../test_util.h"
#include "tandem/memory/estimate.h"
#include "tandem/models/spec.h"

namespace tandem {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(HostFit, TheCpuDeviceCountsEveryRowOfTheEstimate) {
  const ModelSpec s = preset_spec("1B");
  Config c;
  c.train.micro_batch = 2;
  const HostDemand d = host_demand(s, c, 512, /*cpu_device=*/true);
  const auto e = estimate_training_memory(s, 2, 512, c.train.precision, c.model.checkpointing);
  EXPECT_EQ(d.total(), e.total());
  // On a GPU only the fp32 build is host memory.
  EXPECT_EQ(host_demand(s, c, 512, false).total(), 4 * s.num_params());
}

TEST(HostFit, RefusesWithTheNumbersAndTheFix) {
  const ModelSpec s = preset_spec("13B");
  Config c;
  const HostDemand d = host_demand(s, c, 2048, true);
  EXPECT_NO_THROW(check_host_fits(d, d.total(), s, c, true)) << "exactly enough fits";
  EXPECT_NO_THROW(check_host_fits(d, 0, s, c, true)) << "an unknown host is not checked";
  const std::string err = test::error_of([&] { check_host_fits(d, 23 * kGiB, s, c, true); });
  EXPECT_NE(err.find("on the CPU"), std::string::npos) << err;
  EXPECT_NE(err.find("23.00 GiB is available"), std::string::npos) << err;
  EXPECT_NE(err.find("AdamW states"), std::string::npos) << "the largest rows are named: " << err;
  EXPECT_NE(err.find("offload.optimizer=cpu"), std::string::npos) << err;
}

TEST(HostFit, AnOffloadPlanCountsItsHostRowsAndOnTheCpuItsDeviceRows) {
  const ModelSpec s = preset_spec("1B");
  Config c;
  c.offload.optimizer = OffloadTarget::kCpu;
  const MemoryPlan p = plan_offload_memory(s, c, 1024, 0);
  const HostDemand gpu = host_demand(p, false), cpu = host_demand(p, true);
  EXPECT_EQ(gpu.total(), p.pinned_bytes()) << "pinned rows; the transient build is not counted";
  EXPECT_EQ(cpu.total(), p.pinned_bytes() + p.gpu_bytes() - kGpuWorkspaceReserveBytes);
  // Note [NVMe tier]: states on disk are not host memory; the bounce slots are.
  c.offload.nvme_path = "/tmp/unused";
  c.offload.nvme_blocks = 4;
  const MemoryPlan n = plan_offload_memory(s, c, 1024, 0);
  EXPECT_GT(n.tier_bytes(kTierNvme), 0);
  EXPECT_LT(n.pinned_bytes(), p.pinned_bytes());
  EXPECT_EQ(host_demand(n, false).total(), n.pinned_bytes());
  EXPECT_EQ(host_demand(n, true).total(), n.pinned_bytes() + n.gpu_bytes() - kGpuWorkspaceReserveBytes);
}

TEST(HostFit, HugeSizesGiveHugeEstimatesNotOverflows) {
  ModelSpec s = preset_spec("tiny");
  const auto e = estimate_training_memory(s, int64_t{1} << 20, int64_t{1} << 24, Precision::kFp32, false);
  EXPECT_GT(e.activations, int64_t{1} << 50);
  EXPECT_GT(e.total(), 0) << "saturated, never wrapped";
  s.d_model = int64_t{1} << 21;
  EXPECT_NE(test::error_of([&] { validate_spec(s); }).find("model.d_model must be within"), std::string::npos);
  s = preset_spec("tiny");
  s.n_layer = 16000;
  s.d_model = s.d_ff = 1 << 20;
  s.n_head = 1024;
  EXPECT_NE(test::error_of([&] { validate_spec(s); }).find("more than tandem plans for"), std::string::npos);
}

TEST(HostFit, AGpuRunWhoseStatesExceedTheGpuIsRefused) {
  Config c;
  c.train.micro_batch = 8;
  const ModelSpec s = preset_spec("7B");
  EXPECT_NO_THROW(check_gpu_fit(s, c, 2048, 0));
  const std::string err = test::error_of([&] { check_gpu_fit(s, c, 2048, 80 * kGiB); });
  EXPECT_NE(err.find("set offload.optimizer=cpu"), std::string::npos) << err;
  EXPECT_NO_THROW(check_gpu_fit(preset_spec("1B"), c, 2048, 80 * kGiB));
}

TEST(HostFit, AGrossMicroBatchMisfitOnTheGpuIsRefusedWithWhatFits) {
  Config c;
  c.train.precision = Precision::kBf16;
  c.train.micro_batch = 500000;
  const std::string err = test::error_of([&] { check_gpu_fit(preset_spec("1B"), c, 2048, 80 * kGiB); });
  EXPECT_NE(err.find("train.micro_batch=500000"), std::string::npos) << err;
  EXPECT_NE(err.find("fits by the estimate"), std::string::npos) << err;
  c.train.micro_batch = 16;  // over by less than twice: the out-of-memory retry finds the size
  EXPECT_NO_THROW(check_gpu_fit(preset_spec("1B"), c, 2048, 80 * kGiB));
}

}  // namespace
}  // namespace tandem
