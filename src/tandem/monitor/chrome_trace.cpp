#include "tandem/monitor/chrome_trace.h"

#include <nlohmann/json.hpp>

#include "tandem/core/strings.h"
#include "tandem/core/fs.h"

namespace tandem {

namespace {

// `s` as a JSON string literal, quotes included (names come from models and users).
std::string quoted(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

ChromeTrace::ChromeTrace(std::string process_name) : process_name_(std::move(process_name)) {}

void ChromeTrace::name_thread(int tid, const std::string& name) { threads_.emplace_back(tid, name); }

void ChromeTrace::span(int tid, const std::string& name, int64_t step, double t0_us, double t1_us) {
  if (t1_us < t0_us) return;
  const auto s = static_cast<long long>(step);
  events_.push_back(strprintf(R"({"name":%s,"cat":"step %lld","ph":"X","pid":1,"tid":%d,"ts":%.3f,"dur":%.3f,)"
                              R"("args":{"step":%lld}})",
                              quoted(name).c_str(), s, tid, t0_us, t1_us - t0_us, s));
}

void ChromeTrace::counter(const std::string& track, double ts_us, double value) {
  events_.push_back(strprintf(R"({"name":%s,"ph":"C","pid":1,"tid":0,"ts":%.3f,"args":{"value":%.6g}})",
                              quoted(track).c_str(), ts_us, value));
}

std::string ChromeTrace::json() const {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  for (const auto& [tid, name] : threads_)
    out += strprintf(R"({"name":"thread_name","ph":"M","pid":1,"tid":%d,"args":{"name":%s}},)", tid,
                     quoted(name).c_str()) +
           "\n";
  out += strprintf(R"({"name":"process_name","ph":"M","pid":1,"args":{"name":%s}})", quoted(process_name_).c_str());
  for (const auto& e : events_) out += ",\n" + e;
  out += "\n]}\n";
  return out;
}

void ChromeTrace::write(const std::string& path) const { write_file_atomic(path, json()); }

}  // namespace tandem
