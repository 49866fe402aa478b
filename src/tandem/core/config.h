#pragma once
// The run's configuration: one flat key space ("train.steps", "optim.lr", ...), filled from
// defaults, then the training recipe of the model's size and data (models/recipe.h), then YAML
// files, then DeepSpeed JSON files (formats/deepspeed.h), then --set overrides, in that order (Note
// [Config layers], io/config_layers.h). Every key is declared once in config_keys.cpp with its
// type and a one-line doc; an unknown key is an error naming the closest valid one. A key with a
// fixed set of values is an enum field, its names in one table per enum (config_enums.cpp).

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tandem/core/config_values.h"

namespace tandem {

/// Arithmetic used for the forward and backward passes.
enum class Precision { kFp32, kBf16, kFp16 };
/// Learning-rate shape after warmup.
enum class LrSchedule { kCosine, kLinear, kConstant };
/// Where the optimizer keeps its state and runs (offload engine: a later layer).
enum class OffloadTarget { kNone, kCpu };
/// data.format: how a token file is read (auto: by its header and extension, Note [Token file detection]).
enum class TokenFormat { kAuto, kNanoGpt, kLlmc, kText };
/// train.progress: a bar on a terminal, log lines otherwise (auto), or nothing.
enum class ProgressMode { kAuto, kBar, kLines, kOff };
/// optim.type: the update rule.
enum class OptimizerType { kAdamW, kAdam, kSgd, kLion };
/// optim.impl: LibTorch's multi-tensor kernel (fused) or tandem's CPU kernels; auto by device.
enum class OptimizerImpl { kAuto, kFused, kCpu };
/// optim.state_dtype: optimizer state precision (int8: Adam's states in 8 bits with a scale per 2048
/// elements, the offload engine's host states; Note [8-bit states]).
enum class StateDtype { kFp32, kBf16, kInt8 };
/// Host bytes of one optimizer-state buffer of n elements in this precision (int8: the codes and a
/// 4-byte scale per 2048 elements).
int64_t state_buffer_bytes(StateDtype d, int64_t n);
/// optim.state_rounding: how bf16 states and 8-bit codes are rounded (Note [8-bit stochastic codes]).
enum class StateRounding { kNearest, kStochastic };
/// optim.device_state_dtype: the offload engine's GPU-updated Blocks' m and v (Note [Device Adam]);
/// auto: bf16 where optim.state_dtype is bf16 or int8, fp32 otherwise.
enum class DeviceStateDtype { kAuto, kFp32, kBf16 };
/// The device states' bytes per element that `d` resolves to with host states `host`.
int64_t device_state_bytes(DeviceStateDtype d, StateDtype host);
/// optim.master_dtype: the offload engine's master weights on the host (Note [bf16 master]).
enum class MasterDtype { kFp32, kBf16 };
/// optim.master_rounding: how a bf16 master takes its update: stochastic rounding (2 bytes a
/// parameter) or rounding to nearest with a bf16 Kahan compensation (4 bytes).
enum class MasterRounding { kStochastic, kKahan };
/// Host bytes a parameter of the master takes with these settings.
int64_t master_bytes(MasterDtype d, MasterRounding r);
/// optim.cpu_isa: the CPU kernels' instruction set (auto: the best CPUID allows).
enum class CpuIsaChoice { kAuto, kScalar, kAvx2, kAvx512, kAvx512Bf16 };
/// offload.speculate: CPU updates during backward with an undo log (Note [Speculative clipping]).
enum class Speculation { kAuto, kAlways, kNever };
/// dist.backend: the device collectives (auto: NCCL for GPUs, Gloo for the CPU).
enum class DistBackend { kAuto, kNccl, kGloo };
/// dist.pipeline_schedule: the order in which a pipeline stage runs its micro-batches (Note [Pipeline schedules]).
enum class PipelineSchedule {
  kGPipe,  ///< every forward, then every backward: a stage holds all m micro-batches' activations
  k1F1B,   ///< one forward, one backward in the steady state: stage s holds at most p - s of them
};
/// placement.policy: where Blocks run per step (Note [Placement policies]).
enum class PlacementPolicyKind { kOff, kStatic, kThreshold, kCost };
/// placement.objective: what the cost model optimises.
enum class PlacementObjective { kThroughput, kEnergy };
/// What data.path names: the generated default corpus, or real token data (a token or text file).
/// Not a key of its own; the training recipe depends on it (models/recipe.h).
enum class DataKind { kSynthetic, kReal };

/// The name of an enum value as the config writes it (one table per enum, config_enums.cpp).
const char* to_string(Precision v);
const char* to_string(LrSchedule v);
const char* to_string(OffloadTarget v);
const char* to_string(TokenFormat v);
const char* to_string(ProgressMode v);
const char* to_string(OptimizerType v);
const char* to_string(OptimizerImpl v);
const char* to_string(StateDtype v);
const char* to_string(StateRounding v);
const char* to_string(DeviceStateDtype v);
const char* to_string(MasterDtype v);
const char* to_string(MasterRounding v);
const char* to_string(CpuIsaChoice v);
const char* to_string(Speculation v);
const char* to_string(DistBackend v);
const char* to_string(PipelineSchedule v);
const char* to_string(PlacementPolicyKind v);
const char* to_string(PlacementObjective v);
const char* to_string(DataKind v);

/// Model selection: a preset plus optional overrides of its fields (unset = preset value).
struct ModelConfig {
  std::string preset = "tiny";
  std::optional<int64_t> n_layer, d_model, n_head, n_kv_head, d_ff, vocab_size, max_seq_len;
  std::optional<bool> tie_embeddings;
  std::optional<double> rope_theta, norm_eps;
  std::optional<int64_t> n_experts, top_k;                ///< MoE presets (null = preset)
  std::optional<int64_t> n_dense;                         ///< AMX+MoE: dense layers before the MoE ones
  std::optional<double> capacity_factor, moe_aux_weight;  ///< ResNet-BK MoE (null = preset)
  bool checkpointing = false;  ///< recompute each decoder block in backward (activation checkpointing)
  /// The first N decoder layers (-1: all) send their saved activations to pinned host memory instead
  /// of recomputing them or keeping them on the GPU (Note [Activation offload]); 0 = none;
  /// kAutoActivationOffload ("auto"): as many as the link hides (Note [Automatic activation offload]).
  int64_t activation_offload = 0;
  static constexpr int64_t kAutoActivationOffload = -2;
  std::string init_from;       ///< HF LLaMA directory: architecture from its config.json, weights from its safetensors
};

/// Where the tokens come from.
struct DataConfig {
  std::string path = "synthetic";  ///< "synthetic", a token file (.bin) or a text file
  TokenFormat format = TokenFormat::kAuto;
  std::string val_path;  ///< held-out file; empty = the last val_fraction of `path`
  double val_fraction = 0.05;
  int64_t synthetic_bytes = 2'000'000;  ///< size of the generated corpus
  int64_t prefetch = 2;                 ///< batches prepared ahead by the loader thread

  /// kSynthetic for path "synthetic", kReal for any file.
  DataKind kind() const;
};

/// The step loop.
struct TrainConfig {
  int64_t steps = 300;
  int64_t micro_batch = 16;
  int64_t seq_len = 0;  ///< 0 = the model's max_seq_len
  int64_t grad_accum = 1;
  double grad_clip = 1.0;  ///< global-norm clipping; 0 disables
  Precision precision = Precision::kFp32;
  DeviceSpec device;  ///< auto | cpu | cuda | cuda:N
  uint64_t seed = 1337;
  int64_t eval_every = 100;  ///< 0 disables evaluation
  int64_t eval_batches = 8;
  int64_t log_every = 10;
  int64_t checkpoint_every = 0;  ///< 0 = only at the end
  int64_t keep_checkpoints = 3;
  bool save_final = true;
  bool async_checkpoint = true;  ///< write checkpoints from a snapshot on a background thread
  bool oom_retry = true;         ///< halve the micro-batch and retry the step on out-of-memory
  int64_t oom_grow_after = 0;    ///< clean steps before trying a doubled micro-batch again; 0 = never
  bool tf32 = true;
  bool cudnn_benchmark = true;
  bool deterministic = false;  ///< deterministic kernels (reproducible runs; slower attention backward)
  std::string run_dir;         ///< empty = runs/<time>-<preset>
  ProgressMode progress = ProgressMode::kAuto;
};

/// AdamW and the learning-rate schedule. The defaults of lr .. weight_decay are the generic recipe
/// (models/recipe.h, Note [Training recipes]), for a model of unknown size; `tandem` lays the
/// recipe of the preset's size and the data over them.
struct OptimConfig {
  OptimizerType type = OptimizerType::kAdamW;
  OptimizerImpl impl = OptimizerImpl::kAuto;
  StateDtype state_dtype = StateDtype::kFp32;  ///< bf16: CPU kernels
  StateRounding state_rounding = StateRounding::kNearest;
  DeviceStateDtype device_state_dtype = DeviceStateDtype::kAuto;  ///< GPU-updated Blocks' m and v
  MasterDtype master_dtype = MasterDtype::kFp32;  ///< bf16: the offload engine's CPU-updated Blocks
  MasterRounding master_rounding = MasterRounding::kStochastic;
  double momentum = 0.9;    ///< SGD momentum (0 = plain SGD)
  double dampening = 0.0;   ///< SGD dampening
  bool nesterov = false;    ///< SGD Nesterov momentum
  int64_t cpu_threads = 0;  ///< CPU kernel threads; 0 = TANDEM_CPU_THREADS, OMP_NUM_THREADS or all
  CpuIsaChoice cpu_isa = CpuIsaChoice::kAuto;
  bool cpu_pin = false;  ///< pin CPU kernel threads to cores
  double lr = 3e-4;
  double min_lr_ratio = 0.1;  ///< cosine/linear decay floor as a fraction of lr
  int64_t warmup_steps = 30;  ///< the recipe's rule at the default train.steps (recipe_warmup_steps)
  int64_t decay_steps = 0;    ///< 0 = train.steps
  double warmup_min_lr = 0.0;
  LrSchedule schedule = LrSchedule::kCosine;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  /// Weight decay of 1-D parameters (norm scales, biases): off, as GPT and LLaMA recipes train; on,
  /// as torch.optim.AdamW decays every parameter of its group.
  bool decay_1d = false;
};

/// Dynamic loss scaling for fp16.
struct ScalerConfig {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double min_scale = 1.0;
  bool dynamic = true;  ///< false: the scale stays at init_scale
};

/// Telemetry (monitor/): the sampler thread and what it feeds.
struct MonitorConfig {
  bool enabled = true;             ///< GPU (NVML) and host (/proc, RAPL) sampling, energy per step
  double period_s = 0.5;           ///< sampling period
  int64_t metrics_port = 0;        ///< Prometheus /metrics on this port; 0 = off (--metrics-port)
  int64_t dashboard_port = 0;      ///< live dashboard on this port; 0 = off (--dashboard)
  std::string bind = "127.0.0.1";  ///< address the endpoints listen on (loopback by default)
  bool tensorboard = false;        ///< TensorBoard scalars in <run dir>/tensorboard (--tensorboard)
  std::string chartjs;             ///< Chart.js UMD file the dashboard serves; "" = Debian's libjs-chart.js
};

/// Offload settings (consumed by the heterogeneous engine).
struct OffloadConfig {
  OffloadTarget optimizer = OffloadTarget::kNone;
  bool pin_memory = true;
  std::string update_split = "auto";  ///< k: fraction of decoder Blocks updated on the GPU, "auto" = solved
  int64_t resolve_every = 50;         ///< auto k: re-solve every this many steps (0 = only at start-up)
  bool delayed_update = false;        ///< opt-in one-step delayed update (weights may lag one step)
  int64_t delayed_after = 0;          ///< with delayed_update: the first N updates exact, then delayed
  Speculation speculate = Speculation::kAuto;
  double gpu_memory_fraction = 0.92;  ///< share of the GPU's memory the plan may use
  double host_memory_fraction = 0.8;  ///< share of the host's available memory the plan may pin
  /// Host memory the plan assumes, GiB; 0 = MemAvailable now (a VM whose memory grows as it is
  /// used reports too little at start: give its limit here).
  double host_memory_gib = 0;
  std::string trace_steps;  ///< steps (1-based, comma list) traced into <run dir>/trace.json
  /// Host landing/staging buffers: -1 auto (per Block when the plan fits the host, else a ring of
  /// 4 slots), 0 per Block, N > 0 a ring of N slots shared by the CPU-updated Blocks.
  int64_t host_ring = -1;
  /// Note [NVMe tier]: a directory for the states of the Blocks past the host ("" = none), and how
  /// many of the last CPU-updated Blocks keep their states there (-1 = as the memory plan needs).
  std::string nvme_path;
  int64_t nvme_blocks = -1;
};

/// Several processes (parallel/): how they meet, reduce and share the optimizer state.
struct DistConfig {
  DistBackend backend = DistBackend::kAuto;
  int64_t zero_stage = 0;           ///< 0: every rank holds all masters and states; 2: sharded (ZeRO-2 style)
  double timeout_s = 300;           ///< rendezvous and collective timeout
  double heartbeat_s = 2;           ///< heartbeat period in the store; 0 = off
  double heartbeat_timeout_s = 60;  ///< a rank silent this long is lost: the ranks exit for a restart
  /// Rows of the global micro-batch per rank: equal | auto (measured speed and memory after
  /// balance_after steps) | a comma list, one count per rank summing to micro_batch x world.
  RowBalance balance;
  int64_t balance_after = 5;
  /// Pipeline parallel (Note [Pipeline parallel]): "1" (none), a stage count dividing the world, or
  /// "auto" (the partitioner's choice, Note [Pipeline partition]); read with pipeline_stage_count().
  std::string pipeline_stages = "1";
  PipelineSchedule pipeline_schedule = PipelineSchedule::k1F1B;
  /// Where stage s's Blocks end, a comma list of p - 1 Block indices; "even" = equal Block counts;
  /// "" = the partitioner's cut (Note [Pipeline partition]).
  PipelineCut pipeline_cut;
  /// The device of each stage, a comma list (cuda, cuda:N, cpu); "" = every stage on train.device.
  /// A cpu stage computes its Blocks on the host's cores beside the GPU stages (seed 000's hybrid).
  StageDevices pipeline_devices;
  /// Steps (1-based, comma list) drawn into <run dir>/pipeline_trace.json, one track per stage.
  std::string pipeline_trace_steps = "4";
};

/// dist.pipeline_stages as a count; 0 = auto. UserError for anything else.
int64_t pipeline_stage_count(const DistConfig& d);

/// Where each Block runs per step, CPU or GPU (sched/placement.h, Note [Block placement]).
struct PlacementConfig {
  PlacementPolicyKind policy = PlacementPolicyKind::kOff;
  StaticBlocks blocks;  ///< static: gpu | cpu (every movable Block) | one letter per Block, G or C
  /// Blocks that may run on the CPU: "" = every decoder layer, "none", or a comma list of Block indices (0 = embedding)
  MovableBlocks movable;
  double threshold_w = 200;       ///< threshold: GPU power above which a Block moves to the CPU
  double threshold_cpu_pct = 80;  ///< threshold: the CPU must be less busy than this
  double release_w = 20;          ///< threshold: a Block comes back under threshold_w - release_w
  int64_t dwell_steps = 5;        ///< threshold: steps between two moves
  PlacementObjective objective = PlacementObjective::kThroughput;  ///< cost: under gpu_power_budget_w | max_step_s
  /// cost: software GPU power budget, W (0 = none); the GPU's own limit is never changed
  double gpu_power_budget_w = 0;
  double max_step_s = 0;      ///< cost, energy: the step-time ceiling (the throughput floor); 0 = none
  int64_t profile_steps = 2;  ///< cost: steps per profile probe (the last one is measured)
  int64_t mirror_every = 1;   ///< device copies of CPU-updated Blocks refreshed every N updates (1 = exact)
};

/// The whole configuration of a run.
struct Config {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  OptimConfig optim;
  ScalerConfig scaler;
  MonitorConfig monitor;
  OffloadConfig offload;
  DistConfig dist;
  PlacementConfig placement;
};

/// One settable key: its dotted name, a one-line description, and its current value as text.
struct ConfigKeyInfo {
  std::string name;
  std::string type;
  std::string doc;
};

/// Every valid key, in declaration order.
std::vector<ConfigKeyInfo> config_keys();
std::vector<std::string> config_key_names();

/// Sets one key from text; throws UserError for an unknown key (naming the closest) or a bad value.
/// `origin` prefixes the message (e.g. "run.yaml:4").
void set_config_key(Config& cfg, const std::string& key, const std::string& value, const std::string& origin = "");

/// Reads one key as text.
std::string get_config_key(const Config& cfg, const std::string& key);

/// Applies a "key=value" override (from --set).
void apply_override(Config& cfg, const std::string& assignment);

/// Loads a YAML file (nested maps flatten to dotted keys) into cfg.
void load_yaml_config(Config& cfg, const std::string& path);
/// Parses YAML text (for tests and resumed runs); `origin` names the source in messages.
void load_yaml_config_text(Config& cfg, const std::string& text, const std::string& origin);

/// The full configuration as YAML (every key, nested), for run directories and `tandem config`.
std::string config_to_yaml(const Config& cfg);

/// Stable hash of the configuration (hex), to check that ranks or a resume agree.
std::string config_hash(const Config& cfg);

/// A comma list of 1-based step numbers ("5,6"; empty = none), sorted, without repeats; UserError
/// naming `key` otherwise.
std::vector<int64_t> parse_step_list(const std::string& s, const std::string& key);
/// offload.update_split: the fixed k in [0, 1], or nullopt for "auto"; UserError otherwise.
std::optional<double> parse_update_split(const std::string& s);

/// Checks every section's values and the combinations no run could use (config_validate.cpp);
/// UserError naming the key and the fix.
void validate_config(const Config& cfg);

}  // namespace tandem
