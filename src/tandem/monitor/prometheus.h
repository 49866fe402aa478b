#pragma once
// The Prometheus text exposition format (version 0.0.4): the one writer of it (a run's /metrics
// here, `tandem serve`'s /metrics in serve/), and a run's body: training progress from the latest
// step row, hardware from the latest telemetry sample, energy as counters. Names follow Prometheus'
// conventions (base units, _total for counters) and pass `promtool check metrics`.

#include <string>

namespace tandem {

class RunFeed;

/// A label value escaped for the text format (backslash, double quote, newline).
std::string prometheus_label(const std::string& value);

/// Builds an exposition: each family's HELP and TYPE once, then its samples, every sample with the
/// base labels (e.g. `run="x"`) and its own.
class PrometheusText {
 public:
  explicit PrometheusText(std::string base_labels = "") : base_(std::move(base_labels)) {}
  /// A family's HELP and TYPE lines; its samples follow.
  void family(const std::string& name, const char* type, const std::string& help);
  /// One sample; `labels` like `route="/v1/models",status="200"`.
  void sample(const std::string& name, double value, const std::string& labels = "");
  /// A family of one sample.
  void metric(const std::string& name, const char* type, const std::string& help, double value) {
    family(name, type, help);
    sample(name, value);
  }
  const std::string& str() const { return out_; }

 private:
  std::string base_, out_;
};

/// The /metrics body for `feed`; `labels` (e.g. `run="x"`) is added to every series.
std::string prometheus_text(const RunFeed& feed, const std::string& run_label);

}  // namespace tandem
