// One name table per config enum: every value prints as a name that parses back to it, aliases
// parse, and a wrong name lists the valid ones with the closest.
#include "tandem/core/config_enums.h"

#include <gtest/gtest.h>

#include "../error_of.h"

namespace tandem {
namespace {

template <typename E>
void expect_round_trip(const char* key) {
  SCOPED_TRACE(key);
  ASSERT_FALSE(enum_table<E>().empty());
  for (const auto& [name, value] : enum_table<E>()) {
    EXPECT_EQ(parse_enum<E>(key, name), value) << name;
    EXPECT_EQ(parse_enum<E>(key, to_string(value)), value) << "the written name parses back";
  }
}

TEST(ConfigEnums, EveryValueRoundTripsThroughItsName) {
  expect_round_trip<Precision>("train.precision");
  expect_round_trip<LrSchedule>("optim.schedule");
  expect_round_trip<OffloadTarget>("offload.optimizer");
  expect_round_trip<TokenFormat>("data.format");
  expect_round_trip<ProgressMode>("train.progress");
  expect_round_trip<OptimizerType>("optim.type");
  expect_round_trip<OptimizerImpl>("optim.impl");
  expect_round_trip<StateDtype>("optim.state_dtype");
  expect_round_trip<StateRounding>("optim.state_rounding");
  expect_round_trip<CpuIsaChoice>("optim.cpu_isa");
  expect_round_trip<Speculation>("offload.speculate");
  expect_round_trip<DistBackend>("dist.backend");
  expect_round_trip<PlacementPolicyKind>("placement.policy");
  expect_round_trip<PlacementObjective>("placement.objective");
}

TEST(ConfigEnums, AliasesParseAndTheFirstNameIsWritten) {
  EXPECT_EQ(parse_enum<TokenFormat>("data.format", "raw"), TokenFormat::kNanoGpt);
  EXPECT_EQ(parse_enum<TokenFormat>("data.format", "LLM.C"), TokenFormat::kLlmc);
  EXPECT_STREQ(to_string(TokenFormat::kNanoGpt), "nanogpt");
  EXPECT_STREQ(to_string(Speculation::kNever), "never");
}

TEST(ConfigEnums, AWrongNameListsTheValidOnes) {
  const std::string err = test::error_of([] { parse_enum<OptimizerType>("optim.type", "adamww"); });
  EXPECT_NE(err.find("'optim.type' must be one of adamw, adam, sgd, lion"), std::string::npos) << err;
  EXPECT_NE(err.find("did you mean 'adamw'"), std::string::npos) << err;
  Config c;
  EXPECT_NE(test::error_of([&] { set_config_key(c, "placement.policy", "sometimes"); }).find("off, static"),
            std::string::npos);
}

TEST(ConfigEnums, EnumKeysReadAndWriteTheirNames) {
  Config c;
  set_config_key(c, "offload.speculate", "always");
  EXPECT_EQ(c.offload.speculate, Speculation::kAlways);
  EXPECT_EQ(get_config_key(c, "offload.speculate"), "always");
  set_config_key(c, "optim.state_dtype", "BF16");
  EXPECT_EQ(c.optim.state_dtype, StateDtype::kBf16);
  EXPECT_EQ(get_config_key(c, "optim.state_dtype"), "bf16");
  bool listed = false;
  for (const auto& k : config_keys())
    if (k.name == "dist.backend") listed = k.type == "auto|nccl|gloo";
  EXPECT_TRUE(listed) << "`tandem config --keys` lists an enum key's names as its type";
}

TEST(ConfigEnums, ARetiredKeyLoadsAtItsInertValueOnly) {
  Config c;
  EXPECT_NO_THROW(set_config_key(c, "train.fault_oom_above_tokens", "0")) << "older run directories still load";
  EXPECT_NE(test::error_of([&] { set_config_key(c, "train.fault_oom_above_tokens", "64"); }).find("TANDEM_FAULTS"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem
