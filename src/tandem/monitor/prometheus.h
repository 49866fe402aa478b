#pragma once
// The Prometheus text exposition format (version 0.0.4) of a run: training progress from the
// latest step row, hardware from the latest telemetry sample, energy as counters. Names follow
// Prometheus' conventions (base units, _total for counters) and pass `promtool check metrics`.

#include <string>

namespace tandem {

class RunFeed;

/// The /metrics body for `feed`; `labels` (e.g. `run="x"`) is added to every series.
std::string prometheus_text(const RunFeed& feed, const std::string& run_label);

}  // namespace tandem
