#include "tandem/cli/inspect_command.h"

#include <CLI/CLI.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/fs.h"
#include "tandem/core/strings.h"
#include "tandem/io/hf.h"
#include "tandem/memory/activation_choice.h"
#include "tandem/memory/estimate.h"
#include "tandem/memory/host_fit.h"
#include "tandem/memory/plan.h"
#include "tandem/models/family.h"
#include "tandem/models/recipe.h"
#include "tandem/models/spec.h"
#include "tandem/parallel/pipeline_grid.h"
#include "tandem/parallel/pipeline_profile.h"

namespace tandem {
namespace {

ModelSpec spec_for(const Config& cfg) {
  if (!cfg.model.init_from.empty()) return spec_from_hf_config(cfg.model.init_from + "/config.json");
  return resolve_model_spec(cfg.model);
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Where the GPU-updated Blocks keep fp32 m and v and bf16 ones would let more of them fit: how many
// (13B at B=8 on an H200: 16 against 23, 1.32x against 1.09x its bound, docs/benchmarks.md).
std::string bf16_device_states_hint(const ModelSpec& s, const Config& cfg, int64_t T, const MemoryCapacity& cap,
                                    const PlanLayout& layout, int64_t fit, int64_t L) {
  if (fit < 0 || fit >= L || device_state_bytes(cfg.optim.device_state_dtype, cfg.optim.state_dtype) != 4) return "";
  Config bf16 = cfg;
  bf16.optim.device_state_dtype = DeviceStateDtype::kBf16;
  const int64_t more = largest_fitting_gpu_blocks(s, bf16, T, cap, layout);
  if (more <= fit) return "";
  return strprintf("; with optim.device_state_dtype=bf16 (their m and v in bf16) %lld would fit", (long long)more);
}

// The plan of one rank's layout: the split from offload.update_split (auto = the most GPU-updated
// Blocks that fit), the host ring, the table and the budgets. Returns the plan checked later.
MemoryPlan print_rank_plan(Config cfg, const ModelSpec& s, int64_t T, const MemoryCapacity& cap,
                           const PlanLayout& layout) {
  const int64_t L = layout_layers(s, layout);
  const auto k = parse_update_split(cfg.offload.update_split);
  int64_t g = 0;
  std::string split;
  if (k) {
    g = std::llround(*k * double(L));
    split = strprintf("offload.update_split=%s: %lld of %lld decoder blocks GPU-updated",
                      cfg.offload.update_split.c_str(), (long long)g, (long long)L);
  } else {
    const int64_t fit = largest_fitting_gpu_blocks(s, cfg, T, cap, layout);
    g = std::max<int64_t>(fit, 0);
    split = fit >= 0
                ? strprintf("offload.update_split=auto: %lld of %lld decoder blocks GPU-updated, the most that fit",
                            (long long)g, (long long)L)
                : std::string("offload.update_split=auto: not even 0 GPU-updated blocks fit");
    split += bf16_device_states_hint(s, cfg, T, cap, layout, fit, L);
  }
  const bool ring_auto = cfg.offload.host_ring < 0;
  cfg.offload = resolve_host_ring(s, cfg, T, g, cap, layout);
  if (ring_auto && cfg.offload.host_ring > 0)
    split += strprintf("; offload.host_ring=auto: a ring of %lld slots (per-block buffers do not fit the host)",
                       (long long)cfg.offload.host_ring);
  const bool nvme_auto = cfg.offload.nvme_blocks < 0;
  cfg.offload.nvme_blocks = resolve_nvme_blocks(s, cfg, T, g, cap, layout);
  if (!cfg.offload.nvme_path.empty())
    split += strprintf("; offload.nvme_blocks=%s: the states of the last %lld CPU-updated blocks on the NVMe tier",
                       nvme_auto ? "auto" : std::to_string(cfg.offload.nvme_blocks).c_str(),
                       (long long)cfg.offload.nvme_blocks);
  const MemoryPlan plan = plan_offload_memory(s, cfg, T, g, layout);
  std::printf("\n%s\n%s", split.c_str(), format_plan(plan).c_str());
  std::printf("budget: GPU %s of %s (offload.gpu_memory_fraction=%.2f)", format_bytes(double(plan.gpu_bytes())).c_str(),
              format_bytes(double(cap.gpu_total) * cfg.offload.gpu_memory_fraction).c_str(),
              cfg.offload.gpu_memory_fraction);
  if (plan.pinned && cap.host_available > 0)
    std::printf(", pinned host %s of %s (offload.host_memory_fraction=%.2f)",
                format_bytes(double(plan.pinned_bytes())).c_str(),
                format_bytes(double(cap.host_available) * cfg.offload.host_memory_fraction).c_str(),
                cfg.offload.host_memory_fraction);
  std::printf("\n");
  return plan;
}

// The offload plan of every rank role of the layout (one per pipeline stage), then check_plan_fits
// of each (a UserError naming the first that does not fit).
int print_offload_plan(const Config& cfg, const ModelSpec& s, int64_t T, const InspectOptions& opts) {
  MemoryCapacity cap;
  std::string gpu_source;
  const bool cuda = cfg.train.device.kind != DeviceSpec::Kind::kCpu && torch::cuda::is_available() && accelerator() &&
                    accelerator()->device_count() > 0;
  if (cuda && !opts.gpu_memory_given) {
    cap.gpu_total = accelerator()->memory_stats(0).total;
    gpu_source = accelerator()->device_name(0);
  } else {
    cap.gpu_total = static_cast<int64_t>(opts.gpu_memory_gib * kGiB);
    gpu_source = opts.gpu_memory_given                             ? "--gpu-memory"
                 : cfg.train.device.kind == DeviceSpec::Kind::kCpu ? "train.device=cpu: default, set with --gpu-memory"
                                                                   : "no GPU visible: default, set with --gpu-memory";
  }
  cap.host_available =
      opts.host_memory_gib > 0 ? static_cast<int64_t>(opts.host_memory_gib * kGiB) : host_available_bytes();
  const std::string host_source = opts.host_memory_gib > 0 ? "--host-memory"
                                  : cap.host_available > 0
                                      ? "MemAvailable"
                                      : "unknown: the pinned tier is not checked; set --host-memory";
  std::printf("\nGPU: %s (%s); host: %s available (%s)", format_bytes(double(cap.gpu_total)).c_str(),
              gpu_source.c_str(), format_bytes(double(cap.host_available)).c_str(), host_source.c_str());
  const auto world = static_cast<int>(opts.ranks);
  std::vector<int64_t> ends;
  const int64_t stages = pipeline_stage_count(cfg.dist);
  if (world > 1 && stages != 1) {
    const auto cut = configured_pipeline_cut(cfg.dist, s.n_layer + 2);
    TANDEM_CHECK(cut || stages > 1,
                 "--plan with dist.pipeline_stages=auto needs the cut: set dist.pipeline_cut (a list, or even)");
    ends = cut ? *cut : even_pipeline_cut(stages, s.n_layer + 2);
    if (!cut) std::printf("; dist.pipeline_cut is the partitioner's at run time, planned here as even");
  }
  if (world > 1) {
    TANDEM_CHECK(world % std::max<int64_t>(1, static_cast<int64_t>(ends.size())) == 0, "--ranks ", world,
                 " is not a multiple of the ", ends.size(), " pipeline stages");
    cap.host_available /= world;
    std::printf("\n%d ranks on one host, one GPU each: each rank's plan against its share of the host", world);
  }
  std::printf("\n");
  std::vector<MemoryPlan> plans;
  const int64_t roles = std::max<int64_t>(1, static_cast<int64_t>(ends.size()));
  for (int64_t stage = 0; stage < roles; ++stage) {
    const PlanLayout layout = plan_layout(cfg, static_cast<int>(stage * (world / roles)), world, ends, world > 1);
    plans.push_back(print_rank_plan(cfg, s, T, cap, layout));
  }
  std::fflush(stdout);
  for (const auto& plan : plans) check_plan_fits(plan, cap, cfg.offload, cfg.train);
  std::printf("the plan fits\n");
  return 0;
}

// What the family adds to Llama's decoder, in one line; "" for Llama's own.
std::string decoder_parts_line(const ModelSpec& s) {
  const DecoderParts& p = s.parts;
  std::vector<std::string> parts;
  if (p.qkv_bias || p.o_bias || p.mlp_bias) parts.push_back(p.mlp_bias ? "biases" : "q/k/v biases");
  if (p.norm == NormKind::kRmsPlusOne) parts.push_back("(1 + w) RMSNorm");
  if (p.norm == NormKind::kLayerNorm) parts.push_back("LayerNorm");
  if (p.act != Activation::kSilu) parts.push_back(p.gated_ffn ? "GeGLU" : "GELU feed-forward");
  if (p.scale_embedding) parts.push_back("embeddings x sqrt(d_model)");
  if (p.learned_positions) parts.push_back("learned positions");
  if (p.rotary_fraction < 1) parts.push_back(strprintf("RoPE on %g of each head", p.rotary_fraction));
  if (s.rope_scaling.type != RopeType::kDefault) parts.push_back(strprintf("RoPE scaled x%g", s.rope_scaling.factor));
  if (p.sliding_window > 0)
    parts.push_back(strprintf("sliding window %lld (%s)", (long long)p.sliding_window,
                              p.sliding_layers.empty() ? "every layer" : "some layers"));
  if (p.sandwich_norms) parts.push_back("norms after attention and feed-forward");
  if (p.attn_softcap > 0) parts.push_back(strprintf("scores capped at %g", p.attn_softcap));
  if (p.final_softcap > 0) parts.push_back(strprintf("logits capped at %g", p.final_softcap));
  return parts.empty() ? "" : "decoder parts: " + join(parts, ", ");
}

}  // namespace

int run_inspect(const ResolvedConfig& resolved, const InspectOptions& opts) {
  Config cfg = resolved.config;
  if (cfg.model.activation_offload == ModelConfig::kAutoActivationOffload) {  // Note [Automatic activation offload]
    const std::string why = activation_offload_excluded(cfg);
    std::printf("model.activation_offload=auto: %s; the figures below offload none\n",
                why.empty() ? "the count is chosen when the run starts, from the device and the link timed then"
                            : ("none, " + why).c_str());
    cfg.model.activation_offload = 0;
  }
  const ModelSpec s = spec_for(cfg);
  if (!opts.hf_config.empty()) write_file_atomic(opts.hf_config, hf_config_json(s));
  const int64_t T = cfg.train.seq_len > 0 ? cfg.train.seq_len : std::min<int64_t>(s.max_seq_len, 2048);
  std::printf("model %s (%s): %lld layers, d_model %lld, d_ff %lld, vocab %lld (padded to %lld), %s embeddings\n",
              s.name.c_str(), s.arch == Arch::kDecoder ? to_string(s.family) : to_string(s.arch), (long long)s.n_layer,
              (long long)s.d_model, (long long)s.d_ff, (long long)s.vocab_size, (long long)s.padded_vocab(),
              s.tie_embeddings ? "tied" : "untied");
  if (s.arch == Arch::kDecoder)
    std::printf("attention: %lld heads, %lld key/value heads, head_dim %lld, RoPE theta %g, max_seq_len %lld\n",
                (long long)s.n_head, (long long)s.n_kv_head, (long long)s.head_dim(), s.rope_theta,
                (long long)s.max_seq_len);
  if (s.arch == Arch::kDecoder && !decoder_parts_line(s).empty()) std::printf("%s\n", decoder_parts_line(s).c_str());
  if (s.arch == Arch::kResNetBk)
    std::printf(
        "ResNet-BK: %lld BK heads (causal BK-core mixing), MoE of %lld experts (d_ff %lld), top-%lld, "
        "capacity factor %g\n",
        (long long)s.n_head, (long long)s.n_experts, (long long)s.d_ff, (long long)s.top_k, s.capacity_factor);
  if (s.arch == Arch::kAmxMoe)
    std::printf(
        "AMX+MoE: %lld dense layers (d_ff %lld, %s each), then %lld MoE layers of %lld experts (d_ff %lld, "
        "%s each), top-%lld, capacity factor %g\n",
        (long long)s.n_dense, (long long)s.d_ff, format_count(double(s.layer_params(0))).c_str(),
        (long long)(s.n_layer - s.n_dense), (long long)s.n_experts, (long long)s.d_ff,
        format_count(double(s.layer_params(s.n_layer - 1))).c_str(), (long long)s.top_k, s.capacity_factor);
  const int64_t emb = s.padded_vocab() * s.d_model;
  std::printf("\nparameters: %s (%lld; %lld as stored with vocabulary padding)\n",
              format_count(double(s.num_params_unpadded())).c_str(), (long long)s.num_params_unpadded(),
              (long long)s.num_params());
  std::printf("  %-24s %12s\n", "block", "params");
  std::printf("  %-24s %12s\n", "embed", format_count(double(emb)).c_str());
  std::printf("  %-24s %12s  each, %s in all\n", ("layer.0 .. layer." + std::to_string(s.n_layer - 1)).c_str(),
              format_count(double(s.params_per_layer())).c_str(),
              format_count(double(s.params_per_layer() * s.n_layer)).c_str());
  std::printf("  %-24s %12s\n", s.tie_embeddings ? "head (norm; tied lm_head)" : "head (norm + lm_head)",
              format_count(double(s.d_model + (s.tie_embeddings ? 0 : emb))).c_str());

  // Tensor-core alignment of every matrix as stored (vocabulary and feed-forward padded).
  const auto bad8 = misaligned_dims(s, 8), bad16 = misaligned_dims(s, 16);
  std::printf(
      "\ntensor-core shapes: vocab %lld -> %lld, d_ff %lld -> %lld as stored (padding is zero and never "
      "changes the model)\n",
      (long long)s.vocab_size, (long long)s.padded_vocab(), (long long)s.d_ff, (long long)s.padded_d_ff());
  if (bad8.empty())
    std::printf("  every matrix dimension is a multiple of 8 (bf16/fp16)%s\n", bad16.empty() ? " and of 16 (fp8)" : "");
  for (const auto& m : bad8) std::printf("  not a multiple of 8 (bf16/fp16 tensor cores): %s\n", m.c_str());
  if (!bad8.empty())
    std::printf(
        "  d_model and head_dim cannot be padded without changing the model: choose multiples of 8 (64 is "
        "best)\n");
  if (bad8.empty())
    for (const auto& m : bad16) std::printf("  not a multiple of 16 (fp8): %s\n", m.c_str());
  std::printf("\n%s", format_recipe(resolved).c_str());
  if (opts.plan) return print_offload_plan(cfg, s, T, opts);
  if (opts.partition || opts.partition_opts.with_cpu) return run_partition_inspect(cfg, s, T, opts.partition_opts);
  const auto e = estimate_training_memory(s, cfg.train.micro_batch, T, cfg.train.precision, cfg.model.checkpointing);
  const bool cuda = cfg.train.device.kind != DeviceSpec::Kind::kCpu && torch::cuda::is_available();
  std::printf("\nmemory estimate for training: micro-batch %lld x %lld tokens, %s, activation checkpointing %s\n",
              (long long)cfg.train.micro_batch, (long long)T, to_string(cfg.train.precision),
              cfg.model.checkpointing ? "on" : "off");
  std::printf("  %-28s %14s %14s\n", "", cuda ? "GPU" : "CPU (device)", "host");
  for (const auto& [name, bytes] : e.rows())
    std::printf("  %-28s %14s %14s\n", name.c_str(), format_bytes(double(bytes)).c_str(), "-");
  const int64_t host = cfg.data.prefetch * 2 * cfg.train.micro_batch * T * 8;
  std::printf("  %-28s %14s %14s\n", "prefetched batches", "-", format_bytes(double(host)).c_str());
  std::printf("  %-28s %14s %14s\n", "total", format_bytes(double(e.total())).c_str(),
              format_bytes(double(host)).c_str());
  if (cuda && accelerator()) {
    const auto ms = accelerator()->memory_stats(0);
    std::printf(
        "\n%s: %s free of %s: the estimate %s\n", accelerator()->device_name(0).c_str(),
        format_bytes(double(ms.free)).c_str(), format_bytes(double(ms.total)).c_str(),
        e.total() <= ms.free ? "fits" : "does NOT fit (lower train.micro_batch or set model.checkpointing=true)");
  } else {
    std::printf("\nhost: %s available\n", format_bytes(double(host_available_bytes())).c_str());
  }
  return 0;
}

InspectCommand::InspectCommand(CLI::App& app) {
  auto* c = command_ =
      app.add_subcommand("inspect", "show the model, its parameter counts and the memory estimate per device");
  args_.add_to(c, false);
  auto& o = options_;
  c->add_flag("--plan", o.plan,
              "the offload engine's memory plan (GPU, pinned and pageable host) instead of the estimate; refuses a "
              "plan that does not fit");
  c->add_flag("--partition", o.partition,
              "profile each Block here and print the pipeline partitioner's plan for dist.pipeline_stages (auto: the "
              "best stage count): stages, Blocks, devices, predicted time and memory");
  c->add_flag("--partition-cpu", o.partition_opts.with_cpu,
              "--partition, and the host CPU weighed as one more stage beside the GPUs");
  c->add_option("--partition-ranks", o.partition_opts.ranks,
                "with --partition: ranks to plan for (default one per visible GPU, 1 on the CPU); ranks beyond the "
                "visible devices are copies of the first")
      ->check(CLI::PositiveNumber);
  gpu_memory_ = c->add_option("--gpu-memory", o.gpu_memory_gib,
                              "GiB of GPU memory to plan for (default: the first visible GPU's, else 80)")
                    ->check(CLI::PositiveNumber);
  c->add_option("--host-memory", o.host_memory_gib,
                "GiB of available host memory to plan for (default: MemAvailable of /proc/meminfo)")
      ->check(CLI::PositiveNumber);
  c->add_option("--ranks", o.ranks,
                "with --plan: ranks on this host, one GPU each, to plan for (dist.zero_stage, dist.pipeline_stages "
                "and dist.pipeline_cut lay them out; a plan per stage)")
      ->check(CLI::PositiveNumber);
  c->add_option("--hf-config", o.hf_config,
                "also write the model's Hugging Face config.json to this file (for a peer that builds the same "
                "architecture)");
}

bool InspectCommand::chosen() const { return command_->parsed(); }

int InspectCommand::run() {
  options_.gpu_memory_given = gpu_memory_->count() > 0;
  return run_inspect(args_.resolve_layers(""), options_);
}

}  // namespace tandem
