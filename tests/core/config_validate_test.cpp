// validate_config (core/config_validate.cpp): each section's ranges at and just past their edges,
// the combinations no run can use, and values set in code (NaN) that the key parser never sees.
// Every refusal is a UserError that names the key.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "../error_of.h"
#include "tandem/core/config.h"

namespace tandem {
namespace {

using test::error_of;

// The defaults with `overrides` applied as --set would apply them.
Config with(const std::vector<std::string>& overrides) {
  Config c;
  for (const auto& o : overrides) apply_override(c, o);
  return c;
}

std::string joined(const std::vector<std::string>& overrides) {
  std::string out;
  for (const auto& o : overrides) out += (out.empty() ? "" : " ") + o;
  return out;
}

struct Refused {
  std::vector<std::string> overrides;
  std::string message;  // a part of the UserError's message
};

TEST(ConfigValidate, TheDefaultsAreValid) {
  EXPECT_EQ(error_of([] { validate_config(Config{}); }), "");
}

TEST(ConfigValidate, EachSectionRefusesValuesJustPastItsRange) {
  const std::vector<Refused> cases = {
      // data
      {{"data.val_fraction=1"}, "data.val_fraction must be in [0, 1), got 1"},
      {{"data.val_fraction=-0.1"}, "data.val_fraction must be in [0, 1), got -0.1"},
      {{"data.prefetch=0"}, "data.prefetch must be within 1 .. 64, got 0"},
      {{"data.prefetch=65"}, "data.prefetch must be within 1 .. 64, got 65"},
      {{"data.synthetic_bytes=4095"}, "data.synthetic_bytes must be within 4096 .. 16 GiB"},
      {{"data.synthetic_bytes=17179869185"}, "got 17179869185"},
      // train
      {{"train.steps=-1"}, "train.steps must be >= 0, got -1"},
      {{"train.micro_batch=1048577"}, "train.micro_batch must be within 1 .. 1048576, got 1048577"},
      {{"train.grad_accum=0"}, "train.grad_accum must be > 0, got 0"},
      {{"train.grad_accum=1048577"}, "train.grad_accum must be within 1 .. 1048576, got 1048577"},
      {{"train.seq_len=-1"}, "train.seq_len must be within 0 .. 16777216 (0 = model.max_seq_len), got -1"},
      {{"train.seq_len=16777217"}, "got 16777217"},
      {{"train.grad_clip=-0.5"}, "train.grad_clip must be >= 0 (0 disables), got -0.5"},
      {{"train.log_every=0"}, "train.log_every must be > 0, got 0"},
      {{"train.eval_every=-1"}, "train.eval_every must be >= 0, got -1"},
      {{"train.eval_batches=0"}, "train.eval_batches must be > 0 when evaluating"},
      {{"train.checkpoint_every=-1"}, "train.checkpoint_every must be >= 0, got -1"},
      {{"train.keep_checkpoints=0"}, "train.keep_checkpoints must be >= 1, got 0"},
      {{"train.oom_grow_after=-1"}, "train.oom_grow_after must be >= 0, got -1"},
      // optim
      {{"optim.impl=fused", "optim.type=sgd"},
       "optim.impl=fused runs adamw and adam with fp32 states only; use optim.impl=cpu for optim.type=sgd and "
       "optim.state_dtype=fp32"},
      {{"optim.impl=fused", "optim.state_dtype=bf16"}, "for optim.type=adamw and optim.state_dtype=bf16"},
      {{"optim.type=lion", "optim.state_dtype=int8", "offload.optimizer=cpu"},
       "optim.state_dtype=int8 quantises Adam's moments; use it with optim.type=adamw or adam, or "
       "optim.state_dtype=bf16 for optim.type=lion"},
      {{"optim.momentum=1"}, "optim.momentum must be in [0, 1), got 1"},
      {{"optim.dampening=1.5"}, "optim.dampening must be in [0, 1], got 1.5"},
      {{"optim.nesterov=true", "optim.dampening=0.1"},
       "optim.nesterov needs optim.momentum > 0 and optim.dampening = 0"},
      {{"optim.nesterov=true", "optim.momentum=0"}, "optim.nesterov needs"},
      {{"optim.cpu_threads=4097"}, "optim.cpu_threads must be within 0 .. 4096 (0 = automatic), got 4097"},
      {{"optim.cpu_threads=-1"}, "optim.cpu_threads must be within 0 .. 4096"},
      {{"optim.lr=0"}, "optim.lr must be > 0, got 0"},
      {{"optim.beta1=1"}, "optim.beta1 must be in [0, 1), got 1"},
      {{"optim.beta2=-0.1"}, "optim.beta2 must be in [0, 1), got -0.1"},
      {{"optim.eps=0"}, "optim.eps must be > 0, got 0"},
      {{"optim.weight_decay=-0.01"}, "optim.weight_decay must be >= 0, got -0.01"},
      {{"optim.warmup_steps=-1"}, "optim.warmup_steps must be >= 0, got -1"},
      {{"optim.min_lr_ratio=1.5"}, "optim.min_lr_ratio must be in [0, 1], got 1.5"},
      // scaler
      {{"scaler.init_scale=0"}, "scaler.init_scale must be > 0"},
      {{"scaler.growth_factor=1"}, "scaler.growth_factor must be > 1"},
      {{"scaler.backoff_factor=1"}, "scaler.backoff_factor must be in (0, 1)"},
      {{"scaler.backoff_factor=0"}, "scaler.backoff_factor must be in (0, 1)"},
      {{"scaler.growth_interval=0"}, "scaler.growth_interval must be > 0"},
      // monitor
      {{"monitor.period_s=0.005"}, "monitor.period_s must be in [0.01, 3600] seconds, got 0.005"},
      {{"monitor.period_s=3601"}, "monitor.period_s must be in [0.01, 3600] seconds, got 3601"},
      {{"monitor.metrics_port=65536"}, "monitor.metrics_port must be a TCP port in 1..65535, or 0 for off; got 65536"},
      {{"monitor.dashboard_port=-1"}, "monitor.dashboard_port must be a TCP port in 1..65535, or 0 for off; got -1"},
      // offload
      {{"offload.update_split=1.5"}, "offload.update_split must be auto or a fraction in [0, 1]; got '1.5'"},
      {{"offload.update_split=half"}, "offload.update_split must be auto or a fraction in [0, 1]; got 'half'"},
      {{"offload.host_ring=2", "offload.delayed_update=true"},
       "offload.host_ring=2 with offload.delayed_update=true: a delayed ring needs at least 3 slots"},
      {{"offload.resolve_every=-1"}, "offload.resolve_every must be >= 0 (0 = at start-up only), got -1"},
      {{"offload.gpu_memory_fraction=0"}, "offload.gpu_memory_fraction must be in (0, 1], got 0"},
      {{"offload.gpu_memory_fraction=1.01"}, "offload.gpu_memory_fraction must be in (0, 1], got 1.01"},
      {{"offload.host_memory_gib=-1"}, "offload.host_memory_gib must be >= 0 (0 = measured), got -1"},
      {{"offload.host_memory_fraction=0"}, "offload.host_memory_fraction must be in (0, 1], got 0"},
      // dist
      {{"dist.zero_stage=1"}, "dist.zero_stage must be 0 or 2; got 1"},
      {{"dist.zero_stage=3"}, "dist.zero_stage must be 0 or 2; got 3"},
      {{"dist.timeout_s=0"}, "dist.timeout_s must be > 0"},
      {{"dist.heartbeat_s=-1"}, "dist.heartbeat_s >= 0"},
      {{"dist.heartbeat_s=60", "dist.heartbeat_timeout_s=60"}, "dist.heartbeat_timeout_s above the period"},
      {{"dist.balance_after=0"}, "dist.balance_after must be >= 1, got 0"},
      {{"dist.pipeline_stages=0"}, "dist.pipeline_stages must be auto or a stage count >= 1; got '0'"},
      {{"dist.pipeline_stages=2x"}, "dist.pipeline_stages must be auto or a stage count >= 1; got '2x'"},
      {{"dist.pipeline_trace_steps=0"}, "dist.pipeline_trace_steps takes step numbers >= 1"},
      // placement
      {{"placement.threshold_w=0"}, "placement.threshold_w must be > 0 and placement.release_w in [0, threshold_w)"},
      {{"placement.release_w=200"}, "placement.release_w in [0, threshold_w)"},
      {{"placement.release_w=-1"}, "placement.release_w in [0, threshold_w)"},
      {{"placement.threshold_cpu_pct=0"}, "placement.threshold_cpu_pct must be in (0, 100], got 0"},
      {{"placement.threshold_cpu_pct=101"}, "placement.threshold_cpu_pct must be in (0, 100], got 101"},
      {{"placement.dwell_steps=0"}, "placement.dwell_steps, placement.profile_steps and placement.mirror_every"},
      {{"placement.profile_steps=0"}, "placement.dwell_steps, placement.profile_steps and placement.mirror_every"},
      {{"placement.mirror_every=0"}, "placement.dwell_steps, placement.profile_steps and placement.mirror_every"},
      {{"placement.gpu_power_budget_w=-1"}, "placement.gpu_power_budget_w and placement.max_step_s must be >= 0"},
      {{"placement.max_step_s=-0.5"}, "placement.gpu_power_budget_w and placement.max_step_s must be >= 0"},
  };
  for (const auto& c : cases) {
    Config cfg;
    const std::string set_error = error_of([&] { cfg = with(c.overrides); });
    ASSERT_EQ(set_error, "") << joined(c.overrides) << " should parse; validate_config is what refuses it";
    const std::string msg = error_of([&] { validate_config(cfg); });
    EXPECT_NE(msg.find(c.message), std::string::npos) << joined(c.overrides) << "\n  got: '" << msg << "'";
  }
}

TEST(ConfigValidate, ValuesAtTheEdgesOfEachRangeAreAccepted) {
  const std::vector<std::vector<std::string>> cases = {
      {"data.val_fraction=0"},
      {"data.prefetch=1"},
      {"data.prefetch=64"},
      {"data.synthetic_bytes=4096"},
      {"data.synthetic_bytes=17179869184"},
      {"train.steps=0"},
      {"train.micro_batch=1048576"},
      {"train.grad_accum=1048576"},
      {"train.seq_len=0"},
      {"train.seq_len=16777216"},
      {"train.grad_clip=0"},
      {"train.eval_every=0", "train.eval_batches=0"},  // no evaluation: its batch count does not matter
      {"train.keep_checkpoints=1"},
      {"optim.momentum=0"},
      {"optim.dampening=1"},
      {"optim.nesterov=true"},  // momentum 0.9, dampening 0
      {"optim.cpu_threads=0"},
      {"optim.cpu_threads=4096"},
      {"optim.beta1=0", "optim.beta2=0"},
      {"optim.min_lr_ratio=0"},
      {"optim.min_lr_ratio=1"},
      {"optim.impl=fused", "optim.type=adam"},
      {"optim.state_dtype=int8", "offload.optimizer=cpu"},
      {"monitor.period_s=0.01"},
      {"monitor.period_s=3600"},
      {"monitor.metrics_port=65535", "monitor.dashboard_port=1"},
      {"offload.update_split=0"},
      {"offload.update_split=1"},
      {"offload.update_split=0.25"},
      {"offload.host_ring=0"},
      {"offload.host_ring=64"},
      {"offload.host_ring=3", "offload.delayed_update=true"},
      {"offload.gpu_memory_fraction=1", "offload.host_memory_fraction=1"},
      {"dist.zero_stage=2"},
      {"dist.heartbeat_s=0"},
      {"dist.pipeline_stages=auto"},
      {"dist.pipeline_stages=4"},
      {"dist.pipeline_trace_steps="},
      {"placement.release_w=0"},
      {"placement.release_w=199"},
      {"placement.threshold_cpu_pct=100"},
      {"placement.gpu_power_budget_w=0", "placement.max_step_s=0"},
  };
  for (const auto& overrides : cases) {
    Config cfg;
    const std::string msg = error_of([&] {
      cfg = with(overrides);
      validate_config(cfg);
    });
    EXPECT_EQ(msg, "") << joined(overrides);
  }
}

TEST(ConfigValidate, CombinationsNoRunCanUseAreRefusedWithTheFix) {
  const std::vector<Refused> cases = {
      {{"offload.host_ring=4", "offload.delayed_update=true", "train.grad_accum=2"},
       "offload.host_ring=4 with offload.delayed_update=true and train.grad_accum=2: a delayed ring takes one "
       "micro-batch per step; set train.grad_accum=1"},
      {{"optim.state_dtype=int8"},
       "optim.state_dtype=int8 keeps Adam's states in 8 bits on the host for the offload "
       "engine: set offload.optimizer=cpu"},
      {{"placement.policy=threshold"},
       "placement.policy=threshold runs blocks from the CPU-side weight store: set "
       "offload.optimizer=cpu"},
      {{"placement.policy=cost", "offload.optimizer=cpu", "train.precision=fp16"},
       "placement.policy=cost runs blocks on the CPU in fp32 or bf16: set train.precision=bf16"},
  };
  for (const auto& c : cases) {
    const std::string msg = error_of([&] { validate_config(with(c.overrides)); });
    EXPECT_NE(msg.find(c.message), std::string::npos) << joined(c.overrides) << "\n  got: '" << msg << "'";
  }
  // Each fixed as its message says.
  const std::vector<std::vector<std::string>> fixed = {
      {"offload.host_ring=4", "offload.delayed_update=true", "train.grad_accum=1"},
      {"offload.host_ring=0", "offload.delayed_update=true", "train.grad_accum=2"},
      {"offload.host_ring=4", "offload.delayed_update=false", "train.grad_accum=2"},
      {"optim.state_dtype=int8", "offload.optimizer=cpu"},
      {"placement.policy=threshold", "offload.optimizer=cpu"},
      {"placement.policy=cost", "offload.optimizer=cpu", "train.precision=bf16"},
      {"placement.policy=off", "train.precision=fp16"},
  };
  for (const auto& overrides : fixed)
    EXPECT_EQ(error_of([&] { validate_config(with(overrides)); }), "") << joined(overrides);
}

// Configs built in code (the Python API, tests) skip the key parser, which refuses NaN: every
// range check must refuse it too.
TEST(ConfigValidate, NanSetInCodeIsRefusedByEveryRangeItReaches) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Field {
    const char* key;
    double* (*at)(Config&);
  };
  const std::vector<Field> fields = {
      {"data.val_fraction", [](Config& c) { return &c.data.val_fraction; }},
      {"train.grad_clip", [](Config& c) { return &c.train.grad_clip; }},
      {"optim.lr", [](Config& c) { return &c.optim.lr; }},
      {"optim.beta2", [](Config& c) { return &c.optim.beta2; }},
      {"optim.weight_decay", [](Config& c) { return &c.optim.weight_decay; }},
      {"scaler.init_scale", [](Config& c) { return &c.scaler.init_scale; }},
      {"monitor.period_s", [](Config& c) { return &c.monitor.period_s; }},
      {"offload.gpu_memory_fraction", [](Config& c) { return &c.offload.gpu_memory_fraction; }},
      {"offload.host_memory_gib", [](Config& c) { return &c.offload.host_memory_gib; }},
      {"dist.timeout_s", [](Config& c) { return &c.dist.timeout_s; }},
      {"placement.threshold_w", [](Config& c) { return &c.placement.threshold_w; }},
      {"placement.gpu_power_budget_w", [](Config& c) { return &c.placement.gpu_power_budget_w; }},
  };
  for (const auto& f : fields) {
    Config c;
    *f.at(c) = nan;
    const std::string msg = error_of([&] { validate_config(c); });
    EXPECT_NE(msg.find(f.key), std::string::npos) << f.key << " = NaN: '" << msg << "'";
  }
}

TEST(ConfigValidate, AnEmptyBindAddressIsRefused) {
  Config c;
  c.monitor.bind = "";
  EXPECT_NE(error_of([&] { validate_config(c); }).find("monitor.bind must be an address such as 127.0.0.1"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem
