#pragma once
// A device as the user writes it (train.device, dist.pipeline_devices, --device of generate, serve,
// chat and bench): auto, cpu, cuda or cuda:N, parsed here once at the boundary; what a kind means on
// this machine (which GPU `auto` and `cuda` pick) is the caller's, which knows the devices.

#include <string>

namespace tandem {

struct DeviceSpec {
  enum class Kind { kAuto, kCpu, kCuda };
  Kind kind = Kind::kAuto;
  int index = -1;  ///< kCuda: the index cuda:N named; -1 when plain "cuda"

  /// Parses `text` ("" is auto); UserError naming `what` (a flag or key) and the accepted forms.
  static DeviceSpec parse(const std::string& text, const std::string& what);
  /// As written: auto, cpu, cuda or cuda:N.
  std::string str() const;
};

}  // namespace tandem
