#pragma once
// Progress output: one redrawn line on a terminal, plain log lines otherwise.

#include <chrono>
#include <cstdint>
#include <string>

#include "tandem/core/config.h"

namespace tandem {

/// What one progress update shows.
struct ProgressSample {
  int64_t step = 0, total = 0;
  double loss = 0, lr = 0, tokens_per_s = 0, step_time_s = 0, eta_s = 0;
  std::string extra;  // e.g. "scale 65536" or "skipped"
};

/// Renders progress to stderr in the configured mode ("auto" | "bar" | "lines" | "off").
class Progress {
 public:
  Progress(ProgressMode mode, int64_t log_every);
  void update(const ProgressSample& s);
  /// Prints a message on its own line (ending a bar line first).
  void message(const std::string& line);
  void finish();

 private:
  bool bar_ = false, off_ = false, bar_open_ = false;
  int64_t log_every_;
};

std::string format_duration(double seconds);

}  // namespace tandem
