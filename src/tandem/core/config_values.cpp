#include "tandem/core/config_values.h"

#include <cstdlib>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"

namespace tandem {
namespace {

// A comma list of integers >= `least`; UserError: "<key>='<text>' is not <what>; give <forms>".
std::vector<int64_t> parse_int_list(const std::string& text, const std::string& key, int64_t least, const char* what,
                                    const char* forms) {
  std::vector<int64_t> out;
  for (const auto& part : split(text, ',')) {
    const std::string t = trim(part);
    char* end = nullptr;
    const long long v = std::strtoll(t.c_str(), &end, 10);
    TANDEM_CHECK(!t.empty() && end != nullptr && *end == '\0' && v >= least, key, "='", text, "' is not ", what,
                 "; give ", forms);
    out.push_back(v);
  }
  return out;
}

std::string join_ints(const std::vector<int64_t>& v) {
  std::vector<std::string> parts;
  for (const int64_t x : v) parts.push_back(std::to_string(x));
  return join(parts, ",");
}

}  // namespace

RowBalance RowBalance::parse(const std::string& text, const std::string& key) {
  const std::string t = to_lower(trim(text));
  RowBalance b;
  if (t == "equal") return b;
  if (t == "auto") {
    b.kind = Kind::kAuto;
    return b;
  }
  b.kind = Kind::kGiven;
  b.rows = parse_int_list(t, key, 1, "a list of row counts (each >= 1)",
                          "equal, auto or one row count per rank, comma-separated (e.g. 6,2)");
  return b;
}

std::string RowBalance::str() const {
  return kind == Kind::kEqual ? "equal" : kind == Kind::kAuto ? "auto" : join_ints(rows);
}

PipelineCut PipelineCut::parse(const std::string& text, const std::string& key) {
  const std::string t = to_lower(trim(text));
  PipelineCut c;
  if (t.empty() || t == "auto") return c;
  if (t == "even") {
    c.kind = Kind::kEven;
    return c;
  }
  c.kind = Kind::kGiven;
  c.ends = parse_int_list(t, key, 0, "a comma list of Block indices",
                          "\"\" (the partitioner's cut), even, or the end of each stage but the last (e.g. 3,6 for 3 "
                          "stages)");
  return c;
}

std::string PipelineCut::str() const {
  return kind == Kind::kPartitioner ? "" : kind == Kind::kEven ? "even" : join_ints(ends);
}

StageDevices StageDevices::parse(const std::string& text, const std::string& key) {
  StageDevices d;
  if (trim(text).empty()) return d;
  for (const auto& part : split(text, ',')) d.devices.push_back(DeviceSpec::parse(trim(part), key));
  return d;
}

std::string StageDevices::str() const {
  std::vector<std::string> parts;
  for (const auto& d : devices) parts.push_back(d.str());
  return join(parts, ",");
}

bool StageDevices::any_cpu() const {
  for (const auto& d : devices)
    if (d.kind == DeviceSpec::Kind::kCpu) return true;
  return false;
}

StaticBlocks StaticBlocks::parse(const std::string& text, const std::string& key) {
  const std::string t = trim(text);
  StaticBlocks p;
  if (to_lower(t) == "gpu") return p;
  if (to_lower(t) == "cpu") {
    p.kind = Kind::kCpu;
    return p;
  }
  p.kind = Kind::kLetters;
  for (const char c : t) {
    TANDEM_CHECK(c == 'G' || c == 'g' || c == 'C' || c == 'c', key, "='", text, "': '", std::string(1, c),
                 "' is neither G (GPU) nor C (CPU); give gpu, cpu or one letter per Block (e.g. GCCG)");
    p.on_cpu.push_back(c == 'C' || c == 'c');
  }
  TANDEM_CHECK(!p.on_cpu.empty(), key, " is empty; give gpu, cpu or one letter per Block (G or C)");
  return p;
}

std::string StaticBlocks::str() const {
  if (kind != Kind::kLetters) return kind == Kind::kGpu ? "gpu" : "cpu";
  std::string s;
  for (const bool c : on_cpu) s += c ? 'C' : 'G';
  return s;
}

MovableBlocks MovableBlocks::parse(const std::string& text, const std::string& key) {
  const std::string t = to_lower(trim(text));
  MovableBlocks m;
  if (t.empty()) return m;
  if (t == "none") {
    m.kind = Kind::kNone;
    return m;
  }
  m.kind = Kind::kGiven;
  m.blocks = parse_int_list(t, key, 0, "a comma list of Block indices",
                            "\"\" (every decoder layer), none, or Block indices (e.g. 1,2)");
  return m;
}

std::string MovableBlocks::str() const {
  return kind == Kind::kLayers ? "" : kind == Kind::kNone ? "none" : join_ints(blocks);
}

}  // namespace tandem
