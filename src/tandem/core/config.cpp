#include "tandem/core/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tandem/core/error.h"
#include "tandem/core/log.h"
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

template <typename E>
E parse_enum(const std::string& key, const std::string& v, const std::vector<std::pair<std::string, E>>& table) {
  const std::string s = to_lower(v);
  std::vector<std::string> names;
  for (const auto& [name, e] : table) {
    if (s == name) return e;
    names.push_back(name);
  }
  TANDEM_FAIL("'", key, "' must be one of ", join(names, ", "), "; got '", v, "'", did_you_mean(s, names));
}

template <typename E>
std::string enum_name(E e, const std::vector<std::pair<std::string, E>>& table) {
  for (const auto& [name, x] : table)
    if (x == e) return name;
  return "?";
}

std::string fmt_double(double x) {
  std::ostringstream os;
  os.precision(17);
  os << x;
  return os.str();
}

const std::vector<std::pair<std::string, Precision>> kPrecisions = {
    {"fp32", Precision::kFp32}, {"bf16", Precision::kBf16}, {"fp16", Precision::kFp16}};
const std::vector<std::pair<std::string, LrSchedule>> kSchedules = {
    {"cosine", LrSchedule::kCosine}, {"linear", LrSchedule::kLinear}, {"constant", LrSchedule::kConstant}};
const std::vector<std::pair<std::string, OffloadTarget>> kOffloadTargets = {{"none", OffloadTarget::kNone},
                                                                            {"cpu", OffloadTarget::kCpu}};

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
template <typename Get>
Field uint_field(std::string name, std::string doc, Get get) {
  return {name, "int", std::move(doc),
          [get, name](Config& c, const std::string& v) {
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
template <typename E, typename Get>
Field enum_field(std::string name, std::string doc, const std::vector<std::pair<std::string, E>>& table, Get get) {
  std::vector<std::string> names;
  for (const auto& [n, e] : table) names.push_back(n);
  return {name, join(names, "|"), std::move(doc),
          [get, name, &table](Config& c, const std::string& v) { get(c) = parse_enum(name, v, table); },
          [get, &table](const Config& c) { return enum_name(get(const_cast<Config&>(c)), table); }};
}

#define F(path) \
  [](Config & c) -> auto& { return c.path; }

const std::vector<Field>& fields() {
  static const std::vector<Field> kFields = {
      string_field("model.preset", "model preset: tiny, 125M, 1B, 3B, 7B, 13B, mlp (see `tandem inspect`)",
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

      string_field("model.init_from",
                   "HF LLaMA directory to start from (config.json + safetensors); overrides the preset",
                   F(model.init_from)),

      string_field("data.path", "'synthetic' (generated corpus), a token file (nanoGPT or llm.c .bin) or a text file",
                   F(data.path)),
      string_field("data.format", "auto | nanogpt | llmc | text", F(data.format)),
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
      int_field("train.fault_oom_above_tokens",
                "testing: a micro-batch of more tokens fails as out of memory (0 = off)",
                F(train.fault_oom_above_tokens)),
      enum_field("train.precision", "fp32, bf16 autocast, or fp16 autocast with dynamic loss scaling", kPrecisions,
                 F(train.precision)),
      string_field("train.device", "auto | cpu | cuda | cuda:N", F(train.device)),
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
      string_field("train.progress", "auto (bar on a terminal, lines otherwise) | bar | lines | off",
                   F(train.progress)),

      string_field("optim.type", "adamw | adam | sgd | lion (sgd and lion: CPU kernels)", F(optim.type)),
      string_field("optim.impl",
                   "auto (CPU kernels for CPU parameters, fused otherwise) | fused (LibTorch multi-tensor) | cpu "
                   "(tandem's CPU kernels; parameters on the CPU)",
                   F(optim.impl)),
      string_field("optim.state_dtype", "optimizer state precision: fp32 | bf16 (CPU kernels)", F(optim.state_dtype)),
      string_field("optim.state_rounding", "rounding of bf16 states: nearest (even) | stochastic",
                   F(optim.state_rounding)),
      double_field("optim.momentum", "SGD momentum (0 = plain SGD)", F(optim.momentum)),
      double_field("optim.dampening", "SGD dampening", F(optim.dampening)),
      bool_field("optim.nesterov", "SGD Nesterov momentum", F(optim.nesterov)),
      int_field("optim.cpu_threads", "CPU kernel threads; 0 = TANDEM_CPU_THREADS, else OMP_NUM_THREADS, else all cores",
                F(optim.cpu_threads)),
      string_field("optim.cpu_isa", "CPU kernel level: auto | scalar | avx2 | avx512 | avx512bf16", F(optim.cpu_isa)),
      bool_field("optim.cpu_pin", "pin CPU kernel threads to cores", F(optim.cpu_pin)),
      double_field("optim.lr", "peak learning rate", F(optim.lr)),
      double_field("optim.min_lr_ratio", "final learning rate as a fraction of optim.lr (cosine, linear)",
                   F(optim.min_lr_ratio)),
      int_field("optim.warmup_steps", "linear warmup steps", F(optim.warmup_steps)),
      int_field("optim.decay_steps", "step at which decay ends; 0 = train.steps", F(optim.decay_steps)),
      double_field("optim.warmup_min_lr", "learning rate at step 0 of warmup", F(optim.warmup_min_lr)),
      enum_field("optim.schedule", "learning-rate shape after warmup", kSchedules, F(optim.schedule)),
      double_field("optim.beta1", "Adam first-moment decay; Lion interpolation", F(optim.beta1)),
      double_field("optim.beta2", "Adam second-moment decay; Lion momentum decay (0.99 is usual)", F(optim.beta2)),
      double_field("optim.eps", "Adam epsilon", F(optim.eps)),
      double_field("optim.weight_decay", "decoupled weight decay (matrices and embeddings; not norms)",
                   F(optim.weight_decay)),

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

      enum_field("offload.optimizer", "where the optimizer state lives: none (with the model) | cpu", kOffloadTargets,
                 F(offload.optimizer)),
      bool_field("offload.pin_memory", "use pinned host memory for offloaded buffers", F(offload.pin_memory)),
      string_field("offload.update_split",
                   "k, the fraction of decoder Blocks whose master and states stay on the GPU: auto | 0 .. 1",
                   F(offload.update_split)),
      int_field("offload.resolve_every", "auto k: re-solve from measured times every N steps (0 = at start-up only)",
                F(offload.resolve_every)),
      string_field("offload.speculate",
                   "auto | always | never: start CPU updates as Blocks complete, with an undo log for clipping and "
                   "non-finite rollbacks (12 host bytes per CPU-updated parameter); never waits for the global "
                   "norm; auto speculates after 8 steps in a row without clipping",
                   F(offload.speculate)),
      string_field("dist.backend", "collectives for device tensors: auto (NCCL on GPUs, Gloo on the CPU) | nccl | gloo",
                   F(dist.backend)),
      int_field("dist.zero_stage",
                "0 = every rank holds all fp32 masters and optimizer states; 2 = each rank owns 1/world of them "
                "(reduce-scatter, update the shard, all-gather)",
                F(dist.zero_stage)),
      double_field("dist.timeout_s", "rendezvous and collective timeout in seconds", F(dist.timeout_s)),
      double_field("dist.heartbeat_s", "heartbeat period in seconds (0 = off)", F(dist.heartbeat_s)),
      double_field("dist.heartbeat_timeout_s", "a rank silent this long is lost; the others exit for a restart",
                   F(dist.heartbeat_timeout_s)),
      string_field("dist.balance",
                   "rows of the global micro-batch per rank: equal | auto (measured speed and memory) | a comma list "
                   "summing to train.micro_batch x world",
                   F(dist.balance)),
      int_field("dist.balance_after", "dist.balance=auto: steps measured before the rows are rebalanced",
                F(dist.balance_after)),
      string_field("placement.policy",
                   "where each block runs per step: off | static | threshold (GPU power and CPU load, seed 000's rule) "
                   "| cost (measured time and energy per block); needs offload.optimizer=cpu",
                   F(placement.policy)),
      string_field("placement.blocks", "static: gpu | cpu (every movable block) | one letter per block, G or C",
                   F(placement.blocks)),
      string_field("placement.movable",
                   "blocks that may run on the CPU: empty = every decoder layer, none, or a comma list of block "
                   "indices (0 = embedding); they stay CPU-updated",
                   F(placement.movable)),
      double_field("placement.threshold_w", "threshold: GPU power (W) above which a block moves to the CPU",
                   F(placement.threshold_w)),
      double_field("placement.threshold_cpu_pct", "threshold: the CPU must be less busy than this (%)",
                   F(placement.threshold_cpu_pct)),
      double_field("placement.release_w", "threshold: a block comes back below threshold_w - release_w",
                   F(placement.release_w)),
      int_field("placement.dwell_steps", "threshold: steps between two moves", F(placement.dwell_steps)),
      string_field("placement.objective",
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
      bool_field("offload.delayed_update",
                 "one-step delayed update: the next forward does not wait for the CPU updates (opt-in)",
                 F(offload.delayed_update)),
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

void flatten_yaml(Config& cfg, const YAML::Node& node, const std::string& prefix, const std::string& origin) {
  const auto where = [&](const YAML::Node& n) { return origin + ":" + std::to_string(n.Mark().line + 1); };
  switch (node.Type()) {
    case YAML::NodeType::Map:
      for (const auto& kv : node) {
        TANDEM_CHECK(kv.first.IsScalar(), where(kv.first),
                     ": a config key must be a plain name such as train.steps, not a mapping or a list");
        const std::string k = kv.first.Scalar();
        flatten_yaml(cfg, kv.second, prefix.empty() ? k : prefix + "." + k, origin);
      }
      break;
    case YAML::NodeType::Scalar:
      TANDEM_CHECK(!prefix.empty(), origin, ": expected a mapping of config keys, got a scalar");
      set_config_key(cfg, prefix, node.Scalar(), where(node));
      break;
    case YAML::NodeType::Null:
      if (!prefix.empty()) set_config_key(cfg, prefix, "", where(node));
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

void set_config_key(Config& cfg, const std::string& key, const std::string& value, const std::string& origin) {
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
    flatten_yaml(cfg, root, "", origin);
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

DeepSpeedImport load_deepspeed_config_text(Config& cfg, const std::string& text, const std::string& origin) {
  using nlohmann::json;
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {  // parse errors, and numbers out of range
    TANDEM_FAIL(origin, ": not valid JSON (", e.what(), ")");
  }
  TANDEM_CHECK(root.is_object(), origin, ": a DeepSpeed config must be a JSON object");
  DeepSpeedImport result;
  auto& ignored = result.ignored_keys;
  const auto is_auto = [](const json& v) { return v.is_string() && v.get<std::string>() == "auto"; };
  const auto num = [&](const json& v, const std::string& key) -> double {
    TANDEM_CHECK(v.is_number(), origin, ": '", key, "' must be a number, got ", v.dump());
    return v.get<double>();
  };
  const auto integer = [&](const json& v, const std::string& key) -> int64_t {
    TANDEM_CHECK(v.is_number_integer(), origin, ": '", key, "' must be an integer, got ", v.dump());
    return v.get<int64_t>();
  };
  const auto boolean = [&](const json& v, const std::string& key) -> bool {
    TANDEM_CHECK(v.is_boolean(), origin, ": '", key, "' must be true or false, got ", v.dump());
    return v.get<bool>();
  };
  const auto object = [&](const json& v, const std::string& key) -> const json& {
    TANDEM_CHECK(v.is_object(), origin, ": '", key, "' must be an object, got ", v.dump());
    return v;
  };
  const auto str = [&](const json& v, const std::string& key) -> std::string {
    TANDEM_CHECK(v.is_string(), origin, ": '", key, "' must be a string, got ", v.dump());
    return v.get<std::string>();
  };
  const auto positive = [&](const json& v, const std::string& key) -> int64_t {
    const int64_t n = integer(v, key);
    TANDEM_CHECK(n > 0, origin, ": '", key, "' must be a positive integer, got ", n);
    return n;
  };

  std::optional<int64_t> micro, accum, global, zero_stage;
  bool half_enabled = false;  // fp16 or bf16 enabled: the two exclude each other
  for (const auto& [key, v] : root.items()) {
    if (is_auto(v)) continue;  // HF Trainer placeholders: keep tandem's own value
    if (key == "train_micro_batch_size_per_gpu") {
      micro = positive(v, key);
    } else if (key == "gradient_accumulation_steps") {
      accum = positive(v, key);
    } else if (key == "train_batch_size") {
      global = positive(v, key);
    } else if (key == "gradient_clipping") {
      cfg.train.grad_clip = num(v, key);
    } else if (key == "steps_per_print") {
      cfg.train.log_every = integer(v, key);
    } else if (key == "optimizer") {
      const json& o = object(v, key);
      for (const auto& [k, x] : o.items()) {
        if (k == "type") {
          const std::string name = str(x, "optimizer.type"), t = to_lower(name);
          TANDEM_CHECK(t == "adam" || t == "adamw" || t == "cpuadam" || t == "fusedadam", origin, ": optimizer type '",
                       name, "' is not supported; use Adam or AdamW");
          cfg.optim.type = "adamw";  // DeepSpeed's Adam is AdamW unless adam_w_mode is false
        } else if (k == "params") {
          for (const auto& [p, y] : object(x, "optimizer.params").items()) {
            if (is_auto(y)) continue;
            if (p == "lr")
              cfg.optim.lr = num(y, "optimizer.params.lr");
            else if (p == "eps")
              cfg.optim.eps = num(y, "optimizer.params.eps");
            else if (p == "weight_decay")
              cfg.optim.weight_decay = num(y, "optimizer.params.weight_decay");
            else if (p == "betas") {
              TANDEM_CHECK(y.is_array() && y.size() == 2, origin, ": 'optimizer.params.betas' must be [beta1, beta2]");
              cfg.optim.beta1 = num(y[0], "optimizer.params.betas[0]");
              cfg.optim.beta2 = num(y[1], "optimizer.params.betas[1]");
            } else if (p == "adam_w_mode") {
              cfg.optim.type = boolean(y, "optimizer.params.adam_w_mode") ? "adamw" : "adam";
            } else {
              ignored.push_back("optimizer.params." + p);
            }
          }
        } else {
          ignored.push_back("optimizer." + k);
        }
      }
    } else if (key == "scheduler") {
      const json& s = object(v, key);
      TANDEM_CHECK(s.contains("type"), origin, ": 'scheduler' needs a 'type'");
      const std::string type = str(s["type"], "scheduler.type");
      const json params = s.contains("params") ? object(s["params"], "scheduler.params") : json::object();
      if (type == "WarmupLR" || type == "WarmupDecayLR") {
        cfg.optim.schedule = type == "WarmupLR" ? LrSchedule::kConstant : LrSchedule::kLinear;
        if (type == "WarmupDecayLR") cfg.optim.min_lr_ratio = 0.0;
        for (const auto& [p, y] : params.items()) {
          if (is_auto(y)) continue;
          if (p == "warmup_max_lr")
            cfg.optim.lr = num(y, "scheduler.params.warmup_max_lr");
          else if (p == "warmup_min_lr")
            cfg.optim.warmup_min_lr = num(y, "scheduler.params.warmup_min_lr");
          else if (p == "warmup_num_steps")
            cfg.optim.warmup_steps = integer(y, "scheduler.params.warmup_num_steps");
          else if (p == "total_num_steps" && type == "WarmupDecayLR")
            cfg.optim.decay_steps = integer(y, "scheduler.params.total_num_steps");
          else if (p == "warmup_type" && y.is_string() && y.get<std::string>() == "linear")
            continue;
          else
            ignored.push_back("scheduler.params." + p + (p == "warmup_type" ? " (tandem warms up linearly)" : ""));
        }
      } else if (type == "WarmupCosineLR") {
        cfg.optim.schedule = LrSchedule::kCosine;
        for (const auto& [p, y] : params.items()) {
          if (is_auto(y)) continue;
          if (p == "warmup_num_steps")
            cfg.optim.warmup_steps = integer(y, "scheduler.params.warmup_num_steps");
          else if (p == "total_num_steps")
            cfg.optim.decay_steps = integer(y, "scheduler.params.total_num_steps");
          else if (p == "cos_min_ratio")
            cfg.optim.min_lr_ratio = num(y, "scheduler.params.cos_min_ratio");
          else if (p == "warmup_min_ratio")
            cfg.optim.warmup_min_lr = num(y, "scheduler.params.warmup_min_ratio") * cfg.optim.lr;
          else
            ignored.push_back("scheduler.params." + p);
        }
      } else {
        TANDEM_FAIL(origin, ": scheduler type '", type,
                    "' is not supported; use WarmupLR, WarmupDecayLR or WarmupCosineLR");
      }
    } else if (key == "bf16" || key == "fp16") {
      const json& o = object(v, key);
      const bool enabled = o.contains("enabled") && !is_auto(o["enabled"]) && boolean(o["enabled"], key + ".enabled");
      if (enabled) {
        TANDEM_CHECK(!half_enabled, origin, ": both fp16 and bf16 are enabled; enable one (bf16 on GPUs that have it)");
        half_enabled = true;
        cfg.train.precision = key == "bf16" ? Precision::kBf16 : Precision::kFp16;
      }
      for (const auto& [k, x] : o.items()) {
        if (k == "enabled" || is_auto(x)) continue;
        if (key == "fp16" && k == "loss_scale") {
          const double s = num(x, "fp16.loss_scale");
          cfg.scaler.dynamic = s == 0.0;
          if (s > 0) cfg.scaler.init_scale = s;
        } else if (key == "fp16" && k == "initial_scale_power") {
          cfg.scaler.init_scale = std::ldexp(1.0, static_cast<int>(integer(x, "fp16.initial_scale_power")));
        } else if (key == "fp16" && k == "loss_scale_window") {
          cfg.scaler.growth_interval = integer(x, "fp16.loss_scale_window");
        } else if (key == "fp16" && k == "min_loss_scale") {
          cfg.scaler.min_scale = num(x, "fp16.min_loss_scale");
        } else {
          ignored.push_back(key + "." + k);
        }
      }
    } else if (key == "zero_optimization") {
      for (const auto& [k, x] : object(v, key).items()) {
        if (k == "offload_optimizer") {
          for (const auto& [p, y] : object(x, "zero_optimization.offload_optimizer").items()) {
            if (p == "device") {
              const std::string d = to_lower(str(y, "zero_optimization.offload_optimizer.device"));
              TANDEM_CHECK(d == "cpu" || d == "none", origin, ": zero_optimization.offload_optimizer.device '", d,
                           "' is not supported; use cpu or none");
              cfg.offload.optimizer = d == "cpu" ? OffloadTarget::kCpu : OffloadTarget::kNone;
            } else if (p == "pin_memory") {
              cfg.offload.pin_memory = boolean(y, "zero_optimization.offload_optimizer.pin_memory");
            } else {
              ignored.push_back("zero_optimization.offload_optimizer." + p);
            }
          }
        } else if (k == "stage") {
          zero_stage = integer(x, "zero_optimization.stage");
        } else {
          ignored.push_back("zero_optimization." + k);
        }
      }
    } else {
      ignored.push_back(key);
    }
  }
  // ZeRO: stages 1-3 shard the optimizer state and gradients, tandem's dist.zero_stage=2, which works
  // on the offload engine's masters; without offload_optimizer (or at stage 3, whose parameter
  // sharding tandem does not do) the stage is listed as not mapped.
  if (zero_stage) {
    if (*zero_stage >= 1 && cfg.offload.optimizer == OffloadTarget::kCpu) cfg.dist.zero_stage = 2;
    if (*zero_stage == 3 || (*zero_stage >= 1 && cfg.offload.optimizer != OffloadTarget::kCpu))
      ignored.push_back("zero_optimization.stage");
  }
  // Batch arithmetic: train_batch_size counts every rank (WORLD_SIZE under a launcher, else 1).
  const char* ws = std::getenv("WORLD_SIZE");
  const int64_t world = ws != nullptr && std::atoll(ws) > 0 ? std::atoll(ws) : 1;
  if (global) {
    TANDEM_CHECK(*global % world == 0, origin, ": train_batch_size (", *global, ") is not a multiple of the ", world,
                 " ranks");
    *global /= world;
  }
  if (global && micro && accum) {
    TANDEM_CHECK(*global == *micro * *accum, origin, ": train_batch_size (", *global * world,
                 ") must equal train_micro_batch_size_per_gpu (", *micro, ") x gradient_accumulation_steps (", *accum,
                 ") x ", world, " rank(s)");
  } else if (global && micro) {
    TANDEM_CHECK(*global % *micro == 0, origin, ": train_batch_size (", *global * world,
                 ") is not a multiple of train_micro_batch_size_per_gpu (", *micro, ") x ", world, " rank(s)");
    accum = *global / *micro;
  } else if (global && accum) {
    TANDEM_CHECK(*global % *accum == 0, origin, ": train_batch_size (", *global * world,
                 ") is not a multiple of gradient_accumulation_steps (", *accum, ") x ", world, " rank(s)");
    micro = *global / *accum;
  } else if (global) {
    micro = *global;
    accum = 1;
  }
  if (micro) cfg.train.micro_batch = *micro;
  if (accum) cfg.train.grad_accum = *accum;
  return result;
}

DeepSpeedImport load_deepspeed_config(Config& cfg, const std::string& path) {
  std::ifstream in(path);
  TANDEM_CHECK(in.good(), "cannot read DeepSpeed config '", path, "'; check the path");
  std::stringstream ss;
  ss << in.rdbuf();
  return load_deepspeed_config_text(cfg, ss.str(), path);
}

void load_config_file(Config& cfg, const std::string& path) {
  const auto dot = path.rfind('.');
  const std::string ext = dot == std::string::npos ? "" : to_lower(path.substr(dot + 1));
  if (ext == "json") {
    const auto r = load_deepspeed_config(cfg, path);
    if (!r.ignored_keys.empty())
      log::warn(path + ": DeepSpeed keys without a tandem equivalent were ignored: " + join(r.ignored_keys, ", "));
  } else if (ext == "yaml" || ext == "yml") {
    load_yaml_config(cfg, path);
  } else {
    TANDEM_FAIL("config file '", path, "' has an unknown extension; use .yaml/.yml (tandem) or .json (DeepSpeed)");
  }
}

std::string config_to_yaml(const Config& cfg) {
  YAML::Node root;
  for (const auto& f : fields()) {
    const auto dot = f.name.find('.');
    const std::string section = f.name.substr(0, dot), key = f.name.substr(dot + 1);
    const std::string value = f.get(cfg);
    if (value == "null")
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

std::vector<int64_t> parse_step_list(const std::string& s, const std::string& key) {
  std::vector<int64_t> out;
  std::stringstream in(s);
  for (std::string t; std::getline(in, t, ',');) {
    t.erase(0, t.find_first_not_of(" \t"));
    t.erase(t.find_last_not_of(" \t") + 1);
    if (t.empty()) continue;
    char* end = nullptr;
    const long long v = std::strtoll(t.c_str(), &end, 10);
    TANDEM_CHECK(end && *end == '\0' && v >= 1, key, " takes step numbers >= 1 separated by commas (e.g. 5,6); got '",
                 s, "'");
    out.push_back(v);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::optional<double> parse_update_split(const std::string& s) {
  if (s == "auto") return std::nullopt;
  char* end = nullptr;
  const double k = std::strtod(s.c_str(), &end);
  TANDEM_CHECK(!s.empty() && end && *end == '\0' && k >= 0 && k <= 1,
               "offload.update_split must be auto or a fraction in [0, 1]; got '", s, "'");
  return k;
}

void validate_config(const Config& c) {
  (void)parse_update_split(c.offload.update_split);
  (void)parse_step_list(c.offload.trace_steps, "offload.trace_steps");
  TANDEM_CHECK(c.offload.speculate == "auto" || c.offload.speculate == "always" || c.offload.speculate == "never",
               "offload.speculate must be auto, always or never; got '", c.offload.speculate, "'");
  TANDEM_CHECK(c.monitor.period_s >= 0.01 && c.monitor.period_s <= 3600,
               "monitor.period_s must be in [0.01, 3600] seconds, got ", c.monitor.period_s);
  for (const auto& [key, port] : {std::pair<const char*, int64_t>{"monitor.metrics_port", c.monitor.metrics_port},
                                  {"monitor.dashboard_port", c.monitor.dashboard_port}})
    TANDEM_CHECK(port >= 0 && port <= 65535, key, " must be a TCP port in 1..65535, or 0 for off; got ", port);
  TANDEM_CHECK(c.train.oom_grow_after >= 0 && c.train.fault_oom_above_tokens >= 0,
               "train.oom_grow_after and train.fault_oom_above_tokens must be >= 0");
  TANDEM_CHECK(!c.monitor.bind.empty(), "monitor.bind must be an address such as 127.0.0.1");
  TANDEM_CHECK(c.offload.host_ring >= -1 && c.offload.host_ring <= 64,
               "offload.host_ring must be -1 (auto), 0 (per block) or a slot count up to 64; got ",
               c.offload.host_ring);
  TANDEM_CHECK(c.offload.host_ring <= 0 || (c.offload.speculate != "always" && !c.offload.delayed_update),
               "offload.host_ring=", c.offload.host_ring,
               " updates each block once the norm is known; it cannot speculate or delay: set offload.speculate=auto "
               "or never and offload.delayed_update=false, or offload.host_ring=0");
  TANDEM_CHECK(c.dist.backend == "auto" || c.dist.backend == "nccl" || c.dist.backend == "gloo",
               "dist.backend must be auto, nccl or gloo; got '", c.dist.backend, "'");
  TANDEM_CHECK(c.dist.zero_stage == 0 || c.dist.zero_stage == 2, "dist.zero_stage must be 0 or 2; got ",
               c.dist.zero_stage);
  TANDEM_CHECK(c.dist.timeout_s > 0 && c.dist.heartbeat_s >= 0 && c.dist.heartbeat_timeout_s > c.dist.heartbeat_s,
               "dist.timeout_s must be > 0, dist.heartbeat_s >= 0 and dist.heartbeat_timeout_s above the period");
  TANDEM_CHECK(c.dist.balance_after >= 1, "dist.balance_after must be >= 1, got ", c.dist.balance_after);
  const auto& pl = c.placement;
  TANDEM_CHECK(pl.policy == "off" || pl.policy == "static" || pl.policy == "threshold" || pl.policy == "cost",
               "placement.policy must be off, static, threshold or cost; got '", pl.policy, "'");
  TANDEM_CHECK(pl.objective == "throughput" || pl.objective == "energy",
               "placement.objective must be throughput or energy; got '", pl.objective, "'");
  TANDEM_CHECK(pl.threshold_w > 0 && pl.release_w >= 0 && pl.release_w < pl.threshold_w,
               "placement.threshold_w must be > 0 and placement.release_w in [0, threshold_w)");
  TANDEM_CHECK(pl.threshold_cpu_pct > 0 && pl.threshold_cpu_pct <= 100,
               "placement.threshold_cpu_pct must be in (0, 100], got ", pl.threshold_cpu_pct);
  TANDEM_CHECK(pl.dwell_steps >= 1 && pl.profile_steps >= 1 && pl.mirror_every >= 1,
               "placement.dwell_steps, placement.profile_steps and placement.mirror_every must be >= 1");
  TANDEM_CHECK(pl.gpu_power_budget_w >= 0 && pl.max_step_s >= 0,
               "placement.gpu_power_budget_w and placement.max_step_s must be >= 0");
  TANDEM_CHECK(pl.policy == "off" || c.offload.optimizer == OffloadTarget::kCpu, "placement.policy=", pl.policy,
               " runs blocks from the CPU-side weight store: set offload.optimizer=cpu");
  TANDEM_CHECK(pl.policy == "off" || c.train.precision != Precision::kFp16, "placement.policy=", pl.policy,
               " runs blocks on the CPU in fp32 or bf16: set train.precision=bf16");
  TANDEM_CHECK(c.offload.resolve_every >= 0, "offload.resolve_every must be >= 0 (0 = at start-up only), got ",
               c.offload.resolve_every);
  TANDEM_CHECK(c.offload.gpu_memory_fraction > 0 && c.offload.gpu_memory_fraction <= 1,
               "offload.gpu_memory_fraction must be in (0, 1], got ", c.offload.gpu_memory_fraction);
  TANDEM_CHECK(c.offload.host_memory_gib >= 0, "offload.host_memory_gib must be >= 0 (0 = measured), got ",
               c.offload.host_memory_gib);
  TANDEM_CHECK(c.offload.host_memory_fraction > 0 && c.offload.host_memory_fraction <= 1,
               "offload.host_memory_fraction must be in (0, 1], got ", c.offload.host_memory_fraction);
  TANDEM_CHECK(c.train.steps >= 0, "train.steps must be >= 0, got ", c.train.steps);
  // Upper bounds far beyond any run keep the sizes computed from them within int64 (the memory
  // estimate refuses what does not fit the machine, with the numbers).
  constexpr int64_t kMaxRows = int64_t{1} << 20, kMaxTokens = int64_t{1} << 24;
  TANDEM_CHECK(c.train.micro_batch > 0, "train.micro_batch must be > 0, got ", c.train.micro_batch);
  TANDEM_CHECK(c.train.micro_batch <= kMaxRows, "train.micro_batch must be within 1 .. ", kMaxRows, ", got ",
               c.train.micro_batch);
  TANDEM_CHECK(c.train.grad_accum > 0, "train.grad_accum must be > 0, got ", c.train.grad_accum);
  TANDEM_CHECK(c.train.grad_accum <= kMaxRows, "train.grad_accum must be within 1 .. ", kMaxRows, ", got ",
               c.train.grad_accum);
  TANDEM_CHECK(c.train.seq_len >= 0 && c.train.seq_len <= kMaxTokens, "train.seq_len must be within 0 .. ", kMaxTokens,
               " (0 = model.max_seq_len), got ", c.train.seq_len);
  TANDEM_CHECK(c.train.grad_clip >= 0, "train.grad_clip must be >= 0 (0 disables), got ", c.train.grad_clip);
  TANDEM_CHECK(c.train.log_every > 0, "train.log_every must be > 0, got ", c.train.log_every);
  TANDEM_CHECK(c.train.eval_every >= 0, "train.eval_every must be >= 0, got ", c.train.eval_every);
  TANDEM_CHECK(c.train.eval_every == 0 || c.train.eval_batches > 0, "train.eval_batches must be > 0 when evaluating");
  TANDEM_CHECK(c.train.checkpoint_every >= 0, "train.checkpoint_every must be >= 0, got ", c.train.checkpoint_every);
  TANDEM_CHECK(c.train.keep_checkpoints >= 1, "train.keep_checkpoints must be >= 1, got ", c.train.keep_checkpoints);
  const auto& p = c.train.progress;
  TANDEM_CHECK(p == "auto" || p == "bar" || p == "lines" || p == "off",
               "train.progress must be auto, bar, lines or off; got '", p, "'");
  const auto& ot = c.optim.type;
  TANDEM_CHECK(ot == "adamw" || ot == "adam" || ot == "sgd" || ot == "lion",
               "optim.type must be adamw, adam, sgd or lion; got '", ot, "'");
  const auto& oi = c.optim.impl;
  TANDEM_CHECK(oi == "auto" || oi == "fused" || oi == "cpu", "optim.impl must be auto, fused or cpu; got '", oi, "'");
  TANDEM_CHECK(c.optim.state_dtype == "fp32" || c.optim.state_dtype == "bf16",
               "optim.state_dtype must be fp32 or bf16; got '", c.optim.state_dtype, "'");
  TANDEM_CHECK(c.optim.state_rounding == "nearest" || c.optim.state_rounding == "stochastic",
               "optim.state_rounding must be nearest or stochastic; got '", c.optim.state_rounding, "'");
  TANDEM_CHECK(oi != "fused" || (c.optim.state_dtype == "fp32" && (ot == "adamw" || ot == "adam")),
               "optim.impl=fused runs adamw and adam with fp32 states only; use optim.impl=cpu for optim.type=", ot,
               " and optim.state_dtype=", c.optim.state_dtype);
  TANDEM_CHECK(c.optim.momentum >= 0 && c.optim.momentum < 1, "optim.momentum must be in [0, 1), got ",
               c.optim.momentum);
  TANDEM_CHECK(c.optim.dampening >= 0 && c.optim.dampening <= 1, "optim.dampening must be in [0, 1], got ",
               c.optim.dampening);
  TANDEM_CHECK(!c.optim.nesterov || (c.optim.momentum > 0 && c.optim.dampening == 0),
               "optim.nesterov needs optim.momentum > 0 and optim.dampening = 0");
  TANDEM_CHECK(c.optim.cpu_threads >= 0 && c.optim.cpu_threads <= 4096,
               "optim.cpu_threads must be within 0 .. 4096 (0 = automatic), got ", c.optim.cpu_threads);
  const auto& isa = c.optim.cpu_isa;
  TANDEM_CHECK(isa == "auto" || isa == "scalar" || isa == "avx2" || isa == "avx512" || isa == "avx512bf16",
               "optim.cpu_isa must be auto, scalar, avx2, avx512 or avx512bf16; got '", isa, "'");
  TANDEM_CHECK(c.optim.lr > 0, "optim.lr must be > 0, got ", c.optim.lr);
  TANDEM_CHECK(c.optim.beta1 >= 0 && c.optim.beta1 < 1, "optim.beta1 must be in [0, 1), got ", c.optim.beta1);
  TANDEM_CHECK(c.optim.beta2 >= 0 && c.optim.beta2 < 1, "optim.beta2 must be in [0, 1), got ", c.optim.beta2);
  TANDEM_CHECK(c.optim.eps > 0, "optim.eps must be > 0, got ", c.optim.eps);
  TANDEM_CHECK(c.optim.weight_decay >= 0, "optim.weight_decay must be >= 0, got ", c.optim.weight_decay);
  TANDEM_CHECK(c.optim.warmup_steps >= 0, "optim.warmup_steps must be >= 0, got ", c.optim.warmup_steps);
  TANDEM_CHECK(c.optim.min_lr_ratio >= 0 && c.optim.min_lr_ratio <= 1, "optim.min_lr_ratio must be in [0, 1], got ",
               c.optim.min_lr_ratio);
  TANDEM_CHECK(c.data.val_fraction >= 0 && c.data.val_fraction < 1, "data.val_fraction must be in [0, 1), got ",
               c.data.val_fraction);
  TANDEM_CHECK(c.data.prefetch >= 1 && c.data.prefetch <= 64, "data.prefetch must be within 1 .. 64, got ",
               c.data.prefetch);
  TANDEM_CHECK(c.data.synthetic_bytes >= 4096 && c.data.synthetic_bytes <= (int64_t{1} << 34),
               "data.synthetic_bytes must be within 4096 .. 16 GiB (for more text, give data.path), got ",
               c.data.synthetic_bytes);
  TANDEM_CHECK(c.scaler.init_scale > 0, "scaler.init_scale must be > 0");
  TANDEM_CHECK(c.scaler.growth_factor > 1, "scaler.growth_factor must be > 1");
  TANDEM_CHECK(c.scaler.backoff_factor > 0 && c.scaler.backoff_factor < 1, "scaler.backoff_factor must be in (0, 1)");
  TANDEM_CHECK(c.scaler.growth_interval > 0, "scaler.growth_interval must be > 0");
}

const char* to_string(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
  }
  return "?";
}

const char* to_string(LrSchedule s) {
  switch (s) {
    case LrSchedule::kCosine:
      return "cosine";
    case LrSchedule::kLinear:
      return "linear";
    case LrSchedule::kConstant:
      return "constant";
  }
  return "?";
}

}  // namespace tandem
