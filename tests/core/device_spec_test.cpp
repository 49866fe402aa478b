// The device as the user writes it, parsed once (core/device_spec.h): every accepted form, its
// text back, and one line naming the flag or key for anything else.

#include "tandem/core/device_spec.h"

#include <gtest/gtest.h>

#include "../test_util.h"

namespace tandem {
namespace {

TEST(DeviceSpec, EveryFormParsesAndPrintsAsWritten) {
  using K = DeviceSpec::Kind;
  const struct {
    const char* text;
    K kind;
    int index;
    const char* str;
  } cases[] = {{"", K::kAuto, -1, "auto"},     {"auto", K::kAuto, -1, "auto"},    {"cpu", K::kCpu, -1, "cpu"},
               {"cuda", K::kCuda, -1, "cuda"}, {"cuda:0", K::kCuda, 0, "cuda:0"}, {"cuda:12", K::kCuda, 12, "cuda:12"}};
  for (const auto& c : cases) {
    const auto d = DeviceSpec::parse(c.text, "--device");
    EXPECT_EQ(d.kind, c.kind) << c.text;
    EXPECT_EQ(d.index, c.index) << c.text;
    EXPECT_EQ(d.str(), c.str) << c.text;
  }
}

TEST(DeviceSpec, AnythingElseIsOneLineNamingTheKeyAndTheForms) {
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda0", "CPU", "cuda:1:2", "cuda:99999"}) {
    const std::string e = test::error_of([&] { DeviceSpec::parse(bad, "dist.pipeline_devices"); });
    EXPECT_NE(e.find("dist.pipeline_devices '" + std::string(bad) + "'"), std::string::npos) << e;
    EXPECT_NE(e.find("auto, cpu, cuda or cuda:N"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace tandem
