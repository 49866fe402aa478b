#pragma once
// The offload engine's trace (Note [Offload trace]): which steps are traced, the reference stamp a
// traced step starts from, and, once it is done, its stamps drawn as Chrome trace spans (per Block
// the forward and backward on the compute stream, the D2H and H2D copies, the device side's update,
// the CPU updater's updates) beside the sampler's counter tracks; the file is written after the last
// traced step. Owns the trace being built; the format itself is monitor/chrome_trace's.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tandem/engine/cpu_updater.h"
#include "tandem/engine/param_store.h"
#include "tandem/engine/step_stamps.h"
#include "tandem/engine/transfer_streams.h"
#include "tandem/monitor/chrome_trace.h"

namespace tandem {

struct OffloadTraceOptions {
  std::vector<int64_t> steps;  ///< 1-based steps to trace, ascending
  std::string path;            ///< the trace file; empty = none written
  /// Telemetry between two times (the traced steps), for counter tracks; unset = no counters.
  std::function<std::vector<CounterPoint>(std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point)>
      counters;
  std::function<void(const std::string&)> log;  ///< one line when the file is written
};

class OffloadTrace {
 public:
  /// `cuda`: the compute device is a GPU (the compute track's name says which).
  OffloadTrace(OffloadTraceOptions options, bool cuda);

  /// Whether 1-based step `step` is traced.
  bool traces(int64_t step) const;
  /// A traced step has started and is not drawn yet.
  bool active() const { return active_; }
  /// Starts tracing `step` from idle streams: the reference stamp (on the compute stream and the
  /// host clock at once), every other stamp unset. `streams` is null with the CPU as the device.
  void start(int64_t step, StepStamps& stamps, const TransferStreams* streams);
  /// Draws the traced step (its work done, the streams idle) from `stamps`, the Blocks' names and the
  /// CPU updater's spans, with the counters since just before it; writes the file after the last.
  void finish(const StepStamps& stamps, const std::vector<BlockStore>& blocks, const std::vector<CpuUpdateSpan>& cpu);

 private:
  void draw_blocks(const StepStamps& st, const std::vector<BlockStore>& blocks);
  void draw_counters(const StepStamps& st);
  void write_if_last();

  OffloadTraceOptions options_;
  ChromeTrace trace_;
  bool active_ = false;
  int64_t step_ = 0;     // the step being traced
  double ref_host_ = 0;  // its reference, seconds since the stamps' epoch
};

}  // namespace tandem
