// env_choice: unset, a choice, and a value that is none of them.

#include "tandem/core/env_choice.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "../test_util.h"

namespace tandem {
namespace {

TEST(EnvChoice, UnsetGivesEmptyAChoiceItselfAndAnythingElseIsRefusedWithTheChoices) {
  const char* name = "TANDEM_ENV_CHOICE_TEST";
  ::unsetenv(name);
  EXPECT_EQ(env_choice(name, "test settings", {"on", "off"}), "");
  ::setenv(name, "off", 1);
  EXPECT_EQ(env_choice(name, "test settings", {"on", "off"}), "off");
  ::setenv(name, "maybe", 1);
  const auto message = test::error_of([&] { env_choice(name, "test settings", {"on", "off"}); });
  ::unsetenv(name);
  EXPECT_NE(
      message.find("TANDEM_ENV_CHOICE_TEST=maybe is not a choice of test settings; use on or off (or leave it unset)"),
      std::string::npos)
      << message;
}

}  // namespace
}  // namespace tandem
