#include "tandem/core/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "tandem/core/config_enums.h"
#include "tandem/core/error.h"
#include "tandem/core/strings.h"

namespace tandem {
namespace {

// ---- value parsing --------------------------------------------------------------------------

int64_t parse_int(const std::string& key, const std::string& v) {
  try {
    size_t pos = 0;
    const long long x = std::stoll(v, &pos);
    if (pos == v.size()) return x;
    // Accept integral floats written as 1e6.
    const double d = std::stod(v, &pos);
    if (pos == v.size() && std::floor(d) == d && std::fabs(d) < 9e18) return static_cast<int64_t>(d);
  } catch (const std::exception&) {
  }
  TANDEM_FAIL("'", key, "' expects an integer, got '", v, "'");
}

double parse_double(const std::string& key, const std::string& v) {
  try {
    size_t pos = 0;
    const double x = std::stod(v, &pos);
    if (pos == v.size() && std::isfinite(x)) return x;
  } catch (const std::exception&) {
  }
  TANDEM_FAIL("'", key, "' expects a finite number, got '", v, "'");
}

bool parse_bool(const std::string& key, const std::string& v) {
  const std::string s = to_lower(v);
  if (s == "true" || s == "yes" || s == "on" || s == "1") return true;
  if (s == "false" || s == "no" || s == "off" || s == "0") return false;
  TANDEM_FAIL("'", key, "' expects true or false, got '", v, "'");
}

bool is_null(const std::string& v) {
  const std::string s = to_lower(v);
  return s.empty() || s == "~" || s == "null" || s == "none" || s == "preset";
}

std::string fmt_double(double x) {
  std::ostringstream os;
  os.precision(17);
  os << x;
  return os.str();
}

// ---- the key registry -----------------------------------------------------------------------

struct Field {
  std::string name, type, doc;
  std::function<void(Config&, const std::string&)> set;
  std::function<std::string(const Config&)> get;
};

template <typename Get>
Field int_field(std::string name, std::string doc, Get get) {
  return {name, "int", std::move(doc), [get, name](Config& c, const std::string& v) { get(c) = parse_int(name, v); },
          [get](const Config& c) { return std::to_string(get(const_cast<Config&>(c))); }};
}
/// An integer key that also takes "auto", stored as `auto_value` and written back as "auto".
template <typename Get>
Field int_or_auto_field(std::string name, std::string doc, Get get, int64_t auto_value) {
  return {name, "int|auto", std::move(doc),
          [get, name, auto_value](Config& c, const std::string& v) {
            if (to_lower(trim(v)) == "auto") {
              get(c) = auto_value;
              return;
            }
            const int64_t x = parse_int(name, v);
            TANDEM_CHECK(x != auto_value, "'", name, "' takes auto or a number, and ", x,
                         " stands for auto inside: write auto");
            get(c) = x;
          },
          [get, auto_value](const Config& c) {
            const int64_t x = get(const_cast<Config&>(c));
            return x == auto_value ? std::string("auto") : std::to_string(x);
          }};
}
template <typename Get>
Field uint_field(std::string name, std::string doc, Get get) {
  return {name, "int", std::move(doc),
          [get, name](Config& c, const std::string& v) {
            // Every uint64 reads back as written (a seed of 2^63 or more included).
            if (!v.empty() && v.find_first_not_of("0123456789") == std::string::npos) {
              try {
                get(c) = std::stoull(v);
                return;
              } catch (const std::out_of_range&) {
                TANDEM_FAIL("'", name, "' must be below 2^64, got ", v);
              }
            }
            const int64_t x = parse_int(name, v);
            TANDEM_CHECK(x >= 0, "'", name, "' must be >= 0, got ", v);
            get(c) = static_cast<uint64_t>(x);
          },
          [get](const Config& c) { return std::to_string(get(const_cast<Config&>(c))); }};
}
template <typename Get>
Field double_field(std::string name, std::string doc, Get get) {
  return {name, "float", std::move(doc),
          [get, name](Config& c, const std::string& v) { get(c) = parse_double(name, v); },
          [get](const Config& c) { return fmt_double(get(const_cast<Config&>(c))); }};
}
template <typename Get>
Field bool_field(std::string name, std::string doc, Get get) {
  return {name, "bool", std::move(doc), [get, name](Config& c, const std::string& v) { get(c) = parse_bool(name, v); },
          [get](const Config& c) { return std::string(get(const_cast<Config&>(c)) ? "true" : "false"); }};
}
template <typename Get>
Field string_field(std::string name, std::string doc, Get get) {
  return {name, "string", std::move(doc), [get](Config& c, const std::string& v) { get(c) = v; },
          [get](const Config& c) { return get(const_cast<Config&>(c)); }};
}
/// A keyword-or-value key (config_values.h): parsed once here, written back as the user would.
template <typename T, typename Get>
Field value_field(std::string name, std::string type, std::string doc, Get get) {
  return {name, std::move(type), std::move(doc),
          [get, name](Config& c, const std::string& v) { get(c) = T::parse(v, name); },
          [get](const Config& c) { return get(const_cast<Config&>(c)).str(); }};
}
/// An optional field: "null" (or empty) resets it to "use the preset".
template <typename Get, typename Parse, typename Format>
Field optional_field(std::string name, std::string type, std::string doc, Get get, Parse parse, Format format) {
  return {name, std::move(type), std::move(doc),
          [get, name, parse](Config& c, const std::string& v) {
            if (is_null(v))
              get(c).reset();
            else
              get(c) = parse(name, v);
          },
          [get, format](const Config& c) {
            const auto& o = get(const_cast<Config&>(c));
            return o ? format(*o) : std::string("null");
          }};
}
template <typename Get>
Field opt_int_field(std::string name, std::string doc, Get get) {
  return optional_field(std::move(name), "int|null", std::move(doc), get, parse_int,
                        [](int64_t x) { return std::to_string(x); });
}
template <typename Get>
Field opt_double_field(std::string name, std::string doc, Get get) {
  return optional_field(std::move(name), "float|null", std::move(doc), get, parse_double, fmt_double);
}
template <typename Get>
Field opt_bool_field(std::string name, std::string doc, Get get) {
  return optional_field(std::move(name), "bool|null", std::move(doc), get, parse_bool,
                        [](bool b) { return std::string(b ? "true" : "false"); });
}
/// A key with a fixed set of values: its names from the enum's one table (config_enums.h). The
/// type column lists the names written (aliases are accepted too).
template <typename E, typename Get>
Field enum_field(std::string name, std::string doc, Get get) {
  std::vector<std::string> names;
  for (const auto& [n, e] : enum_table<E>())
    if (to_string(e) == n) names.push_back(n);
  return {name, join(names, "|"), std::move(doc),
          [get, name](Config& c, const std::string& v) { get(c) = parse_enum<E>(name, v); },
          [get](const Config& c) { return std::string(to_string(get(const_cast<Config&>(c)))); }};
}

#define F(path) \
  [](Config & c) -> auto& { return c.path; }

const std::vector<Field>& fields() {
  static const std::vector<Field> kFields = {
      string_field("model.preset",
                   "model preset: tiny, 125M, 1B, 3B, 7B, 13B, qwen2.5-0.5B, qwen2.5-1.5B, qwen2.5-7B, mistral-7B, "
                   "gemma2-2B, bk-tiny, bk-125M, amx-moe, amx-moe-tiny, mlp (see `tandem inspect -p NAME`)",
                   F(model.preset)),
      opt_int_field("model.n_layer", "number of decoder blocks (null = preset)", F(model.n_layer)),
      opt_int_field("model.d_model", "hidden size (null = preset)", F(model.d_model)),
      opt_int_field("model.n_head", "attention heads (null = preset)", F(model.n_head)),
      opt_int_field("model.n_kv_head", "key/value heads for grouped-query attention (null = preset)",
                    F(model.n_kv_head)),
      opt_int_field("model.d_ff", "feed-forward size (null = preset)", F(model.d_ff)),
      opt_int_field("model.vocab_size", "vocabulary size before padding to a multiple of 64 (null = preset)",
                    F(model.vocab_size)),
      opt_int_field("model.max_seq_len", "longest sequence (RoPE table length; null = preset)", F(model.max_seq_len)),
      opt_bool_field("model.tie_embeddings", "share the embedding and output head weights (null = preset)",
                     F(model.tie_embeddings)),
      opt_double_field("model.rope_theta", "RoPE base frequency (null = preset)", F(model.rope_theta)),
      opt_double_field("model.norm_eps", "RMSNorm epsilon (null = preset)", F(model.norm_eps)),
      opt_int_field("model.n_experts", "MoE presets: experts per MoE layer (null = preset)", F(model.n_experts)),
      opt_int_field("model.top_k", "MoE presets: experts per token (null = preset)", F(model.top_k)),
      opt_double_field("model.capacity_factor", "MoE presets: expert capacity factor (null = preset)",
                       F(model.capacity_factor)),
      opt_double_field("model.moe_aux_weight", "MoE presets: load-balance loss weight (null = preset)",
                       F(model.moe_aux_weight)),
      opt_int_field("model.n_dense", "AMX+MoE: dense layers before the MoE layers (null = preset)", F(model.n_dense)),
      bool_field("model.checkpointing", "activation checkpointing: recompute each decoder block in backward",
                 F(model.checkpointing)),
      int_or_auto_field("model.activation_offload",
                        "the first N decoder layers (-1 = all) keep what backward needs in pinned host memory, copied "
                        "while the forward runs, instead of recomputing it (model.checkpointing) or keeping it on the "
                        "GPU; 0 = none; auto = as many as the host link hides under the step, timed at start",
                        F(model.activation_offload), ModelConfig::kAutoActivationOffload),

      string_field("model.init_from",
                   "HF LLaMA directory to start from (config.json + safetensors); overrides the preset",
                   F(model.init_from)),

      string_field("data.path", "'synthetic' (generated corpus), a token file (nanoGPT or llm.c .bin) or a text file",
                   F(data.path)),
      enum_field<TokenFormat>("data.format",
                              "how data.path is read: auto (by header and extension) | nanogpt | llmc | text",
                              F(data.format)),
      string_field("data.val_path", "held-out token file; empty = the last data.val_fraction of data.path",
                   F(data.val_path)),
      double_field("data.val_fraction", "fraction of the tokens held out for evaluation when no data.val_path",
                   F(data.val_fraction)),
      int_field("data.synthetic_bytes", "size in bytes of the generated default corpus", F(data.synthetic_bytes)),
      int_field("data.prefetch", "batches the loader thread prepares ahead", F(data.prefetch)),

      int_field("train.steps", "optimizer steps to run (total, including resumed ones)", F(train.steps)),
      int_field("train.micro_batch", "sequences per forward/backward pass", F(train.micro_batch)),
      int_field("train.seq_len", "tokens per sequence; 0 = model.max_seq_len", F(train.seq_len)),
      int_field("train.grad_accum", "micro-batches accumulated per optimizer step", F(train.grad_accum)),
      double_field("train.grad_clip", "global gradient-norm clip; 0 disables", F(train.grad_clip)),
      bool_field("train.async_checkpoint",
                 "write checkpoints on a background thread from a host snapshot (synchronous when it does not fit)",
                 F(train.async_checkpoint)),
      bool_field("train.oom_retry", "on out-of-memory, halve the micro-batch, double accumulation, retry the step",
                 F(train.oom_retry)),
      int_field("train.oom_grow_after", "clean steps before a halved micro-batch is doubled again (0 = never)",
                F(train.oom_grow_after)),
      enum_field<Precision>("train.precision", "fp32, bf16 autocast, or fp16 autocast with dynamic loss scaling",
                            F(train.precision)),
      value_field<DeviceSpec>("train.device", "auto|cpu|cuda|cuda:N", "auto | cpu | cuda | cuda:N", F(train.device)),
      uint_field("train.seed", "seed for initialisation and data order", F(train.seed)),
      int_field("train.eval_every", "evaluate on the held-out split every N steps; 0 disables", F(train.eval_every)),
      int_field("train.eval_batches", "micro-batches per evaluation", F(train.eval_batches)),
      int_field("train.log_every", "log line / metrics cadence in steps", F(train.log_every)),
      int_field("train.checkpoint_every", "checkpoint every N steps; 0 = only at the end", F(train.checkpoint_every)),
      int_field("train.keep_checkpoints", "checkpoints kept in the run directory (older ones are removed)",
                F(train.keep_checkpoints)),
      bool_field("train.save_final", "write a checkpoint when training ends", F(train.save_final)),
      bool_field("train.tf32", "allow TF32 tensor cores for fp32 matmuls and convolutions on CUDA", F(train.tf32)),
      bool_field("train.cudnn_benchmark", "let cuDNN pick the fastest algorithms", F(train.cudnn_benchmark)),
      bool_field("train.deterministic",
                 "deterministic kernels: the same seed gives the same losses bit for bit (slower backward)",
                 F(train.deterministic)),
      string_field("train.run_dir", "run directory; empty = runs/<date>-<time>-<preset>", F(train.run_dir)),
      enum_field<ProgressMode>("train.progress", "auto (bar on a terminal, lines otherwise) | bar | lines | off",
                               F(train.progress)),

      enum_field<OptimizerType>("optim.type", "adamw | adam | sgd | lion (sgd and lion: CPU kernels)", F(optim.type)),
      enum_field<OptimizerImpl>(
          "optim.impl",
          "auto (CPU kernels for CPU parameters, fused otherwise) | fused (LibTorch multi-tensor) | cpu "
          "(tandem's CPU kernels; parameters on the CPU)",
          F(optim.impl)),
      enum_field<StateDtype>(
          "optim.state_dtype",
          "optimizer state precision: fp32 | bf16 (CPU kernels) | int8 (Adam's host states in the offload "
          "engine, a scale per 2048 elements: 2 bytes a parameter instead of 8)",
          F(optim.state_dtype)),
      enum_field<StateRounding>("optim.state_rounding", "rounding of bf16 states and 8-bit codes: nearest (even) | stochastic",
                                F(optim.state_rounding)),
      enum_field<DeviceStateDtype>(
          "optim.device_state_dtype",
          "the offload engine's GPU-updated Blocks' m and v: auto (bf16 where optim.state_dtype is bf16 or int8, "
          "fp32 otherwise) | fp32 | bf16 (8 bytes a parameter on the GPU instead of 12: more Blocks GPU-updated)",
          F(optim.device_state_dtype)),
      enum_field<MasterDtype>("optim.master_dtype",
                              "the offload engine's master weights on the host: fp32 | bf16 (with "
                              "optim.master_rounding; GPU-updated Blocks keep fp32)",
                              F(optim.master_dtype)),
      enum_field<MasterRounding>("optim.master_rounding",
                                 "how a bf16 master takes its update: stochastic (rounding, 2 bytes a parameter) | "
                                 "kahan (to nearest, with a bf16 compensation: 4 bytes)",
                                 F(optim.master_rounding)),
      double_field("optim.momentum", "SGD momentum (0 = plain SGD)", F(optim.momentum)),
      double_field("optim.dampening", "SGD dampening", F(optim.dampening)),
      bool_field("optim.nesterov", "SGD Nesterov momentum", F(optim.nesterov)),
      int_field("optim.cpu_threads", "CPU kernel threads; 0 = TANDEM_CPU_THREADS, else OMP_NUM_THREADS, else all cores",
                F(optim.cpu_threads)),
      enum_field<CpuIsaChoice>("optim.cpu_isa", "CPU kernel level: auto | scalar | avx2 | avx512 | avx512bf16",
                               F(optim.cpu_isa)),
      bool_field("optim.cpu_pin", "pin CPU kernel threads to cores", F(optim.cpu_pin)),
      double_field("optim.lr", "peak learning rate", F(optim.lr)),
      double_field("optim.min_lr_ratio", "final learning rate as a fraction of optim.lr (cosine, linear)",
                   F(optim.min_lr_ratio)),
      int_field("optim.warmup_steps", "linear warmup steps", F(optim.warmup_steps)),
      int_field("optim.decay_steps", "step at which decay ends; 0 = train.steps", F(optim.decay_steps)),
      double_field("optim.warmup_min_lr", "learning rate at step 0 of warmup", F(optim.warmup_min_lr)),
      enum_field<LrSchedule>("optim.schedule", "learning-rate shape after warmup", F(optim.schedule)),
      double_field("optim.beta1", "Adam first-moment decay; Lion interpolation", F(optim.beta1)),
      double_field("optim.beta2", "Adam second-moment decay; Lion momentum decay (0.99 is usual)", F(optim.beta2)),
      double_field("optim.eps", "Adam epsilon", F(optim.eps)),
      double_field("optim.weight_decay",
                   "decoupled weight decay (matrices and embeddings; 1-D parameters as optim.decay_1d)",
                   F(optim.weight_decay)),
      bool_field("optim.decay_1d",
                 "weight decay of 1-D parameters (norm scales, biases) too, as torch's AdamW; default off, as GPT "
                 "and LLaMA recipes train",
                 F(optim.decay_1d)),

      double_field("scaler.init_scale", "fp16 initial loss scale", F(scaler.init_scale)),
      double_field("scaler.growth_factor", "fp16 loss-scale growth factor", F(scaler.growth_factor)),
      double_field("scaler.backoff_factor", "fp16 loss-scale backoff on overflow", F(scaler.backoff_factor)),
      int_field("scaler.growth_interval", "fp16 clean steps before the scale grows", F(scaler.growth_interval)),
      double_field("scaler.min_scale", "fp16 smallest loss scale", F(scaler.min_scale)),
      bool_field("scaler.dynamic", "fp16 dynamic loss scaling (false: fixed at init_scale)", F(scaler.dynamic)),
      bool_field("monitor.enabled", "sample GPU (NVML) and host (/proc, RAPL) telemetry and energy per step",
                 F(monitor.enabled)),
      double_field("monitor.period_s", "telemetry sampling period in seconds", F(monitor.period_s)),
      int_field("monitor.metrics_port", "serve Prometheus /metrics on this port (0 = off; --metrics-port)",
                F(monitor.metrics_port)),
      int_field("monitor.dashboard_port", "serve the live dashboard on this port (0 = off; --dashboard)",
                F(monitor.dashboard_port)),
      string_field("monitor.bind", "address the dashboard and /metrics listen on (127.0.0.1 = this machine only)",
                   F(monitor.bind)),
      bool_field("monitor.tensorboard", "write TensorBoard scalars to <run dir>/tensorboard (--tensorboard)",
                 F(monitor.tensorboard)),
      string_field("monitor.chartjs", "Chart.js file served by the dashboard (default: Debian's libjs-chart.js)",
                   F(monitor.chartjs)),

      enum_field<OffloadTarget>("offload.optimizer", "where the optimizer state lives: none (with the model) | cpu",
                                F(offload.optimizer)),
      bool_field("offload.pin_memory", "use pinned host memory for offloaded buffers", F(offload.pin_memory)),
      string_field("offload.update_split",
                   "k, the fraction of decoder Blocks whose master and states stay on the GPU: auto | 0 .. 1",
                   F(offload.update_split)),
      int_field("offload.resolve_every", "auto k: re-solve from measured times every N steps (0 = at start-up only)",
                F(offload.resolve_every)),
      enum_field<Speculation>(
          "offload.speculate",
          "auto | always | never: start CPU updates as Blocks complete, with an undo log for clipping and "
          "non-finite rollbacks (12 host bytes per CPU-updated parameter); never waits for the global "
          "norm; auto speculates after 8 steps in a row without clipping",
          F(offload.speculate)),
      enum_field<DistBackend>("dist.backend",
                              "collectives for device tensors: auto (NCCL on GPUs, Gloo on the CPU) | nccl | gloo",
                              F(dist.backend)),
      int_field("dist.zero_stage",
                "0 = every rank holds all fp32 masters and optimizer states; 2 = each rank owns 1/world of them "
                "(reduce-scatter, update the shard, all-gather)",
                F(dist.zero_stage)),
      double_field("dist.timeout_s", "rendezvous and collective timeout in seconds", F(dist.timeout_s)),
      double_field("dist.heartbeat_s", "heartbeat period in seconds (0 = off)", F(dist.heartbeat_s)),
      double_field("dist.heartbeat_timeout_s", "a rank silent this long is lost; the others exit for a restart",
                   F(dist.heartbeat_timeout_s)),
      value_field<RowBalance>("dist.balance", "equal|auto|list",
                              "rows of the global micro-batch per rank: equal | auto (measured speed and memory) | a "
                              "comma list summing to train.micro_batch x world",
                              F(dist.balance)),
      int_field("dist.balance_after", "dist.balance=auto: steps measured before the rows are rebalanced",
                F(dist.balance_after)),
      string_field("dist.pipeline_stages",
                   "pipeline stages: 1 (none) | N, contiguous Block ranges on N ranks, the rest of the world data "
                   "parallel | auto (the partitioner chooses the count and the cut)",
                   F(dist.pipeline_stages)),
      enum_field<PipelineSchedule>("dist.pipeline_schedule",
                                   "1f1b | gpipe: micro-batches (train.grad_accum) through the stages",
                                   F(dist.pipeline_schedule)),
      value_field<StageDevices>("dist.pipeline_devices", "list|\"\"",
                                "each stage's device, a comma list (cuda | cuda:N | cpu); \"\" = every stage on "
                                "train.device",
                                F(dist.pipeline_devices)),
      string_field("dist.pipeline_trace_steps",
                   "pipeline steps to draw into <run dir>/pipeline_trace.json (comma list; \"\" = none): each "
                   "stage's forward and backward passes on its own track, for Perfetto",
                   F(dist.pipeline_trace_steps)),
      value_field<PipelineCut>(
          "dist.pipeline_cut",
          "list|even|\"\"",
          "the last Block + 1 of each stage but the last, a comma list | even (equal Block counts) | \"\" (the "
          "partitioner's cut from a profile of the Blocks and every rank's device)",
          F(dist.pipeline_cut)),
      enum_field<PlacementPolicyKind>(
          "placement.policy",
          "where each block runs per step: off | static | threshold (GPU power and CPU load, seed 000's rule) "
          "| cost (measured time and energy per block); needs offload.optimizer=cpu",
          F(placement.policy)),
      value_field<StaticBlocks>("placement.blocks", "gpu|cpu|letters",
                                "static: gpu | cpu (every movable block) | one letter per block, G or C",
                                F(placement.blocks)),
      value_field<MovableBlocks>("placement.movable", "list|none|\"\"",
                                 "blocks that may run on the CPU: empty = every decoder layer, none, or a comma list "
                                 "of block indices (0 = embedding); they stay CPU-updated",
                                 F(placement.movable)),
      double_field("placement.threshold_w", "threshold: GPU power (W) above which a block moves to the CPU",
                   F(placement.threshold_w)),
      double_field("placement.threshold_cpu_pct", "threshold: the CPU must be less busy than this (%)",
                   F(placement.threshold_cpu_pct)),
      double_field("placement.release_w", "threshold: a block comes back below threshold_w - release_w",
                   F(placement.release_w)),
      int_field("placement.dwell_steps", "threshold: steps between two moves", F(placement.dwell_steps)),
      enum_field<PlacementObjective>(
          "placement.objective",
          "cost: throughput (fastest under placement.gpu_power_budget_w) | energy (least J under "
          "placement.max_step_s)",
          F(placement.objective)),
      double_field("placement.gpu_power_budget_w",
                   "cost: software GPU power budget in W (0 = none); the GPU's own power limit is never changed",
                   F(placement.gpu_power_budget_w)),
      double_field("placement.max_step_s", "cost, energy objective: step-time ceiling in s (0 = none)",
                   F(placement.max_step_s)),
      int_field("placement.profile_steps", "cost: steps per profile probe (the last one is measured)",
                F(placement.profile_steps)),
      int_field("placement.mirror_every",
                "device copies of CPU-updated blocks refreshed every N updates (1 = exact; N > 1: weights on the "
                "device up to N-1 updates old)",
                F(placement.mirror_every)),
      int_field("offload.host_ring",
                "host gradient and weight buffers: -1 = auto (per block when the memory plan fits the host, "
                "else a ring of 4), 0 = per block, N = a ring of N block-sized slots (updates wait for the norm)",
                F(offload.host_ring)),
      string_field("offload.nvme_path",
                   "a directory on a fast disk for the optimizer states of the blocks the host cannot hold (\"\" = "
                   "none); their updates wait for the norm",
                   F(offload.nvme_path)),
      int_field("offload.nvme_blocks",
                "with offload.nvme_path: the last N CPU-updated blocks keep their states on disk (-1 = as many as "
                "the memory plan needs for the host)",
                F(offload.nvme_blocks)),
      bool_field("offload.delayed_update",
                 "one-step delayed update: the next forward does not wait for the CPU updates (opt-in)",
                 F(offload.delayed_update)),
      int_field("offload.delayed_after",
                "with offload.delayed_update: the first N updates run exact, the rest delayed (0 = delayed from "
                "the start; ZeRO-Offload waits N steps)",
                F(offload.delayed_after)),
      double_field("offload.host_memory_gib",
                   "host memory the memory plan assumes, GiB (0 = MemAvailable now; set it where the host's memory "
                   "grows as it is used)",
                   F(offload.host_memory_gib)),
      double_field("offload.gpu_memory_fraction", "share of GPU memory the memory plan may use",
                   F(offload.gpu_memory_fraction)),
      double_field("offload.host_memory_fraction", "share of available host memory the plan may pin",
                   F(offload.host_memory_fraction)),
      string_field("offload.trace_steps",
                   "steps to trace (comma list, e.g. 5,6) into <run dir>/trace.json: CUDA streams and the CPU "
                   "updater, for Perfetto",
                   F(offload.trace_steps)),
  };
  return kFields;
}
#undef F

const Field& find_field(const std::string& key, const std::string& origin) {
  for (const auto& f : fields())
    if (f.name == key) return f;
  TANDEM_FAIL(origin.empty() ? "" : origin + ": ", "unknown config key '", key, "'",
              did_you_mean(key, config_key_names()),
              did_you_mean(key, config_key_names()).empty() ? "; `tandem config --keys` lists the valid keys" : "");
}

// A key set twice in one file (`steps:` twice under `train:`, or `train: {steps: ..}` beside
// `train.steps: ..`) is refused: YAML parsers keep one of them silently. `seen`: key -> line.
void flatten_yaml(Config& cfg, const YAML::Node& node, const std::string& prefix, const std::string& origin,
                  std::map<std::string, int>& seen) {
  const auto where = [&](const YAML::Node& n) { return origin + ":" + std::to_string(n.Mark().line + 1); };
  const auto once = [&](const YAML::Node& n) {
    const int line = n.Mark().line + 1;
    const auto [it, fresh] = seen.emplace(prefix, line);
    TANDEM_CHECK(fresh, origin, ":", line, ": '", prefix, "' is set twice (lines ", it->second, " and ", line,
                 "); keep one");
  };
  switch (node.Type()) {
    case YAML::NodeType::Map:
      for (const auto& kv : node) {
        TANDEM_CHECK(kv.first.IsScalar(), where(kv.first),
                     ": a config key must be a plain name such as train.steps, not a mapping or a list");
        const std::string k = kv.first.Scalar();
        flatten_yaml(cfg, kv.second, prefix.empty() ? k : prefix + "." + k, origin, seen);
      }
      break;
    case YAML::NodeType::Scalar:
      TANDEM_CHECK(!prefix.empty(), origin, ": expected a mapping of config keys, got a scalar");
      once(node);
      set_config_key(cfg, prefix, node.Scalar(), where(node));
      break;
    case YAML::NodeType::Null:
      if (prefix.empty()) break;
      once(node);
      set_config_key(cfg, prefix, "", where(node));
      break;
    case YAML::NodeType::Sequence:
      find_field(prefix, where(node));  // unknown keys first
      TANDEM_FAIL(where(node), ": '", prefix, "' expects a single value, got a list");
    default:
      break;
  }
}

}  // namespace

std::vector<ConfigKeyInfo> config_keys() {
  std::vector<ConfigKeyInfo> out;
  for (const auto& f : fields()) out.push_back({f.name, f.type, f.doc});
  return out;
}

std::vector<std::string> config_key_names() {
  std::vector<std::string> out;
  for (const auto& f : fields()) out.push_back(f.name);
  return out;
}

namespace {

// Keys a release removed, accepted at the value that did nothing, so older run directories and
// checkpoints still load; any other value is refused with what replaced the key.
struct RetiredKey {
  const char* name;
  const char* inert_value;
  const char* replacement;
};
constexpr RetiredKey kRetiredKeys[] = {
    {"train.fault_oom_above_tokens", "0", "tests inject faults with TANDEM_FAULTS=oom_above_tokens=N (core/fault.h)"},
};

}  // namespace

void set_config_key(Config& cfg, const std::string& key, const std::string& value, const std::string& origin) {
  for (const auto& r : kRetiredKeys) {
    if (key != r.name) continue;
    TANDEM_CHECK(value == r.inert_value, origin.empty() ? "" : origin + ": ", "'", key,
                 "' was removed: ", r.replacement);
    return;
  }
  const Field& f = find_field(key, origin);
  try {
    f.set(cfg, value);
  } catch (const UserError& e) {
    if (origin.empty()) throw;
    throw UserError(origin + ": " + e.what());
  }
}

std::string get_config_key(const Config& cfg, const std::string& key) { return find_field(key, "").get(cfg); }

void apply_override(Config& cfg, const std::string& assignment) {
  const auto eq = assignment.find('=');
  TANDEM_CHECK(eq != std::string::npos && eq > 0, "--set expects KEY=VALUE, got '", assignment,
               "' (e.g. --set train.steps=100)");
  set_config_key(cfg, assignment.substr(0, eq), assignment.substr(eq + 1), "--set");
}

void load_yaml_config_text(Config& cfg, const std::string& text, const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    TANDEM_FAIL(origin, ":", e.mark.line + 1, ": not valid YAML (", e.msg, "); fix the syntax");
  }
  if (root.IsNull()) return;
  TANDEM_CHECK(root.IsMap(), origin, ": expected a mapping of config keys at the top level");
  try {
    std::map<std::string, int> seen;
    flatten_yaml(cfg, root, "", origin, seen);
  } catch (const YAML::Exception& e) {
    TANDEM_FAIL(origin, ":", e.mark.line + 1, ": ", e.msg, "; fix the file");
  }
}

void load_yaml_config(Config& cfg, const std::string& path) {
  std::ifstream in(path);
  TANDEM_CHECK(in.good(), "cannot read config file '", path, "'; check the path");
  std::stringstream ss;
  ss << in.rdbuf();
  load_yaml_config_text(cfg, ss.str(), path);
}

std::string config_to_yaml(const Config& cfg) {
  YAML::Node root;
  for (const auto& f : fields()) {
    const auto dot = f.name.find('.');
    const std::string section = f.name.substr(0, dot), key = f.name.substr(dot + 1);
    const std::string value = f.get(cfg);
    const bool optional = f.type.size() > 5 && f.type.compare(f.type.size() - 5, 5, "|null") == 0;
    if (value == "null" && optional)  // unset; a text key holding the word "null" is written as text
      root[section][key] = YAML::Node(YAML::NodeType::Null);
    else
      root[section][key] = value;
  }
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

std::string config_hash(const Config& cfg) {
  // FNV-1a over the canonical YAML text.
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char ch : config_to_yaml(cfg)) h = (h ^ ch) * 1099511628211ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace tandem
