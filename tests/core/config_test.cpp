#include "tandem/core/config.h"
#include "tandem/io/deepspeed.h"

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
  Config r;
  apply_override(r, "offload.host_ring=-2");
  EXPECT_NE(error_of([&] { validate_config(r); }).find("offload.host_ring must be -1"), std::string::npos);
  apply_override(r, "offload.host_ring=65");
  EXPECT_NE(error_of([&] { validate_config(r); }).find("up to 64"), std::string::npos);
  apply_override(r, "offload.host_ring=4");
  validate_config(r);  // speculate=auto runs as never with a ring
  apply_override(r, "offload.speculate=always");
  EXPECT_NE(error_of([&] { validate_config(r); }).find("cannot speculate or delay"), std::string::npos);
  apply_override(r, "offload.speculate=never");
  apply_override(r, "offload.delayed_update=true");
  EXPECT_NE(error_of([&] { validate_config(r); }).find("cannot speculate or delay"), std::string::npos);
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

TEST(Config, DeepSpeedKeysMapAndOthersAreListed) {
  const std::string ds = R"({
    "train_batch_size": 64,
    "train_micro_batch_size_per_gpu": 8,
    "gradient_clipping": 0.5,
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-4, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.01, "amsgrad": false}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 50, "total_num_steps": 1000, "warmup_max_lr": 3e-4, "warmup_min_lr": 1e-6, "warmup_type": "linear"}},
    "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500, "hysteresis": 2, "min_loss_scale": 2},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": false}},
    "wall_clock_breakdown": false
  })";
  Config c;
  const auto r = load_deepspeed_config_text(c, ds, "ds.json");
  EXPECT_EQ(c.train.micro_batch, 8);
  EXPECT_EQ(c.train.grad_accum, 8);
  EXPECT_DOUBLE_EQ(c.train.grad_clip, 0.5);
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-4);  // the scheduler's peak wins over optimizer.params.lr
  EXPECT_DOUBLE_EQ(c.optim.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c.optim.beta2, 0.99);
  EXPECT_DOUBLE_EQ(c.optim.eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.optim.weight_decay, 0.01);
  EXPECT_EQ(c.optim.schedule, LrSchedule::kLinear);
  EXPECT_EQ(c.optim.warmup_steps, 50);
  EXPECT_EQ(c.optim.decay_steps, 1000);
  EXPECT_DOUBLE_EQ(c.optim.warmup_min_lr, 1e-6);
  EXPECT_DOUBLE_EQ(c.optim.min_lr_ratio, 0.0);
  EXPECT_EQ(c.train.precision, Precision::kFp16);
  EXPECT_TRUE(c.scaler.dynamic);
  EXPECT_DOUBLE_EQ(c.scaler.init_scale, 4096.0);
  EXPECT_EQ(c.scaler.growth_interval, 500);
  EXPECT_DOUBLE_EQ(c.scaler.min_scale, 2.0);
  EXPECT_EQ(c.offload.optimizer, OffloadTarget::kCpu);
  EXPECT_FALSE(c.offload.pin_memory);
  const std::string ignored = join(r.ignored_keys, ",");
  EXPECT_EQ(r.ignored_keys.size(), 3u) << ignored;
  for (const char* k : {"optimizer.params.amsgrad", "fp16.hysteresis", "wall_clock_breakdown"})
    EXPECT_NE(ignored.find(k), std::string::npos) << k << " not in " << ignored;
  EXPECT_EQ(c.dist.zero_stage, 2);  // ZeRO-2 with offload_optimizer: the sharded offload engine
}

TEST(Config, DeepSpeedZeroStagesMapOnlyWithOffload) {
  Config a;
  auto r = load_deepspeed_config_text(a, R"({"zero_optimization": {"stage": 2}})", "d");
  EXPECT_EQ(a.dist.zero_stage, 0);  // no offload_optimizer: tandem shards only the offload engine's state
  EXPECT_EQ(join(r.ignored_keys, ","), "zero_optimization.stage");
  Config b;
  r = load_deepspeed_config_text(b, R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}})",
                                 "d");
  EXPECT_EQ(b.dist.zero_stage, 2);  // parameters stay whole: listed
  EXPECT_EQ(join(r.ignored_keys, ","), "zero_optimization.stage");
  Config c;
  ::setenv("WORLD_SIZE", "2", 1);
  load_deepspeed_config_text(c, R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})", "d");
  ::unsetenv("WORLD_SIZE");
  EXPECT_EQ(c.train.micro_batch, 4);
  EXPECT_EQ(c.train.grad_accum, 4);  // 32 rows over 2 ranks of 4
}

TEST(Config, DeepSpeedBatchArithmeticAndBadTypes) {
  Config c;
  EXPECT_NE(error_of([&] {
              load_deepspeed_config_text(c, R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4})", "d");
            }).find("not a multiple"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { load_deepspeed_config_text(c, R"({"optimizer": {"type": "Lamb"}})", "d"); }).find("not supported"),
      std::string::npos);
  Config w;
  load_deepspeed_config_text(
      w, R"({"bf16": {"enabled": true}, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 7}}})", "d");
  EXPECT_EQ(w.train.precision, Precision::kBf16);
  EXPECT_EQ(w.optim.schedule, LrSchedule::kConstant);
  EXPECT_EQ(w.optim.warmup_steps, 7);
  Config a;
  load_deepspeed_config_text(a, R"({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 3})", "d");
  EXPECT_EQ(a.train.micro_batch, Config().train.micro_batch);
  EXPECT_EQ(a.train.grad_accum, 3);
}

TEST(Strings, ClosestMatch) {
  EXPECT_EQ(closest_match("trian.steps", config_key_names()), "train.steps");
  EXPECT_EQ(closest_match("stpes", config_key_names()), "train.steps");
  EXPECT_EQ(closest_match("zzzzzzzzzzzzzzzzzz", {"abc"}), "");
}

}  // namespace
}  // namespace tandem
