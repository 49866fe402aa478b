#include "tandem/core/config.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "tandem/core/error.h"

namespace tandem {

DataKind DataConfig::kind() const { return path == "synthetic" ? DataKind::kSynthetic : DataKind::kReal; }

// DataKind is not a key (no parse table in config_enums.cpp): its names are only printed.
const char* to_string(DataKind v) { return v == DataKind::kSynthetic ? "synthetic" : "real"; }

std::vector<int64_t> parse_step_list(const std::string& s, const std::string& key) {
  std::vector<int64_t> out;
  std::stringstream in(s);
  for (std::string t; std::getline(in, t, ',');) {
    t.erase(0, t.find_first_not_of(" \t"));
    t.erase(t.find_last_not_of(" \t") + 1);
    if (t.empty()) continue;
    char* end = nullptr;
    const long long v = std::strtoll(t.c_str(), &end, 10);
    TANDEM_CHECK(end && *end == '\0' && v >= 1, key, " takes step numbers >= 1 separated by commas (e.g. 5,6); got '",
                 s, "'");
    out.push_back(v);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::optional<double> parse_update_split(const std::string& s) {
  if (s == "auto") return std::nullopt;
  char* end = nullptr;
  const double k = std::strtod(s.c_str(), &end);
  TANDEM_CHECK(!s.empty() && end && *end == '\0' && k >= 0 && k <= 1,
               "offload.update_split must be auto or a fraction in [0, 1]; got '", s, "'");
  return k;
}

int64_t pipeline_stage_count(const DistConfig& d) {
  if (d.pipeline_stages == "auto") return 0;
  char* end = nullptr;
  const long long p = std::strtoll(d.pipeline_stages.c_str(), &end, 10);
  TANDEM_CHECK(!d.pipeline_stages.empty() && end && *end == '\0' && p >= 1,
               "dist.pipeline_stages must be auto or a stage count >= 1; got '", d.pipeline_stages, "'");
  return p;
}

}  // namespace tandem
