#pragma once
// Note [Step time split]
// Where a step's time goes, measured every step at no synchronisation cost: marks on the compute
// stream (timing events on a GPU, the host clock on the CPU) after each micro-batch's forward
// (with its loss) and backward, and after the update (norm, clipping, the GPU-updated Blocks'
// AdamW). The trainer reads them after the step's one host synchronisation, when every mark has
// completed. Forward, backward and update are the compute stream's spans between marks, so they
// include the stream's own waits (an offloaded Block's forward waits for its weights); idle is the
// step's wall time less those spans (launch latency, data loading, the host synchronisation).
// The offload engine's transfers and CPU update run beside them on other streams and threads:
// they are reported as overlapped times, not parts of the whole.

#include <c10/core/Device.h>

#include <memory>
#include <vector>

namespace c10 {
class Event;
}

namespace tandem {

struct StepPhases {
  double forward_s = 0, backward_s = 0, update_s = 0, idle_s = 0;
};

class StepTimer {
 public:
  enum class Phase { kForward, kBackward, kUpdate };
  explicit StepTimer(c10::Device device);
  ~StepTimer();
  /// At the step's start, before anything of it is queued.
  void begin();
  /// The end of a phase that began at the previous mark.
  void mark(Phase ended);
  /// After the step's host synchronisation: the spans, and idle = wall_s - their sum (>= 0).
  StepPhases read(double wall_s);

 private:
  struct Mark;
  void record(Mark& m);
  c10::Device device_;
  std::vector<std::unique_ptr<Mark>> marks_;  // reused across steps
  size_t used_ = 0;
};

}  // namespace tandem
