#pragma once
// The names of the config's enum values: one table per enum, from which keys are parsed, printed
// and listed (`tandem config --keys`). The first name of a value is the one written; later ones
// are accepted aliases.

#include <string>
#include <utility>
#include <vector>

#include "tandem/core/config.h"

namespace tandem {

template <typename E>
using EnumTable = std::vector<std::pair<std::string, E>>;

/// The table of enum E (specialised in config_enums.cpp for each enum of config.h).
template <typename E>
const EnumTable<E>& enum_table();

template <>
const EnumTable<Precision>& enum_table<Precision>();
template <>
const EnumTable<LrSchedule>& enum_table<LrSchedule>();
template <>
const EnumTable<OffloadTarget>& enum_table<OffloadTarget>();
template <>
const EnumTable<TokenFormat>& enum_table<TokenFormat>();
template <>
const EnumTable<ProgressMode>& enum_table<ProgressMode>();
template <>
const EnumTable<OptimizerType>& enum_table<OptimizerType>();
template <>
const EnumTable<OptimizerImpl>& enum_table<OptimizerImpl>();
template <>
const EnumTable<StateDtype>& enum_table<StateDtype>();
template <>
const EnumTable<StateRounding>& enum_table<StateRounding>();
template <>
const EnumTable<DeviceStateDtype>& enum_table<DeviceStateDtype>();
template <>
const EnumTable<MasterDtype>& enum_table<MasterDtype>();
template <>
const EnumTable<MasterRounding>& enum_table<MasterRounding>();
template <>
const EnumTable<CpuIsaChoice>& enum_table<CpuIsaChoice>();
template <>
const EnumTable<Speculation>& enum_table<Speculation>();
template <>
const EnumTable<DistBackend>& enum_table<DistBackend>();
template <>
const EnumTable<PipelineSchedule>& enum_table<PipelineSchedule>();
template <>
const EnumTable<PlacementPolicyKind>& enum_table<PlacementPolicyKind>();
template <>
const EnumTable<PlacementObjective>& enum_table<PlacementObjective>();

/// The value named `text` (case-insensitive, aliases included); UserError naming `key`, the valid
/// names and the closest one otherwise.
template <typename E>
E parse_enum(const std::string& key, const std::string& text);

}  // namespace tandem
