#include "tandem/run/run_setup.h"

#include <sched.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <vector>

#include "tandem/core/cpu_topology.h"
#include "tandem/core/device_spec.h"
#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/parallel/comm.h"

namespace tandem {

RunContext::RunContext() = default;
RunContext::RunContext(RunContext&&) noexcept = default;
RunContext::~RunContext() = default;

c10::Device resolve_device(const DeviceSpec& d, const std::string& what) {
  if (d.kind == DeviceSpec::Kind::kAuto)
    return torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  if (d.kind == DeviceSpec::Kind::kCpu) return torch::Device(torch::kCPU);
  TANDEM_CHECK(torch::cuda::is_available(), what, "=", d.str(),
               " but no CUDA device is visible (or this build has no CUDA); use cpu or auto");
  const int n = static_cast<int>(torch::cuda::device_count());
  const int index = std::max(d.index, 0);
  TANDEM_CHECK(index < n, what, "=", d.str(), " but only ", n, " CUDA device(s) are visible");
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

c10::Device resolve_device(const std::string& s, const std::string& what) {
  return resolve_device(DeviceSpec::parse(s, what), what);
}

namespace {

// This rank's device setting: its pipeline stage's from dist.pipeline_devices (Note [Pipeline
// parallel]; each name is taken as written), else train.device.
DeviceSpec device_setting(const Config& cfg, const RankInfo& ranks) {
  if (cfg.dist.pipeline_devices.empty()) return cfg.train.device;
  const std::vector<DeviceSpec>& devices = cfg.dist.pipeline_devices.devices;
  const int64_t stages = pipeline_stage_count(cfg.dist);
  TANDEM_CHECK(stages >= 1 && static_cast<int64_t>(devices.size()) == stages, "dist.pipeline_devices='",
               cfg.dist.pipeline_devices.str(), "' names ", devices.size(),
               " devices for dist.pipeline_stages=", cfg.dist.pipeline_stages,
               "; give one device per stage and a stage count");
  TANDEM_CHECK(ranks.world_size % stages == 0, "dist.pipeline_stages=", stages, " does not divide the world of ",
               ranks.world_size, " ranks; start a multiple of ", stages, " ranks");
  return devices[static_cast<size_t>(ranks.rank / (ranks.world_size / stages))];
}

}  // namespace

c10::Device run_device(const Config& cfg, const RankInfo& ranks) {
  const bool stage_devices = !cfg.dist.pipeline_devices.empty();
  const c10::Device device =
      resolve_device(device_setting(cfg, ranks), stage_devices ? "dist.pipeline_devices" : "train.device");
  // A launcher's device slot counts even for one process (a run gone on with fewer workers).
  if ((ranks.distributed() || ranks.device_index >= 0) && device.is_cuda() && !stage_devices) {
    const int n = static_cast<int>(torch::cuda::device_count());
    TANDEM_CHECK(ranks.gpu() < n, "rank ", ranks.rank, " would train on GPU ", ranks.gpu(), " but only ", n,
                 " are visible; start at most ", n, " processes per node");
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(ranks.gpu()));
  }
  return device;
}

RunContext open_run_context(const Config& cfg) {
  RunContext ctx;
  ctx.ranks = discover_rank();
  const RankInfo& ranks = ctx.ranks;
  ctx.device = run_device(cfg, ranks);
  ctx.device_index = ctx.device.is_cuda() ? ctx.device.index() : -1;
  if (ranks.local_world_size > 1) {
    // The local ranks split the cores they all may use into disjoint shares (Note [Core division])
    // before any thread starts (every later thread inherits the mask): the CPU updates of two
    // ranks never share a core.
    const std::vector<int> cpus = rank_cpus(ranks.local_rank, ranks.local_world_size, &ctx.cpu_how);
    if (!cpus.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      for (const int c : cpus) CPU_SET(c, &set);
      if (sched_setaffinity(0, sizeof set, &set) == 0) ctx.cpu_share = static_cast<int>(cpus.size());
    }
  }
  if (!ranks.distributed()) return ctx;
  CommOptions co;
  co.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.dist.timeout_s * 1e3));
  // Stages on the host and on GPUs meet through Gloo (host memory).
  const bool host_stage = cfg.dist.pipeline_devices.any_cpu();
  co.nccl = ctx.device.is_cuda() && cfg.dist.backend != DistBackend::kGloo && !host_stage;
  TANDEM_CHECK(!(cfg.dist.backend == DistBackend::kNccl && !ctx.device.is_cuda()),
               "dist.backend=nccl needs GPUs; this run is on ", ctx.device.str(), ": set dist.backend=auto or gloo");
  co.cuda_device = ctx.device_index;
  co.heartbeat_s = cfg.dist.heartbeat_s;
  co.heartbeat_timeout_s = cfg.dist.heartbeat_timeout_s;
  ctx.comm = std::make_unique<Comm>(ranks, co);
  ctx.comm->check_same("configurations", config_hash(cfg),
                       "start every rank with the same config files, --set options and preset");
  log::info(strprintf("rank %d of %d (%s; local %d of %d) on %s | %s | rendezvous %s:%d%s", ranks.rank,
                      ranks.world_size, ranks.source.c_str(), ranks.local_rank, ranks.local_world_size,
                      ctx.device.str().c_str(), co.nccl ? "NCCL" : "Gloo", ranks.master_addr.c_str(), ranks.master_port,
                      ranks.restart_count ? strprintf(" | restart %d", ranks.restart_count).c_str() : ""));
  if (ctx.cpu_share > 0) log::info(strprintf("rank %d: CPU share %s", ranks.rank, ctx.cpu_how.c_str()));
  return ctx;
}

struct NumericsGuard::Saved {
  at::Context& c = at::globalContext();
  bool det = c.deterministicAlgorithms(), warn = c.deterministicAlgorithmsWarnOnly();
  bool flash = c.userEnabledFlashSDP(), mem = c.userEnabledMemEfficientSDP(), cudnn = c.userEnabledCuDNNSDP(),
       math = c.userEnabledMathSDP();
};

NumericsGuard::NumericsGuard(const TrainConfig& train, const c10::Device& device) {
  if (device.is_cuda()) {
    at::globalContext().setFloat32MatmulPrecision(train.tf32 ? "high" : "highest");
    at::globalContext().setAllowTF32CuDNN(train.tf32);
    at::globalContext().setBenchmarkCuDNN(train.cudnn_benchmark && !train.deterministic);
  }
  saved_ = std::make_unique<Saved>();
  if (!train.deterministic) return;
  // cuBLAS needs a fixed workspace layout for reproducible reductions; read at its first handle.
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  // The fused attention kernels accumulate dQ with atomics in their backward, which the flag
  // does not change (only warns, once): the reference path is two matmuls and a softmax, whose
  // B x H x T x T scores the memory estimate does not count (deterministic runs are for checks).
  if (device.is_cuda()) {
    at::globalContext().setSDPUseFlash(false);
    at::globalContext().setSDPUseMemEfficient(false);
    at::globalContext().setSDPUseCuDNN(false);
    at::globalContext().setSDPUseMath(true);
  }
}

NumericsGuard::~NumericsGuard() {
  Saved& s = *saved_;
  s.c.setDeterministicAlgorithms(s.det, s.warn);
  s.c.setSDPUseFlash(s.flash);
  s.c.setSDPUseMemEfficient(s.mem);
  s.c.setSDPUseCuDNN(s.cudnn);
  s.c.setSDPUseMath(s.math);
}

}  // namespace tandem
