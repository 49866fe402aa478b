#pragma once
// What a run reports (Note [Telemetry]): metrics.jsonl rows (written by rank 0, a line at a time),
// the live feed behind --dashboard and --metrics-port, TensorBoard scalars, the telemetry sampler
// and each step's energy from its counters, and at the end summary.json and the closing log lines.

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/engine/offload_engine.h"
#include "tandem/monitor/run_feed.h"
#include "tandem/monitor/sampler.h"

namespace tandem {

class ParamStore;
class TensorBoardWriter;
class WebServer;
struct RunContext;
struct RunPlan;
struct TrainSummary;

/// Version of summary.json's layout, written into it as "schema_version" (bench/run_dir.py reads it).
inline constexpr int kSummarySchemaVersion = 2;

/// The TensorBoard scalars of a metrics row: its numbers under <group>/<key>.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& row);

/// A step's metrics row: step, loss, learning rate, gradient norm, step time, tokens/s over the
/// step's `step_tokens`, the run's `tokens` so far, peak host memory, `t_s` since the run started.
nlohmann::json step_metrics_row(int64_t step, double loss, double lr, double grad_norm, double step_s,
                                int64_t step_tokens, int64_t tokens, double t_s);
/// The offload engine's counters since `before` and its split, in a step's metrics row.
void add_engine_row(nlohmann::json& m, const OffloadEngine& engine, const ParamStore& store, const EngineStats& before);
/// Device memory (allocated, peak, reserved) in a step's metrics row; nothing on the CPU.
void add_device_memory_row(nlohmann::json& m, int device_index);
/// The median step over the steps after the first few (warm-up: allocator, cuDNN/cuBLAS
/// heuristics), its tokens/s, and the peaks of host and device memory, into `summary`.
void add_speed_and_memory(TrainSummary& summary, const std::vector<double>& step_times, int64_t tokens_per_step,
                          int device_index);

class RunMetrics {
 public:
  /// Opens metrics.jsonl (rank 0), the live endpoints and TensorBoard as the config asks.
  /// `mode` names the engine for the dashboard ("offload engine" or "GPU-resident").
  RunMetrics(const RunPlan& plan, const RunContext& ctx, const std::string& mode);
  /// The same for any model: its run directory and config, and `model` as the dashboard names it.
  RunMetrics(const Config& cfg, const std::string& run_dir, const std::string& model, const RunContext& ctx,
             const std::string& mode);
  ~RunMetrics();
  RunMetrics(const RunMetrics&) = delete;
  RunMetrics& operator=(const RunMetrics&) = delete;

  /// A row to metrics.jsonl, the live feed and TensorBoard.
  void publish(const nlohmann::json& row);

  /// Starts the sampler (monitor.enabled) and takes the energy counters' first reading.
  void start();
  /// Seconds since start().
  double since_start_s() const;
  /// Adds this step's telemetry and energy (joules since the previous step, per token) to `row`;
  /// returns the step's GPU and CPU joules where readable.
  std::pair<std::optional<double>, std::optional<double>> add_telemetry(nlohmann::json& row, int64_t tokens_per_step);
  /// The latest telemetry sample; null without a sampler.
  std::optional<TelemetrySample> latest() const;
  /// Telemetry between two times for the engine's trace counter tracks (Note [Offload trace]).
  decltype(EngineOptions::trace_counters) trace_counters();

  /// Writes summary.json (rank 0) from the run's outcome and the sampler's totals; stops the sampler.
  void write_summary(const TrainSummary& summary, const RunPlan& plan, const RunContext& ctx, int64_t tokens_run,
                     int64_t tokens_per_step, double wall_s, const nlohmann::json& placement);
  /// The same for any model: `model` holds what summary.json says of it (params, precision,
  /// device, and where known n_layer, d_model, seq_len); written into `run_dir`.
  void write_summary(const TrainSummary& summary, const nlohmann::json& model, const std::string& run_dir,
                     int64_t tokens_run, int64_t tokens_per_step, double wall_s, const nlohmann::json& placement);
  /// After the last row: the live feed ends (an open dashboard gets its last poll), the energy line.
  void finish();

 private:
  const bool main_rank_;
  const int64_t dashboard_port_;
  const double period_s_;
  const bool sample_;
  const int device_index_;
  std::string metrics_path_;  // "" on ranks other than 0
  std::ofstream metrics_;
  RunFeed feed_;  // read by the live endpoints; outlives the sampler feeding it
  std::vector<std::unique_ptr<WebServer>> servers_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::unique_ptr<Sampler> sampler_;
  std::chrono::steady_clock::time_point start_;
  EnergyCounters energy0_, energy_prev_;
  double sampler_cpu0_ = 0;
  nlohmann::json telemetry_;  // the run's totals, kept for the closing energy line
};

}  // namespace tandem
