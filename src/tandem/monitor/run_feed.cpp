#include "tandem/monitor/run_feed.h"

#include <fstream>

#include "tandem/monitor/sampler.h"

namespace tandem {

RunFeed::RunFeed(size_t max_rows, size_t max_samples)
    : max_rows_(std::max<size_t>(max_rows, 16)), max_samples_(std::max<size_t>(max_samples, 16)) {}

void RunFeed::set_info(nlohmann::json info) {
  std::lock_guard<std::mutex> lock(mu_);
  info_ = std::move(info);
}

void RunFeed::push_bounded(std::deque<Entry>& list, int64_t seq, nlohmann::json j, size_t cap) {
  list.emplace_back(seq, std::move(j));
  if (list.size() <= cap) return;
  // Thin the older half to every other entry; the newer half stays at full resolution.
  const size_t half = list.size() / 2;
  std::deque<Entry> out;
  for (size_t i = 0; i < list.size(); ++i)
    if (i >= half || i % 2 == 0) out.push_back(std::move(list[i]));
  list.swap(out);
}

void RunFeed::add_row_locked(const nlohmann::json& row) {
  if (row.contains("eval_loss") && row["eval_loss"].is_number()) totals_.eval_loss = row["eval_loss"].get<double>();
  if (row.contains("loss")) {
    ++totals_.step_rows;
    latest_row_ = row;
    if (row.contains("energy_gpu_j")) totals_.energy_gpu_j += row["energy_gpu_j"].get<double>(), totals_.has_gpu_energy = true;
    if (row.contains("energy_cpu_j")) totals_.energy_cpu_j += row["energy_cpu_j"].get<double>(), totals_.has_cpu_energy = true;
  }
  push_bounded(rows_, next_row_++, row, max_rows_);
}

void RunFeed::add_row(const nlohmann::json& row) {
  std::lock_guard<std::mutex> lock(mu_);
  add_row_locked(row);
}

void RunFeed::add_sample(nlohmann::json sample) {
  std::lock_guard<std::mutex> lock(mu_);
  latest_sample_ = sample;
  push_bounded(samples_, next_sample_++, std::move(sample), max_samples_);
}

void RunFeed::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
}

nlohmann::json RunFeed::since(int64_t row_seq, int64_t sample_seq) const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json rows = nlohmann::json::array(), samples = nlohmann::json::array();
  for (const auto& [seq, j] : rows_)
    if (seq >= row_seq) rows.push_back(j);
  for (const auto& [seq, j] : samples_)
    if (seq >= sample_seq) samples.push_back(j);
  return {{"info", info_},          {"rows", rows},   {"samples", samples}, {"next_row", next_row_},
          {"next_sample", next_sample_}, {"done", done_}};
}

nlohmann::json RunFeed::latest_row() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_row_;
}

nlohmann::json RunFeed::latest_sample() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_sample_;
}

RunFeed::Totals RunFeed::totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return totals_;
}

bool RunFeed::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void RunFeed::follow(const std::string& metrics_path) {
  std::ifstream in(metrics_path, std::ios::binary);
  if (!in) return;  // not written yet
  in.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(in.tellg());
  std::lock_guard<std::mutex> lock(mu_);
  if (size < follow_offset_) {  // rewritten from the start: read it again
    follow_offset_ = 0;
    follow_partial_.clear();
  }
  if (size == follow_offset_) return;
  std::string chunk(size - follow_offset_, '\0');
  in.seekg(static_cast<std::streamoff>(follow_offset_));
  in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
  chunk.resize(static_cast<size_t>(in.gcount()));
  follow_offset_ += chunk.size();
  std::string text = follow_partial_ + chunk;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    const std::string line = text.substr(start, nl - start);
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) continue;  // a torn or foreign line: skipped, not fatal to a viewer
    add_row_locked(j);
    // A finished run's telemetry lives in its step rows: they are its samples.
    if (j.contains("loss") && j.contains("t_s")) {
      nlohmann::json s = nlohmann::json::object();
      for (auto it = j.begin(); it != j.end(); ++it)
        if (it.key() == "t_s" || it.key().rfind("gpu_", 0) == 0 || it.key().rfind("cpu_", 0) == 0 ||
            it.key().rfind("host_", 0) == 0)
          s[it.key()] = it.value();
      latest_sample_ = s;
      push_bounded(samples_, next_sample_++, std::move(s), max_samples_);
    }
  }
  follow_partial_ = text.substr(start);
}

nlohmann::json telemetry_json(const TelemetrySample& s) {
  nlohmann::json m = nlohmann::json::object();
  if (!s.gpus.empty()) {
    const auto& g = s.gpus.front();
    if (g.util_pct) m["gpu_util_pct"] = *g.util_pct;
    if (g.mem_util_pct) m["gpu_mem_util_pct"] = *g.mem_util_pct;
    if (g.mem_used_bytes) m["gpu_mem_used_bytes"] = *g.mem_used_bytes;
    if (g.mem_total_bytes) m["gpu_mem_total_bytes"] = *g.mem_total_bytes;
    if (g.temp_c) m["gpu_temp_c"] = *g.temp_c;
    if (g.power_w) m["gpu_power_w"] = *g.power_w;
    if (g.sm_clock_mhz) m["gpu_sm_clock_mhz"] = *g.sm_clock_mhz;
  }
  const auto& h = s.host;
  if (h.cpu_pct) m["cpu_util_pct"] = *h.cpu_pct;
  if (!h.core_pct.empty()) m["cpu_core_pct"] = h.core_pct;
  if (h.process_cpu_pct) m["cpu_process_pct"] = *h.process_cpu_pct;
  if (h.mem_used_bytes) m["host_mem_used_bytes"] = *h.mem_used_bytes;
  if (h.mem_total_bytes) m["host_mem_total_bytes"] = *h.mem_total_bytes;
  if (h.process_rss_bytes) m["host_rss_bytes"] = *h.process_rss_bytes;
  return m;
}

}  // namespace tandem
