#include "tandem/core/config.h"

#include <gtest/gtest.h>

#include "../test_util.h"
#include "tandem/core/error.h"
#include "tandem/core/strings.h"

namespace tandem {
namespace {

using test::error_of;

TEST(Config, YamlNestedAndDottedKeys) {
  Config c;
  load_yaml_config_text(
      c, "train:\n  steps: 42\n  precision: bf16\noptim.lr: 1e-4\nmodel:\n  preset: 125M\n  n_layer: 3\n", "t.yaml");
  EXPECT_EQ(c.train.steps, 42);
  EXPECT_EQ(c.train.precision, Precision::kBf16);
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-4);
  EXPECT_EQ(c.model.preset, "125M");
  ASSERT_TRUE(c.model.n_layer.has_value());
  EXPECT_EQ(*c.model.n_layer, 3);
}

TEST(Config, UnknownKeyNamesClosestValidKeyAndLine) {
  Config c;
  const std::string msg = error_of([&] { load_yaml_config_text(c, "train:\n  stpes: 10\n", "run.yaml"); });
  EXPECT_NE(msg.find("unknown config key 'train.stpes'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'train.steps'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("run.yaml:2"), std::string::npos) << msg;

  const std::string msg2 = error_of([&] { apply_override(c, "optim.learning_rate=3"); });
  EXPECT_NE(msg2.find("unknown config key 'optim.learning_rate'"), std::string::npos) << msg2;
  EXPECT_NE(msg2.find("--set"), std::string::npos) << msg2;
}

// YAML parsers keep the last of two equal keys; a config that sets one twice is refused with both lines.
TEST(Config, AKeySetTwiceIsRefusedWithBothLines) {
  Config c;
  const std::string twice =
      error_of([&] { load_yaml_config_text(c, "train:\n  steps: 5\n  seq_len: 8\n  steps: 7\n", "run.yaml"); });
  EXPECT_NE(twice.find("run.yaml:4: 'train.steps' is set twice (lines 2 and 4); keep one"), std::string::npos) << twice;
  const std::string spelled =
      error_of([&] { load_yaml_config_text(c, "train:\n  steps: 5\ntrain.steps: 7\n", "run.yaml"); });
  EXPECT_NE(spelled.find("'train.steps' is set twice (lines 2 and 3)"), std::string::npos) << spelled;
  const std::string empty = error_of([&] { load_yaml_config_text(c, "model:\n  n_layer:\n  n_layer: 2\n", "m.yaml"); });
  EXPECT_NE(empty.find("'model.n_layer' is set twice"), std::string::npos) << empty;
}

TEST(Config, BadValuesAreUserErrors) {
  Config c;
  EXPECT_NE(error_of([&] { apply_override(c, "train.steps=ten"); }).find("expects an integer"), std::string::npos);
  EXPECT_NE(error_of([&] { apply_override(c, "train.precision=fp8"); }).find("must be one of"), std::string::npos);
  EXPECT_NE(error_of([&] { apply_override(c, "train.tf32=maybe"); }).find("true or false"), std::string::npos);
  EXPECT_NE(error_of([&] { apply_override(c, "nonsense"); }).find("KEY=VALUE"), std::string::npos);
  EXPECT_NE(error_of([&] { load_yaml_config_text(c, "train: [1, 2", "x.yaml"); }).find("not valid YAML"),
            std::string::npos);
  apply_override(c, "train.micro_batch=0");
  EXPECT_NE(error_of([&] { validate_config(c); }).find("train.micro_batch must be > 0"), std::string::npos);
  Config t;
  apply_override(t, "offload.trace_steps=6, 5,6");
  EXPECT_EQ(parse_step_list(t.offload.trace_steps, "offload.trace_steps"), (std::vector<int64_t>{5, 6}));
  apply_override(t, "offload.trace_steps=5,x");
  EXPECT_NE(error_of([&] { validate_config(t); }).find("offload.trace_steps takes step numbers"), std::string::npos);
  apply_override(t, "offload.trace_steps=0");
  EXPECT_NE(error_of([&] { validate_config(t); }).find("offload.trace_steps"), std::string::npos);
  Config m;
  EXPECT_NE(error_of([&] { apply_override(m, "model.activation_offload=-2"); }).find("write auto"), std::string::npos);
  apply_override(m, "model.activation_offload=-3");
  EXPECT_NE(error_of([&] { validate_config(m); }).find("model.activation_offload must be auto, -1"), std::string::npos);
  apply_override(m, "model.activation_offload=-1");
  validate_config(m);
  Config r;
  apply_override(r, "offload.host_ring=-2");
  EXPECT_NE(error_of([&] { validate_config(r); }).find("offload.host_ring must be -1"), std::string::npos);
  apply_override(r, "offload.host_ring=65");
  EXPECT_NE(error_of([&] { validate_config(r); }).find("up to 64"), std::string::npos);
  apply_override(r, "offload.host_ring=4");
  validate_config(r);
  apply_override(r, "offload.speculate=always");
  validate_config(r);  // a ring speculates without an undo log (Note [Retraction])
  apply_override(r, "offload.speculate=never");
  apply_override(r, "offload.delayed_update=true");
  validate_config(r);  // a ring delays with its slots (Note [Delayed host ring])
  apply_override(r, "offload.delayed_after=40");
  validate_config(r);  // ZeRO-Offload's start: 40 exact updates, then delayed
  apply_override(r, "offload.delayed_after=-1");
  EXPECT_NE(error_of([&] { validate_config(r); }).find("offload.delayed_after must be >= 0"), std::string::npos);
  apply_override(r, "offload.delayed_after=40");
  apply_override(r, "offload.delayed_update=false");
  EXPECT_NE(error_of([&] { validate_config(r); }).find("set offload.delayed_update=true or offload.delayed_after=0"),
            std::string::npos);
}

TEST(Config, OverridesAndOptionalReset) {
  Config c;
  apply_override(c, "model.d_model=256");
  ASSERT_TRUE(c.model.d_model.has_value());
  apply_override(c, "model.d_model=null");
  EXPECT_FALSE(c.model.d_model.has_value());
  apply_override(c, "train.seed=7");
  EXPECT_EQ(get_config_key(c, "train.seed"), "7");
}

TEST(Config, YamlRoundTripKeepsEveryKey) {
  Config a;
  apply_override(a, "train.steps=17");
  apply_override(a, "optim.schedule=linear");
  apply_override(a, "model.n_kv_head=2");
  apply_override(a, "train.run_dir=some/dir");
  Config b;
  load_yaml_config_text(b, config_to_yaml(a), "roundtrip");
  for (const auto& k : config_key_names()) EXPECT_EQ(get_config_key(a, k), get_config_key(b, k)) << k;
  EXPECT_EQ(config_hash(a), config_hash(b));
  apply_override(b, "train.steps=18");
  EXPECT_NE(config_hash(a), config_hash(b));
}

TEST(Strings, ClosestMatch) {
  EXPECT_EQ(closest_match("trian.steps", config_key_names()), "train.steps");
  EXPECT_EQ(closest_match("stpes", config_key_names()), "train.steps");
  EXPECT_EQ(closest_match("zzzzzzzzzzzzzzzzzz", {"abc"}), "");
}

TEST(Strings, CountsUpToTrillions) {
  EXPECT_EQ(format_count(853.0), "853");
  EXPECT_EQ(format_count(1.5e6), "1.5 M");
  EXPECT_EQ(format_count(13.02e9), "13.02 B");
  EXPECT_EQ(format_count(1.2e12), "1.20 T");
}

}  // namespace
}  // namespace tandem
