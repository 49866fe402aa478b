// validate_config: each section's values, then the combinations no run could use. Every message
// names the key and what to set instead. Enum keys need no check here: their parser accepts only
// the names in their table (config_enums.cpp).
#include <cstdint>
#include <utility>

#include "tandem/core/config.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

// Upper bounds far beyond any run keep the sizes computed from them within int64 (the memory
// estimate refuses what does not fit the machine, with the numbers, Note [Host fit]).
constexpr int64_t kMaxRows = int64_t{1} << 20, kMaxTokens = int64_t{1} << 24;

void validate_data(const DataConfig& d) {
  TANDEM_CHECK(d.val_fraction >= 0 && d.val_fraction < 1, "data.val_fraction must be in [0, 1), got ", d.val_fraction);
  TANDEM_CHECK(d.prefetch >= 1 && d.prefetch <= 64, "data.prefetch must be within 1 .. 64, got ", d.prefetch);
  TANDEM_CHECK(d.synthetic_bytes >= 4096 && d.synthetic_bytes <= (int64_t{1} << 34),
               "data.synthetic_bytes must be within 4096 .. 16 GiB (for more text, give data.path), got ",
               d.synthetic_bytes);
}

void validate_model(const ModelConfig& m) {
  TANDEM_CHECK(m.activation_offload >= ModelConfig::kAutoActivationOffload,
               "model.activation_offload must be auto, -1 (every decoder layer), 0 (none) or a number of layers, got ",
               m.activation_offload);
}

void validate_train(const TrainConfig& t) {
  TANDEM_CHECK(t.steps >= 0, "train.steps must be >= 0, got ", t.steps);
  TANDEM_CHECK(t.micro_batch > 0, "train.micro_batch must be > 0, got ", t.micro_batch);
  TANDEM_CHECK(t.micro_batch <= kMaxRows, "train.micro_batch must be within 1 .. ", kMaxRows, ", got ", t.micro_batch);
  TANDEM_CHECK(t.grad_accum > 0, "train.grad_accum must be > 0, got ", t.grad_accum);
  TANDEM_CHECK(t.grad_accum <= kMaxRows, "train.grad_accum must be within 1 .. ", kMaxRows, ", got ", t.grad_accum);
  TANDEM_CHECK(t.seq_len >= 0 && t.seq_len <= kMaxTokens, "train.seq_len must be within 0 .. ", kMaxTokens,
               " (0 = model.max_seq_len), got ", t.seq_len);
  TANDEM_CHECK(t.grad_clip >= 0, "train.grad_clip must be >= 0 (0 disables), got ", t.grad_clip);
  TANDEM_CHECK(t.log_every > 0, "train.log_every must be > 0, got ", t.log_every);
  TANDEM_CHECK(t.eval_every >= 0, "train.eval_every must be >= 0, got ", t.eval_every);
  TANDEM_CHECK(t.eval_every == 0 || t.eval_batches > 0, "train.eval_batches must be > 0 when evaluating");
  TANDEM_CHECK(t.checkpoint_every >= 0, "train.checkpoint_every must be >= 0, got ", t.checkpoint_every);
  TANDEM_CHECK(t.keep_checkpoints >= 1, "train.keep_checkpoints must be >= 1, got ", t.keep_checkpoints);
  TANDEM_CHECK(t.oom_grow_after >= 0, "train.oom_grow_after must be >= 0, got ", t.oom_grow_after);
}

void validate_optim(const OptimConfig& o) {
  const bool adam = o.type == OptimizerType::kAdamW || o.type == OptimizerType::kAdam;
  TANDEM_CHECK(o.impl != OptimizerImpl::kFused || (o.state_dtype == StateDtype::kFp32 && adam),
               "optim.impl=fused runs adamw and adam with fp32 states only; use optim.impl=cpu for optim.type=",
               to_string(o.type), " and optim.state_dtype=", to_string(o.state_dtype));
  TANDEM_CHECK(o.state_dtype != StateDtype::kInt8 || adam,
               "optim.state_dtype=int8 quantises Adam's moments; use it "
               "with optim.type=adamw or adam, or optim.state_dtype=bf16 for optim.type=",
               to_string(o.type));
  TANDEM_CHECK(o.momentum >= 0 && o.momentum < 1, "optim.momentum must be in [0, 1), got ", o.momentum);
  TANDEM_CHECK(o.dampening >= 0 && o.dampening <= 1, "optim.dampening must be in [0, 1], got ", o.dampening);
  TANDEM_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
               "optim.nesterov needs optim.momentum > 0 and optim.dampening = 0");
  TANDEM_CHECK(o.cpu_threads >= 0 && o.cpu_threads <= 4096,
               "optim.cpu_threads must be within 0 .. 4096 (0 = automatic), got ", o.cpu_threads);
  TANDEM_CHECK(o.lr > 0, "optim.lr must be > 0, got ", o.lr);
  TANDEM_CHECK(o.beta1 >= 0 && o.beta1 < 1, "optim.beta1 must be in [0, 1), got ", o.beta1);
  TANDEM_CHECK(o.beta2 >= 0 && o.beta2 < 1, "optim.beta2 must be in [0, 1), got ", o.beta2);
  TANDEM_CHECK(o.eps > 0, "optim.eps must be > 0, got ", o.eps);
  TANDEM_CHECK(o.weight_decay >= 0, "optim.weight_decay must be >= 0, got ", o.weight_decay);
  TANDEM_CHECK(o.warmup_steps >= 0, "optim.warmup_steps must be >= 0, got ", o.warmup_steps);
  TANDEM_CHECK(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1, "optim.min_lr_ratio must be in [0, 1], got ",
               o.min_lr_ratio);
}

void validate_scaler(const ScalerConfig& s) {
  TANDEM_CHECK(s.init_scale > 0, "scaler.init_scale must be > 0");
  TANDEM_CHECK(s.growth_factor > 1, "scaler.growth_factor must be > 1");
  TANDEM_CHECK(s.backoff_factor > 0 && s.backoff_factor < 1, "scaler.backoff_factor must be in (0, 1)");
  TANDEM_CHECK(s.growth_interval > 0, "scaler.growth_interval must be > 0");
}

void validate_monitor(const MonitorConfig& m) {
  TANDEM_CHECK(m.period_s >= 0.01 && m.period_s <= 3600, "monitor.period_s must be in [0.01, 3600] seconds, got ",
               m.period_s);
  for (const auto& [key, port] : {std::pair<const char*, int64_t>{"monitor.metrics_port", m.metrics_port},
                                  {"monitor.dashboard_port", m.dashboard_port}})
    TANDEM_CHECK(port >= 0 && port <= 65535, key, " must be a TCP port in 1..65535, or 0 for off; got ", port);
  TANDEM_CHECK(!m.bind.empty(), "monitor.bind must be an address such as 127.0.0.1");
}

void validate_offload(const OffloadConfig& o) {
  (void)parse_update_split(o.update_split);
  (void)parse_step_list(o.trace_steps, "offload.trace_steps");
  TANDEM_CHECK(o.host_ring >= -1 && o.host_ring <= 64,
               "offload.host_ring must be -1 (auto), 0 (per block) or a slot count up to 64; got ", o.host_ring);
  TANDEM_CHECK(o.host_ring <= 0 || o.host_ring >= 3 || !o.delayed_update, "offload.host_ring=", o.host_ring,
               " with offload.delayed_update=true: a delayed ring needs at least 3 slots; set offload.host_ring=4");
  TANDEM_CHECK(o.nvme_blocks >= -1, "offload.nvme_blocks must be -1 (as the plan needs), 0 or a block count; got ",
               o.nvme_blocks);
  TANDEM_CHECK(o.nvme_blocks <= 0 || !o.nvme_path.empty(), "offload.nvme_blocks=", o.nvme_blocks,
               " needs a directory for the states: set offload.nvme_path");
  TANDEM_CHECK(o.nvme_path.empty() || o.speculate != Speculation::kAlways,
               "offload.nvme_path: the NVMe tier updates each block once the norm is known (no undo log on disk); set "
               "offload.speculate=auto or never");
  TANDEM_CHECK(o.delayed_after >= 0, "offload.delayed_after must be >= 0 (0 = delayed from the start), got ",
               o.delayed_after);
  TANDEM_CHECK(o.delayed_after == 0 || o.delayed_update, "offload.delayed_after=", o.delayed_after,
               " does nothing without the delayed update: set offload.delayed_update=true or offload.delayed_after=0");
  TANDEM_CHECK(o.resolve_every >= 0, "offload.resolve_every must be >= 0 (0 = at start-up only), got ",
               o.resolve_every);
  TANDEM_CHECK(o.gpu_memory_fraction > 0 && o.gpu_memory_fraction <= 1,
               "offload.gpu_memory_fraction must be in (0, 1], got ", o.gpu_memory_fraction);
  TANDEM_CHECK(o.host_memory_gib >= 0, "offload.host_memory_gib must be >= 0 (0 = measured), got ", o.host_memory_gib);
  TANDEM_CHECK(o.host_memory_fraction > 0 && o.host_memory_fraction <= 1,
               "offload.host_memory_fraction must be in (0, 1], got ", o.host_memory_fraction);
}

void validate_dist(const DistConfig& d) {
  TANDEM_CHECK(d.zero_stage == 0 || d.zero_stage == 2, "dist.zero_stage must be 0 or 2; got ", d.zero_stage);
  TANDEM_CHECK(d.timeout_s > 0 && d.heartbeat_s >= 0 && d.heartbeat_timeout_s > d.heartbeat_s,
               "dist.timeout_s must be > 0, dist.heartbeat_s >= 0 and dist.heartbeat_timeout_s above the period");
  TANDEM_CHECK(d.balance_after >= 1, "dist.balance_after must be >= 1, got ", d.balance_after);
  pipeline_stage_count(d);  // throws for a malformed count
  (void)parse_step_list(d.pipeline_trace_steps, "dist.pipeline_trace_steps");
}

void validate_placement(const PlacementConfig& pl) {
  TANDEM_CHECK(pl.threshold_w > 0 && pl.release_w >= 0 && pl.release_w < pl.threshold_w,
               "placement.threshold_w must be > 0 and placement.release_w in [0, threshold_w)");
  TANDEM_CHECK(pl.threshold_cpu_pct > 0 && pl.threshold_cpu_pct <= 100,
               "placement.threshold_cpu_pct must be in (0, 100], got ", pl.threshold_cpu_pct);
  TANDEM_CHECK(pl.dwell_steps >= 1 && pl.profile_steps >= 1 && pl.mirror_every >= 1,
               "placement.dwell_steps, placement.profile_steps and placement.mirror_every must be >= 1");
  TANDEM_CHECK(pl.gpu_power_budget_w >= 0 && pl.max_step_s >= 0,
               "placement.gpu_power_budget_w and placement.max_step_s must be >= 0");
}

// Values each valid alone that no run can use together.
void validate_combinations(const Config& c) {
  TANDEM_CHECK(c.offload.host_ring <= 0 || !c.offload.delayed_update || c.train.grad_accum == 1,
               "offload.host_ring=", c.offload.host_ring,
               " with offload.delayed_update=true and train.grad_accum=", c.train.grad_accum,
               ": a delayed ring takes one micro-batch per step; set train.grad_accum=1 (a larger "
               "train.micro_batch instead) or offload.host_ring=0");
  TANDEM_CHECK(c.optim.state_dtype != StateDtype::kInt8 || c.offload.optimizer == OffloadTarget::kCpu,
               "optim.state_dtype=int8 keeps Adam's states in 8 bits on the host for the offload engine: set "
               "offload.optimizer=cpu, or use optim.state_dtype=bf16 (optim.impl=cpu) or fp32");
  TANDEM_CHECK(c.offload.nvme_path.empty() || c.offload.optimizer == OffloadTarget::kCpu,
               "offload.nvme_path holds the CPU-updated blocks' optimizer states of the offload engine: set "
               "offload.optimizer=cpu, or unset offload.nvme_path");
  TANDEM_CHECK(c.optim.master_dtype != MasterDtype::kBf16 || c.offload.optimizer == OffloadTarget::kCpu,
               "optim.master_dtype=bf16 keeps the master weights in bf16 on the host for the offload engine: set "
               "offload.optimizer=cpu, or leave optim.master_dtype=fp32");
  TANDEM_CHECK(c.optim.master_rounding != MasterRounding::kKahan || c.optim.master_dtype == MasterDtype::kBf16,
               "optim.master_rounding=kahan compensates a bf16 master: set optim.master_dtype=bf16 too, or leave "
               "optim.master_rounding unset for the fp32 master");
  const auto& pl = c.placement;
  TANDEM_CHECK(pl.policy == PlacementPolicyKind::kOff || c.offload.optimizer == OffloadTarget::kCpu,
               "placement.policy=", to_string(pl.policy),
               " runs blocks from the CPU-side weight store: set offload.optimizer=cpu");
  TANDEM_CHECK(pl.policy == PlacementPolicyKind::kOff || c.train.precision != Precision::kFp16,
               "placement.policy=", to_string(pl.policy),
               " runs blocks on the CPU in fp32 or bf16: set train.precision=bf16");
}

}  // namespace

void validate_config(const Config& c) {
  validate_data(c.data);
  validate_model(c.model);
  validate_train(c.train);
  validate_optim(c.optim);
  validate_scaler(c.scaler);
  validate_monitor(c.monitor);
  validate_offload(c.offload);
  validate_dist(c.dist);
  validate_placement(c.placement);
  validate_combinations(c);
}

}  // namespace tandem
