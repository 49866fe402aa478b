#pragma once
// What a running (or finished) training run has said so far, held for the HTTP endpoints: the
// step rows of metrics.jsonl, the telemetry samples between them, the run's description and its
// running totals. Written by the trainer's thread and the sampler's, read by the server's.
// Bounded: past the cap, the older half of a list is thinned to every other entry, so a long run
// keeps its whole shape at a lower resolution.

#include <cstdint>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace tandem {

struct TelemetrySample;

class RunFeed {
 public:
  explicit RunFeed(size_t max_rows = 20000, size_t max_samples = 20000);

  /// Run description shown by the dashboard (run dir, model, device, ...).
  void set_info(nlohmann::json info);
  /// A metrics.jsonl row (step rows carry "loss"; evaluation rows "eval_loss").
  void add_row(const nlohmann::json& row);
  /// A telemetry sample as flat keys (telemetry_json) with "t_s", seconds since the run started.
  void add_sample(nlohmann::json sample);
  /// The run has ended (the dashboard stops polling).
  void finish();

  /// {"info", "rows", "samples", "next_row", "next_sample", "done"}: the rows and samples whose
  /// sequence numbers are at least the given ones.
  nlohmann::json since(int64_t row_seq, int64_t sample_seq) const;
  /// The latest step row and sample ({} before the first), and the totals below.
  nlohmann::json latest_row() const;
  nlohmann::json latest_sample() const;
  struct Totals {
    int64_t step_rows = 0;
    double energy_gpu_j = 0, energy_cpu_j = 0;  ///< summed per-step energy
    bool has_gpu_energy = false, has_cpu_energy = false;
    double eval_loss = -1;
  };
  Totals totals() const;
  bool done() const;

  /// Reads the lines appended to a metrics.jsonl since the last call (a run written by another
  /// process, or a finished one); an incomplete last line waits for the next call.
  void follow(const std::string& metrics_path);

 private:
  using Entry = std::pair<int64_t, nlohmann::json>;
  static void push_bounded(std::deque<Entry>& list, int64_t seq, nlohmann::json j, size_t cap);
  void add_row_locked(const nlohmann::json& row);
  mutable std::mutex mu_;
  size_t max_rows_, max_samples_;
  nlohmann::json info_ = nlohmann::json::object();
  std::deque<Entry> rows_, samples_;
  int64_t next_row_ = 0, next_sample_ = 0;
  nlohmann::json latest_row_ = nlohmann::json::object(), latest_sample_ = nlohmann::json::object();
  Totals totals_;
  bool done_ = false;
  uint64_t follow_offset_ = 0;
  std::string follow_partial_;
};

/// A telemetry sample as the flat keys metrics.jsonl uses (gpu_*, cpu_*, host_*); the first
/// watched GPU only.
nlohmann::json telemetry_json(const TelemetrySample& s);

}  // namespace tandem
