#include "tandem/core/device_spec.h"

#include "tandem/core/error.h"

namespace tandem {

DeviceSpec DeviceSpec::parse(const std::string& text, const std::string& what) {
  DeviceSpec d;
  if (text.empty() || text == "auto") return d;
  if (text == "cpu") {
    d.kind = Kind::kCpu;
    return d;
  }
  d.kind = Kind::kCuda;
  if (text == "cuda") return d;
  const std::string digits = text.rfind("cuda:", 0) == 0 ? text.substr(5) : "";
  TANDEM_CHECK(!digits.empty() && digits.size() <= 4 && digits.find_first_not_of("0123456789") == std::string::npos,
               what, " '", text, "' is not a device; give auto, cpu, cuda or cuda:N");
  d.index = std::stoi(digits);
  return d;
}

std::string DeviceSpec::str() const {
  switch (kind) {
    case Kind::kAuto:
      return "auto";
    case Kind::kCpu:
      return "cpu";
    case Kind::kCuda:
      return index < 0 ? "cuda" : "cuda:" + std::to_string(index);
  }
  return "auto";
}

}  // namespace tandem
