#pragma once
// Where a run executes, settled before anything is built: this process's rank, its device, its
// share of the host's cores, the rendezvous with the other ranks (Note [Data parallel], Note [Core
// division]), and the process-wide numeric switches (TF32, cuDNN benchmark, determinism), which
// are restored when the run ends so later runs in the process get their own.

#include <c10/core/Device.h>

#include <memory>
#include <string>

#include "tandem/core/config.h"
#include "tandem/parallel/rank_info.h"

namespace tandem {

class Comm;

/// This process's place in the run.
struct RunContext {
  RankInfo ranks;
  c10::Device device{c10::kCPU};
  int device_index = -1;       ///< the CUDA device's index; -1 on the CPU
  std::unique_ptr<Comm> comm;  ///< null for one process
  int cpu_share = 0;           ///< CPUs of this rank's share when the host's are divided; 0 = not divided
  std::string cpu_how;         ///< how the share was chosen (for the log)

  RunContext();
  RunContext(RunContext&&) noexcept;
  ~RunContext();
  bool main_rank() const { return ranks.rank == 0; }
  int world() const { return ranks.world_size; }
};

/// A device setting (core/device_spec.h): auto (the first GPU, else the CPU), cpu, cuda or cuda:N;
/// UserError naming `what` (the key it came from) otherwise, or for a GPU this machine lacks.
c10::Device resolve_device(const DeviceSpec& d, const std::string& what = "train.device");
/// As above, from a device as written (a command's --device flag).
c10::Device resolve_device(const std::string& s, const std::string& what = "train.device");

/// Rank (from the launcher's environment), device (the launcher's slot or the local rank's GPU),
/// core share (bound before any thread starts) and the rendezvous; ranks started with different
/// configs are refused here.
RunContext open_run_context(const Config& cfg);
/// The device this rank trains on, as open_run_context picks it: train.device (or its pipeline
/// stage's of dist.pipeline_devices), a CUDA device at the launcher's GPU slot for this rank.
c10::Device run_device(const Config& cfg, const RankInfo& ranks);

/// The process-wide numeric switches of a run, set on construction and restored on destruction.
class NumericsGuard {
 public:
  NumericsGuard(const TrainConfig& train, const c10::Device& device);
  ~NumericsGuard();
  NumericsGuard(const NumericsGuard&) = delete;
  NumericsGuard& operator=(const NumericsGuard&) = delete;

 private:
  struct Saved;
  std::unique_ptr<Saved> saved_;
};

}  // namespace tandem
