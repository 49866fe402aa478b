#pragma once
// Note [Test faults]
// The failures the tests check (a worker killed or hung after a step, a kill -9 in the middle of a
// checkpoint write, an out-of-memory error in a forward) are made to happen through one mechanism:
// named fault points, armed by the environment variable TANDEM_FAULTS for a process a test starts,
// or by a FaultScope inside a test process. Unarmed, every point is a branch on a null pointer.
//
//   TANDEM_FAULTS=kill_after_step=1:15                  rank 1 is killed (SIGKILL) after step 15
//   TANDEM_FAULTS=stop_after_step=1:3                   rank 1 is stopped (SIGSTOP): a hung rank
//   TANDEM_FAULTS=stall_after_step=1:3                  rank 1's step loop never goes on, its heartbeat
//                                                       does: a rank that never reaches a collective
//   TANDEM_FAULTS=kill_after_step=1:3,every_attempt=1   in every attempt, not the first only
//   TANDEM_FAULTS=kill_in_checkpoint=6                  killed while writing step 6's checkpoint
//   TANDEM_FAULTS=oom_above_tokens=255                  a micro-batch of more tokens fails as out of memory

#include <cstdint>
#include <memory>
#include <string>

namespace tandem {

/// The armed fault points of this process (parsed from TANDEM_FAULTS at first use).
struct Faults {
  int kill_rank = -1, stop_rank = -1, stall_rank = -1;   ///< kill_, stop_, stall_after_step: the rank ...
  int64_t kill_step = 0, stop_step = 0, stall_step = 0;  ///< ... and the step after which it fails
  bool every_attempt = false;                            ///< also in the launcher's restarted attempts
  int64_t kill_in_checkpoint = 0;                        ///< the step whose checkpoint write is cut off (0 = none)
  int64_t oom_above_tokens = 0;  ///< micro-batches of more tokens fail as out of memory (0 = none)
};

/// Parses a TANDEM_FAULTS value; UserError naming the bad entry.
Faults parse_faults(const std::string& spec);

/// The armed faults, or null when none is (the common case).
const Faults* armed_faults();

/// Kills, stops or stalls this process when armed for `rank` after `step` in attempt `restart_count`.
void fault_after_step(int rank, int64_t step, int restart_count);
/// Kills this process when armed to cut off the checkpoint of `step`.
void fault_in_checkpoint(int64_t step);
/// Whether a micro-batch of `tokens` tokens must fail as out of memory.
bool fault_oom(int64_t tokens);

/// Arms `spec` in this process until destroyed (tests of in-process code).
class FaultScope {
 public:
  explicit FaultScope(const std::string& spec);
  ~FaultScope();
  FaultScope(const FaultScope&) = delete;
  FaultScope& operator=(const FaultScope&) = delete;

 private:
  std::unique_ptr<Faults> previous_;
};

}  // namespace tandem
