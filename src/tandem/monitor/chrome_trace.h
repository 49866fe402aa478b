#pragma once
// Chrome's JSON trace format, which Perfetto and chrome://tracing load: the named threads of one
// process, complete events ("ph":"X") and counter tracks ("ph":"C"), times in microseconds, written
// in one piece. It knows nothing of what is traced: the offload engine draws its streams and its
// CPU updater into it (Note [Offload trace] in engine/offload_trace.h), the sampler's readings
// become counter tracks.

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tandem {

/// A reading for a trace's counter tracks (power, utilisation, memory), on the steady clock.
struct CounterPoint {
  std::chrono::steady_clock::time_point t;
  std::string track;  ///< e.g. "GPU power (W)"
  double value;
};

/// One trace file's events, kept in memory until written.
class ChromeTrace {
 public:
  /// The trace of one process (pid 1) named `process_name`.
  explicit ChromeTrace(std::string process_name);

  /// Names the track of thread `tid`; tracks are listed in the order they were named.
  void name_thread(int tid, const std::string& name);
  /// A complete event on thread `tid` from `t0_us` to `t1_us`, in category "step N" with the step in
  /// its args; none when it would end before it starts.
  void span(int tid, const std::string& name, int64_t step, double t0_us, double t1_us);
  /// A counter track's value from `ts_us` on.
  void counter(const std::string& track, double ts_us, double value);

  /// Spans and counter values so far (the metadata not counted).
  size_t events() const { return events_.size(); }
  /// The whole trace: {"displayTimeUnit":"ms","traceEvents":[...]}, one event a line, the thread and
  /// process names first.
  std::string json() const;
  /// Writes json() to `path` durably (a temporary sibling, fsync, rename).
  void write(const std::string& path) const;

 private:
  std::string process_name_;
  std::vector<std::pair<int, std::string>> threads_;  // (tid, name) in naming order
  std::vector<std::string> events_;                   // one JSON object each
};

}  // namespace tandem
