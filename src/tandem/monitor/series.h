#pragma once
// The charts a run is shown with: one list shared by the live dashboard (sent to the page as
// JSON) and `tandem report` (drawn as inline SVG), so both show the same series under the same
// names. Each series is a key of metrics.jsonl's step rows or of the telemetry samples.

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace tandem {

struct SeriesSpec {
  std::string key;    ///< metrics.jsonl / telemetry key
  std::string label;  ///< legend text
  bool overlay = false;  ///< in a stacked chart: drawn as a line over the stack, not part of it
};

struct ChartSpec {
  std::string id, title, unit;
  /// kSteps: x is the step, from the step rows; kTime: x is seconds since the run started, from
  /// the telemetry samples (live) or the step rows' t_s (a finished run).
  enum class Axis { kSteps, kTime } axis = Axis::kSteps;
  double scale = 1.0;    ///< value shown = value x scale (bytes to GiB)
  bool stacked = false;  ///< the series add up to a whole (the step's time split)
  std::vector<SeriesSpec> series;
};

/// loss, tokens/s, step time split, update split k, pipeline bubble, energy per token, GPU and CPU utilisation,
/// memory, power, temperature.
const std::vector<ChartSpec>& chart_specs();

/// chart_specs() as JSON for the dashboard page.
nlohmann::json chart_specs_json();

}  // namespace tandem
