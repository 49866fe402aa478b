#include "tandem/monitor/host_stats.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace tandem {
namespace {

bool read_u64(const std::string& path, uint64_t* out) {
  std::ifstream in(path);
  return static_cast<bool>(in >> *out);
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

HostMonitor::HostMonitor(std::string proc_root, std::string powercap_root)
    : proc_(std::move(proc_root)), powercap_(std::move(powercap_root)) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> dirs;
  for (const auto& e : fs::directory_iterator(powercap_, ec)) {
    const std::string name = e.path().filename().string();
    // Package domains only ("intel-rapl:0"); "intel-rapl:0:0" are their sub-domains (cores, dram).
    if (name.rfind("intel-rapl:", 0) == 0 && std::count(name.begin(), name.end(), ':') == 1)
      dirs.push_back(e.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  for (const auto& d : dirs) {
    Rapl r;
    r.path = d + "/energy_uj";
    if (!read_u64(r.path, &r.last)) {
      no_energy_ = r.path + " is not readable (root only on most systems): no CPU energy";
      rapl_.clear();
      return;
    }
    if (!read_u64(d + "/max_energy_range_uj", &r.range)) r.range = 0;
    rapl_.push_back(r);
  }
  if (dirs.empty()) no_energy_ = "no RAPL package domains under " + powercap_ + ": no CPU energy";
}

HostReading HostMonitor::read() {
  HostReading h;
  const double t = now_s();
  // /proc/stat: "cpu  user nice system idle iowait irq softirq steal ..." then "cpuN ...".
  std::ifstream stat(proc_ + "/stat");
  std::vector<uint64_t> busy, total;
  std::string line;
  while (std::getline(stat, line)) {
    if (line.rfind("cpu", 0) != 0) break;
    std::istringstream ls(line);
    std::string tag;
    ls >> tag;
    uint64_t v[8] = {0};
    for (auto& x : v) ls >> x;
    const uint64_t idle = v[3] + v[4];
    uint64_t sum = 0;
    for (auto x : v) sum += x;
    busy.push_back(sum - idle);
    total.push_back(sum);
  }
  if (!busy.empty() && prev_total_.size() == total.size()) {
    const auto pct = [&](size_t i) {
      const double dt = double(total[i] - prev_total_[i]);
      return dt > 0 ? 100.0 * double(busy[i] - prev_busy_[i]) / dt : 0.0;
    };
    h.cpu_pct = pct(0);
    for (size_t i = 1; i < total.size(); ++i) h.core_pct.push_back(pct(i));
  }
  prev_busy_ = busy, prev_total_ = total;

  // /proc/self/stat: fields 14 and 15 are utime and stime in clock ticks (after "(comm)").
  std::ifstream self(proc_ + "/self/stat");
  std::string s((std::istreambuf_iterator<char>(self)), std::istreambuf_iterator<char>());
  const auto rp = s.rfind(')');
  if (rp != std::string::npos) {
    std::istringstream ss(s.substr(rp + 2));
    std::string field;
    uint64_t ticks = 0;
    for (int i = 3; i <= 15 && ss >> field; ++i)
      if (i >= 14) ticks += std::stoull(field);
    if (prev_time_ > 0 && t > prev_time_ && ticks >= prev_proc_ticks_)
      h.process_cpu_pct = 100.0 * double(ticks - prev_proc_ticks_) / double(sysconf(_SC_CLK_TCK)) / (t - prev_time_);
    prev_proc_ticks_ = ticks;
    prev_time_ = t;  // the ticks and their time move together: an unread file keeps the last pair
  }

  std::ifstream mem(proc_ + "/meminfo");
  int64_t total_kb = -1, avail_kb = -1;
  while (std::getline(mem, line)) {
    std::istringstream ls(line);
    std::string key;
    int64_t kb = 0;
    ls >> key >> kb;
    if (key == "MemTotal:") total_kb = kb;
    if (key == "MemAvailable:") avail_kb = kb;
  }
  if (total_kb >= 0) h.mem_total_bytes = total_kb * 1024;
  if (total_kb >= 0 && avail_kb >= 0) h.mem_used_bytes = (total_kb - avail_kb) * 1024;
  std::ifstream status(proc_ + "/self/status");
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) h.process_rss_bytes = std::stoll(line.substr(6)) * 1024;

  h.cpu_energy_j = cpu_energy_j();
  return h;
}

std::optional<double> HostMonitor::cpu_energy_j() {
  if (rapl_.empty()) return std::nullopt;
  double sum = 0;
  for (auto& r : rapl_) {
    uint64_t v = 0;
    if (read_u64(r.path, &v)) {
      // The counter wraps at max_energy_range_uj.
      const uint64_t d = v >= r.last ? v - r.last : (r.range > 0 ? r.range - r.last + v : 0);
      r.total_j += double(d) * 1e-6;
      r.last = v;
    }
    sum += r.total_j;
  }
  return sum;
}

}  // namespace tandem
