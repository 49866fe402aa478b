#include "tandem/core/config_enums.h"

#include "tandem/core/error.h"
#include "tandem/core/strings.h"

namespace tandem {
namespace {

template <typename E>
const char* name_of(E v) {
  for (const auto& [name, x] : enum_table<E>())
    if (x == v) return name.c_str();
  return "?";
}

}  // namespace

#define TANDEM_ENUM_TABLE(E, ...)                     \
  template <>                                         \
  const EnumTable<E>& enum_table<E>() {               \
    static const EnumTable<E> kTable = {__VA_ARGS__}; \
    return kTable;                                    \
  }                                                   \
  const char* to_string(E v) { return name_of(v); }   \
  template E parse_enum<E>(const std::string&, const std::string&);

template <typename E>
E parse_enum(const std::string& key, const std::string& text) {
  const std::string s = to_lower(text);
  std::vector<std::string> names;
  for (const auto& [name, e] : enum_table<E>()) {
    if (s == name) return e;
    names.push_back(name);
  }
  TANDEM_FAIL("'", key, "' must be one of ", join(names, ", "), "; got '", text, "'", did_you_mean(s, names));
}

TANDEM_ENUM_TABLE(Precision, {"fp32", Precision::kFp32}, {"bf16", Precision::kBf16}, {"fp16", Precision::kFp16})
TANDEM_ENUM_TABLE(LrSchedule, {"cosine", LrSchedule::kCosine}, {"linear", LrSchedule::kLinear},
                  {"constant", LrSchedule::kConstant})
TANDEM_ENUM_TABLE(OffloadTarget, {"none", OffloadTarget::kNone}, {"cpu", OffloadTarget::kCpu})
TANDEM_ENUM_TABLE(TokenFormat, {"auto", TokenFormat::kAuto}, {"nanogpt", TokenFormat::kNanoGpt},
                  {"llmc", TokenFormat::kLlmc}, {"text", TokenFormat::kText}, {"raw", TokenFormat::kNanoGpt},
                  {"llm.c", TokenFormat::kLlmc}, {"txt", TokenFormat::kText})
TANDEM_ENUM_TABLE(ProgressMode, {"auto", ProgressMode::kAuto}, {"bar", ProgressMode::kBar},
                  {"lines", ProgressMode::kLines}, {"off", ProgressMode::kOff})
TANDEM_ENUM_TABLE(OptimizerType, {"adamw", OptimizerType::kAdamW}, {"adam", OptimizerType::kAdam},
                  {"sgd", OptimizerType::kSgd}, {"lion", OptimizerType::kLion})
TANDEM_ENUM_TABLE(OptimizerImpl, {"auto", OptimizerImpl::kAuto}, {"fused", OptimizerImpl::kFused},
                  {"cpu", OptimizerImpl::kCpu})
TANDEM_ENUM_TABLE(StateDtype, {"fp32", StateDtype::kFp32}, {"bf16", StateDtype::kBf16}, {"int8", StateDtype::kInt8})

int64_t state_buffer_bytes(StateDtype d, int64_t n) {
  switch (d) {
    case StateDtype::kFp32:
      return 4 * n;
    case StateDtype::kBf16:
      return 2 * n;
    case StateDtype::kInt8:
      return n + 4 * ((n + 2047) / 2048);
  }
  return 4 * n;
}
TANDEM_ENUM_TABLE(StateRounding, {"nearest", StateRounding::kNearest}, {"stochastic", StateRounding::kStochastic})
TANDEM_ENUM_TABLE(DeviceStateDtype, {"auto", DeviceStateDtype::kAuto}, {"fp32", DeviceStateDtype::kFp32},
                  {"bf16", DeviceStateDtype::kBf16})

int64_t device_state_bytes(DeviceStateDtype d, StateDtype host) {
  if (d == DeviceStateDtype::kAuto) return host == StateDtype::kFp32 ? 4 : 2;
  return d == DeviceStateDtype::kFp32 ? 4 : 2;
}
TANDEM_ENUM_TABLE(MasterDtype, {"fp32", MasterDtype::kFp32}, {"bf16", MasterDtype::kBf16})
TANDEM_ENUM_TABLE(MasterRounding, {"stochastic", MasterRounding::kStochastic}, {"kahan", MasterRounding::kKahan})

int64_t master_bytes(MasterDtype d, MasterRounding r) {
  return d == MasterDtype::kFp32 || r == MasterRounding::kKahan ? 4 : 2;
}
TANDEM_ENUM_TABLE(CpuIsaChoice, {"auto", CpuIsaChoice::kAuto}, {"scalar", CpuIsaChoice::kScalar},
                  {"avx2", CpuIsaChoice::kAvx2}, {"avx512", CpuIsaChoice::kAvx512},
                  {"avx512bf16", CpuIsaChoice::kAvx512Bf16})
TANDEM_ENUM_TABLE(Speculation, {"auto", Speculation::kAuto}, {"always", Speculation::kAlways},
                  {"never", Speculation::kNever})
TANDEM_ENUM_TABLE(DistBackend, {"auto", DistBackend::kAuto}, {"nccl", DistBackend::kNccl}, {"gloo", DistBackend::kGloo})
TANDEM_ENUM_TABLE(PipelineSchedule, {"1f1b", PipelineSchedule::k1F1B}, {"gpipe", PipelineSchedule::kGPipe})
TANDEM_ENUM_TABLE(PlacementPolicyKind, {"off", PlacementPolicyKind::kOff}, {"static", PlacementPolicyKind::kStatic},
                  {"threshold", PlacementPolicyKind::kThreshold}, {"cost", PlacementPolicyKind::kCost})
TANDEM_ENUM_TABLE(PlacementObjective, {"throughput", PlacementObjective::kThroughput},
                  {"energy", PlacementObjective::kEnergy})

#undef TANDEM_ENUM_TABLE

}  // namespace tandem
