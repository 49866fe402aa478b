#include "tandem/run/run_metrics.h"

#include <algorithm>
#include <filesystem>
#include <thread>
#include <tuple>
#include <vector>

#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/fs.h"
#include "tandem/core/log.h"
#include "tandem/core/stats.h"
#include "tandem/core/strings.h"
#include "tandem/engine/param_store.h"
#include "tandem/monitor/tensorboard.h"
#include "tandem/monitor/web_server.h"
#include "tandem/run/run_plan.h"
#include "tandem/run/run_setup.h"
#include "tandem/run/trainer.h"

namespace fs = std::filesystem;

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

double wall_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

}  // namespace

// Note [Telemetry]
// With monitor.enabled the trainer starts a Sampler (monitor/sampler.h): a thread that reads the
// training GPU through NVML (loaded with dlopen) and the host through /proc and RAPL every
// monitor.period_s. Each metrics.jsonl step row gets the latest reading (gpu_*, cpu_*, host_*
// keys) and the energy the step used, from the cumulative counters read at the step's end (NVML's
// total-energy counter for the GPU, RAPL for the CPU packages): energy_gpu_j, energy_cpu_j and
// their per-token shares. summary.json's "telemetry" holds the run's totals and the sampler's own
// CPU time. A missing source (no driver, RAPL readable by root only) leaves its keys out and is
// said once in the log and in telemetry.missing. Rows also carry t_s (seconds since the loop began)
// and the step's time split (Note [Step time split]). The same rows, and every sample as it is
// taken, go to a RunFeed for the dashboard and /metrics, and optionally to TensorBoard.
// The live endpoints (--dashboard, --metrics-port) read a RunFeed that the step loop and the
// sampler fill; TensorBoard gets each step row's numbers as scalars under <group>/<key>.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& row) {
  std::vector<std::pair<std::string, double>> out;
  for (auto it = row.begin(); it != row.end(); ++it) {
    const std::string& k = it.key();
    if (k == "step" || k == "t_s" || !it->is_number()) continue;
    std::string group = "train";
    for (const char* g : {"gpu", "cpu", "host", "energy", "time", "offload", "mem"})
      if (k.rfind(std::string(g) + "_", 0) == 0) group = g;
    out.emplace_back(group + "/" + k, it->get<double>());
  }
  return out;
}

nlohmann::json step_metrics_row(int64_t step, double loss, double lr, double grad_norm, double step_s,
                                int64_t step_tokens, int64_t tokens, double t_s) {
  return {{"step", step},
          {"loss", loss},
          {"lr", lr},
          {"grad_norm", grad_norm},
          {"step_time_s", step_s},
          {"tokens_per_s", step_s > 0 ? double(step_tokens) / step_s : 0.0},
          {"tokens", tokens},
          {"mem_host_peak_bytes", host_peak_rss_bytes()},
          {"t_s", t_s}};
}

void add_engine_row(nlohmann::json& m, const OffloadEngine& engine, const ParamStore& store,
                    const EngineStats& before) {
  const EngineStats es = engine.stats();
  m["time_cpu_update_s"] = es.cpu_update_s - before.cpu_update_s;
  m["time_transfer_s"] = es.transfer_s - before.transfer_s;
  m["offload_gpu_blocks"] = store.gpu_blocks();
  m["offload_rollbacks"] = es.rollbacks;
  m["offload_speculative_steps"] = es.speculative_steps;
  m["offload_cpu_update_s"] = es.cpu_update_s;
  if (store.options().nvme_blocks > 0) {  // Note [NVMe tier]
    m["time_nvme_wait_s"] = es.nvme_wait_s - before.nvme_wait_s;
    m["nvme_read_bytes"] = es.nvme_read_bytes - before.nvme_read_bytes;
    m["nvme_written_bytes"] = es.nvme_written_bytes - before.nvme_written_bytes;
  }
  const auto& sp = engine.split();
  if (sp.solved) {
    m["offload_k"] = sp.k;
    m["offload_alpha"] = sp.alpha;
    m["offload_predicted_step_s"] = sp.predicted_step_s;
  }
}

void add_device_memory_row(nlohmann::json& m, int device_index) {
  if (device_index < 0 || !accelerator()) return;
  const auto ms = accelerator()->memory_stats(device_index);
  m["mem_device_bytes"] = ms.allocated;
  m["mem_device_peak_bytes"] = ms.peak_allocated;
  m["mem_device_reserved_bytes"] = ms.reserved;
}

RunMetrics::RunMetrics(const RunPlan& plan, const RunContext& ctx, const std::string& mode)
    : RunMetrics(plan.cfg, plan.run_dir,
                 strprintf("%s (%s params)", plan.spec.name.c_str(),
                           format_count(double(plan.spec.num_params_unpadded())).c_str()),
                 ctx, mode) {}

RunMetrics::RunMetrics(const Config& cfg, const std::string& run_dir, const std::string& model, const RunContext& ctx,
                       const std::string& mode)
    : main_rank_(ctx.main_rank()),
      dashboard_port_(cfg.monitor.dashboard_port),
      period_s_(cfg.monitor.period_s),
      sample_(cfg.monitor.enabled),
      device_index_(ctx.device_index),
      start_(Clock::now()) {
  // Opened at the first row, so a run refused before its first step leaves the directory as it was.
  if (main_rank_) metrics_path_ = (fs::path(run_dir) / "metrics.jsonl").string();
  feed_.set_info({{"run_dir", run_dir},
                  {"model", model},
                  {"device", ctx.device.str()},
                  {"precision", to_string(cfg.train.precision)},
                  {"mode", mode}});
  const auto serve = [&](int64_t port, bool dashboard, bool metrics_endpoint) {
    WebServerOptions wo;
    wo.host = cfg.monitor.bind;
    wo.port = static_cast<int>(port);
    wo.dashboard = dashboard;
    wo.metrics = metrics_endpoint;
    wo.chartjs_path = cfg.monitor.chartjs;
    wo.run_label = fs::absolute(run_dir).lexically_normal().filename().string();
    servers_.push_back(std::make_unique<WebServer>(feed_, wo));
    if (!servers_.back()->warning().empty()) log::warn(servers_.back()->warning());
    log::info(std::string(dashboard ? "dashboard" : "Prometheus metrics") + " at " + servers_.back()->url() +
              (dashboard ? "" : "metrics") + (dashboard && metrics_endpoint ? " (and /metrics)" : ""));
  };
  if (cfg.monitor.dashboard_port > 0 && main_rank_)
    serve(cfg.monitor.dashboard_port, true, cfg.monitor.metrics_port == cfg.monitor.dashboard_port);
  if (cfg.monitor.metrics_port > 0 && cfg.monitor.metrics_port != cfg.monitor.dashboard_port && main_rank_)
    serve(cfg.monitor.metrics_port, false, true);
  if (cfg.monitor.tensorboard && main_rank_) {
    tensorboard_ = std::make_unique<TensorBoardWriter>((fs::path(run_dir) / "tensorboard").string());
    log::info("TensorBoard scalars: " + tensorboard_->path());
  }
}

RunMetrics::~RunMetrics() = default;

void RunMetrics::publish(const nlohmann::json& row) {
  if (!metrics_path_.empty() && !metrics_.is_open()) {
    // One JSON object per line, flushed, so a crash loses at most the current line.
    metrics_.open(metrics_path_, std::ios::app);
    TANDEM_CHECK(metrics_.good(), "cannot open '", metrics_path_, "' for writing; check the run directory");
  }
  if (metrics_.is_open()) {
    metrics_ << row.dump() << '\n';
    metrics_.flush();
  }
  feed_.add_row(row);
  if (tensorboard_) tensorboard_->scalars(row.value("step", int64_t{0}), tensorboard_scalars(row), wall_now());
}

void RunMetrics::start() {
  start_ = Clock::now();
  if (sample_) {
    SamplerOptions so;
    so.period_s = period_s_;
    if (device_index_ >= 0) so.cuda_devices = {device_index_};
    so.on_sample = [this, start = start_](const TelemetrySample& smp) {
      nlohmann::json j = telemetry_json(smp);
      j["t_s"] = std::chrono::duration<double>(Clock::now() - start).count();
      feed_.add_sample(std::move(j));
    };
    sampler_ = std::make_unique<Sampler>(so);
    for (const auto& why : sampler_->why_missing()) log::info("telemetry: " + why);
  }
  energy0_ = energy_prev_ = sampler_ ? sampler_->energy_now() : EnergyCounters{};
  sampler_cpu0_ = sampler_ ? sampler_->thread_cpu_s() : 0.0;
}

double RunMetrics::since_start_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

std::optional<TelemetrySample> RunMetrics::latest() const {
  if (!sampler_) return std::nullopt;
  return sampler_->latest();
}

std::pair<std::optional<double>, std::optional<double>> RunMetrics::add_telemetry(nlohmann::json& row,
                                                                                  int64_t tokens_per_step) {
  if (!sampler_) return {};
  const EnergyCounters e = sampler_->energy_now();
  std::optional<double> gpu_j, cpu_j;
  if (e.gpu_j && energy_prev_.gpu_j) {
    gpu_j = *e.gpu_j - *energy_prev_.gpu_j;
    row["energy_gpu_j"] = *gpu_j;
    row["energy_gpu_j_per_token"] = *gpu_j / double(tokens_per_step);
  }
  if (e.cpu_j && energy_prev_.cpu_j) {
    cpu_j = *e.cpu_j - *energy_prev_.cpu_j;
    row["energy_cpu_j"] = *cpu_j;
    row["energy_cpu_j_per_token"] = *cpu_j / double(tokens_per_step);
  }
  energy_prev_ = e;
  nlohmann::json t = telemetry_json(sampler_->latest());
  t.erase("cpu_core_pct");  // per core: live endpoints only, not one column per core per row
  row.update(t);
  return {gpu_j, cpu_j};
}

decltype(EngineOptions::trace_counters) RunMetrics::trace_counters() {
  return [this](Clock::time_point from, Clock::time_point to) {
    std::vector<EngineOptions::CounterPoint> out;
    if (!sampler_) return out;
    sampler_->sample_now();  // a reading at the traced steps' end
    const auto at = [&](double t) {
      return Clock::time_point(
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(sampler_->start_s() + t)));
    };
    for (const auto& smp : sampler_->since(0)) {
      const auto tp = at(smp.t);
      if (tp < from || tp > to) continue;
      const nlohmann::json j = telemetry_json(smp);
      for (const auto& [key, track, scale] :
           {std::tuple<const char*, const char*, double>{"gpu_power_w", "GPU power (W)", 1.0},
            {"gpu_util_pct", "GPU utilisation (%)", 1.0},
            {"gpu_mem_used_bytes", "GPU memory used (GiB)", 1.0 / double(1 << 30)},
            {"cpu_util_pct", "CPU utilisation (%)", 1.0},
            {"host_mem_used_bytes", "host memory used (GiB)", 1.0 / double(1 << 30)}})
        if (j.contains(key)) out.push_back({tp, track, j[key].get<double>() * scale});
    }
    return out;
  };
}

void add_speed_and_memory(TrainSummary& summary, const std::vector<double>& step_times, int64_t tokens_per_step,
                          int device_index) {
  std::vector<double> steady(step_times.begin() + std::min<size_t>(step_times.size() / 5, 5), step_times.end());
  summary.median_step_time_s = median(steady);
  summary.median_tokens_per_s = summary.median_step_time_s > 0 ? tokens_per_step / summary.median_step_time_s : 0;
  summary.peak_host_bytes = host_peak_rss_bytes();
  if (device_index >= 0 && accelerator())
    summary.peak_device_bytes = accelerator()->memory_stats(device_index).peak_allocated;
}

void RunMetrics::write_summary(const TrainSummary& summary, const RunPlan& plan, const RunContext& ctx,
                               int64_t tokens_run, int64_t tokens_per_step, double wall_s,
                               const nlohmann::json& placement) {
  const ModelSpec& spec = plan.spec;
  const nlohmann::json model = {{"params", spec.num_params_unpadded()},
                                {"n_layer", spec.n_layer},
                                {"d_model", spec.d_model},
                                {"seq_len", plan.seq_len},
                                {"precision", to_string(plan.cfg.train.precision)},
                                {"device", ctx.device.str()}};
  write_summary(summary, model, plan.run_dir, tokens_run, tokens_per_step, wall_s, placement);
}

void RunMetrics::write_summary(const TrainSummary& summary, const nlohmann::json& model, const std::string& run_dir,
                               int64_t tokens_run, int64_t tokens_per_step, double wall_s,
                               const nlohmann::json& placement) {
  telemetry_ = nlohmann::json::object();
  if (sampler_) {
    const EnergyCounters e = sampler_->energy_now();
    if (e.gpu_j && energy0_.gpu_j && tokens_run > 0) {
      telemetry_["energy_gpu_j"] = *e.gpu_j - *energy0_.gpu_j;
      telemetry_["energy_gpu_j_per_token"] = (*e.gpu_j - *energy0_.gpu_j) / double(tokens_run);
    }
    if (e.cpu_j && energy0_.cpu_j && tokens_run > 0) {
      telemetry_["energy_cpu_j"] = *e.cpu_j - *energy0_.cpu_j;
      telemetry_["energy_cpu_j_per_token"] = (*e.cpu_j - *energy0_.cpu_j) / double(tokens_run);
    }
    const double loop_s = since_start_s();
    telemetry_["samples"] = sampler_->samples();
    telemetry_["period_s"] = period_s_;
    // The sampler's own cost: its thread's CPU time over the loop's wall time (one core's share).
    telemetry_["sampler_cpu_s"] = sampler_->thread_cpu_s() - sampler_cpu0_;
    telemetry_["sampler_cpu_fraction"] = loop_s > 0 ? (sampler_->thread_cpu_s() - sampler_cpu0_) / loop_s : 0.0;
    telemetry_["missing"] = sampler_->why_missing();
    sampler_.reset();
  }
  nlohmann::json s = {{"schema_version", kSummarySchemaVersion},
                      {"steps", summary.final_step - summary.first_step},
                      {"final_step", summary.final_step},
                      {"final_loss", summary.losses.empty() ? 0.0 : summary.losses.back()},
                      {"eval_loss", summary.last_eval_loss},
                      {"median_step_time_s", summary.median_step_time_s},
                      {"median_tokens_per_s", summary.median_tokens_per_s},
                      {"tokens_per_step", tokens_per_step},
                      {"wall_s", wall_s},
                      {"skipped_steps", summary.skipped_steps},
                      {"peak_device_bytes", summary.peak_device_bytes},
                      {"peak_host_bytes", summary.peak_host_bytes},
                      {"checkpoint", summary.last_checkpoint},
                      {"interrupted", summary.interrupted},
                      {"oom_retries", summary.oom_retries},
                      {"checkpoint_error", summary.checkpoint_error},
                      {"unsaved", summary.unsaved},
                      {"telemetry", telemetry_}};
  s.update(model);
  if (!placement.is_null()) s["placement"] = placement;
  if (main_rank_) write_file_atomic((fs::path(run_dir) / "summary.json").string(), s.dump(2) + "\n");
}

void RunMetrics::finish() {
  feed_.finish();
  // An open dashboard polls every second: give it the last rows before the server goes.
  if (dashboard_port_ > 0 && main_rank_) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  if (telemetry_.contains("energy_gpu_j_per_token"))
    log::info(strprintf("energy: GPU %.1f kJ, %.3f J/token%s", telemetry_["energy_gpu_j"].get<double>() / 1e3,
                        telemetry_["energy_gpu_j_per_token"].get<double>(),
                        telemetry_.contains("energy_cpu_j_per_token")
                            ? strprintf(" | CPU %.1f kJ, %.3f J/token", telemetry_["energy_cpu_j"].get<double>() / 1e3,
                                        telemetry_["energy_cpu_j_per_token"].get<double>())
                                  .c_str()
                            : ""));
}

}  // namespace tandem
