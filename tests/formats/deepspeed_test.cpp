// DeepSpeed JSON configs read into tandem's keys (formats/deepspeed.h).
#include "tandem/formats/deepspeed.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "../error_of.h"
#include "tandem/core/strings.h"

namespace tandem {
namespace {

using test::error_of;

TEST(DeepSpeed, KeysMapAndOthersAreListed) {
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

TEST(DeepSpeed, ZeroStagesMapOnlyWithOffload) {
  Config a;
  auto r = load_deepspeed_config_text(a, R"({"zero_optimization": {"stage": 2}})", "d");
  EXPECT_EQ(a.dist.zero_stage, 0);  // no offload_optimizer: tandem shards only the offload engine's state
  EXPECT_TRUE(r.ignored_keys.empty());
  ASSERT_EQ(r.notes.size(), 1u);  // said, with how to get it
  EXPECT_NE(r.notes[0].find("without offload_optimizer.device=cpu it was not set"), std::string::npos) << r.notes[0];
  Config b;
  r = load_deepspeed_config_text(b, R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}})",
                                 "d");
  EXPECT_EQ(b.dist.zero_stage, 2);  // parameters stay whole: said
  EXPECT_TRUE(r.ignored_keys.empty());
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("tandem does not shard parameters"), std::string::npos) << r.notes[0];
  Config c;
  ::setenv("WORLD_SIZE", "2", 1);
  load_deepspeed_config_text(c, R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})", "d");
  ::unsetenv("WORLD_SIZE");
  EXPECT_EQ(c.train.micro_batch, 4);
  EXPECT_EQ(c.train.grad_accum, 4);  // 32 rows over 2 ranks of 4
}

TEST(DeepSpeed, BatchArithmeticAndBadTypes) {
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

}  // namespace
}  // namespace tandem
