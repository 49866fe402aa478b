#include "tandem/run/run_plan.h"

#include <algorithm>
#include <ctime>
#include <filesystem>

#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/io/checkpoint.h"
#include "tandem/io/hf.h"
#include "tandem/memory/activation_choice.h"
#include "tandem/memory/host_fit.h"
#include "tandem/parallel/comm.h"
#include "tandem/parallel/pipeline_profile.h"
#include "tandem/run/engine_setup.h"
#include "tandem/run/run_setup.h"

namespace fs = std::filesystem;

namespace tandem {

std::string new_run_dir(const std::string& preset) {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&now));
  std::string base = std::string("runs/") + buf + "-" + preset;
  std::string dir = base;
  for (int i = 2; fs::exists(dir); ++i) dir = base + "-" + std::to_string(i);
  return dir;
}

namespace {

// Note [Run directory]
// A run writes metrics.jsonl, config.yaml, checkpoints and the rest into its directory. A second
// run into a directory that holds one would append its rows to the first's and put its checkpoints
// beside the old ones, and a later --resume auto would take the old run's; a folder that is not a
// run may hold anything. So without --resume a run directory must be new or empty; the refusal
// names --resume auto and a fresh directory.
std::string run_dir_refusal(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec) || fs::is_empty(dir, ec)) return "";
  if (!fs::is_directory(dir, ec)) return "run directory '" + dir + "' is a file; give a new --run-dir";
  std::vector<std::string> found;
  for (const char* f : {"metrics.jsonl", "config.yaml", "checkpoints", "summary.json"})
    if (fs::exists(fs::path(dir) / f, ec)) found.push_back(f);
  if (!found.empty())
    return "run directory '" + dir + "' already holds a run (" + join(found, ", ") +
           "); continue it with --resume auto --run-dir " + dir + ", or give a new --run-dir";
  return "'" + dir +
         "' is not empty and holds no tandem run; give an empty or new --run-dir (a run writes "
         "only into its own directory)";
}

// The offload engine's memory plan of this rank's layout, agreed within its stage.
void plan_offload(RunPlan& plan, Config& cfg, const RunContext& ctx) {
  plan.gpu_blocks =
      plan_gpu_blocks(plan.spec, cfg, plan.seq_len, ctx.device, &plan.split_range, ctx.ranks, plan.layout);
  if (cfg.offload.host_ring == -1) cfg.offload.host_ring = 0;  // no plan to choose from (the CPU as the device)
  agree_on_offload_plan(ctx, plan.gpu_blocks, plan.split_range, cfg.offload, plan.layout);
}

// Note [Automatic activation offload]: the count of this rank's host room and link, rank 0's on
// every rank, before the fits are checked with it.
void resolve_auto_activation_offload(Config& cfg, const ModelSpec& spec, int64_t seq_len, const RunContext& ctx,
                                     int64_t available) {
  if (cfg.model.activation_offload != ModelConfig::kAutoActivationOffload) return;
  Config without = cfg;
  without.model.activation_offload = 0;
  const int64_t room =
      available > 0 ? available - host_demand(spec, without, seq_len, !ctx.device.is_cuda()).total() : -1;
  int64_t n = resolve_activation_offload(cfg, spec, seq_len, ctx.device, std::max<int64_t>(room, -1))
                  .model.activation_offload;
  if (ctx.comm) n = std::stoll(ctx.comm->broadcast_string("activation_offload", std::to_string(n)));
  cfg.model.activation_offload = n;
}

}  // namespace

std::string RunPlan::checkpoint_dir() const { return (fs::path(run_dir) / "checkpoints").string(); }

// Note [Run plan]
// The config a rank runs differs from the user's in what only the run can decide, all of it here:
// the host ring and speculation the memory plan chose (rank 0's, on every rank), progress output
// on rank 0 only, the CPU update threads of this rank's core share (torchrun's OMP_NUM_THREADS=1
// would starve them), and no out-of-memory retry with several ranks (a step retried on one rank
// would not match the others' collectives). Nothing writes to the config after this.
RunPlan resolve_run_plan(Config cfg, const TrainOptions& options, const RunContext& ctx) {
  RunPlan plan;
  const RankInfo& ranks = ctx.ranks;
  plan.offload = cfg.offload.optimizer == OffloadTarget::kCpu;
  TANDEM_CHECK(cfg.dist.zero_stage == 0 || plan.offload,
               "dist.zero_stage=2 shards the offload engine's masters and optimizer states; set offload.optimizer=cpu, "
               "or dist.zero_stage=0");
  if (plan.offload) {
    TANDEM_CHECK(cfg.optim.type == OptimizerType::kAdamW || cfg.optim.type == OptimizerType::kAdam,
                 "offload.optimizer=cpu runs optim.type=adamw or adam; got '", to_string(cfg.optim.type),
                 "'; use offload.optimizer=none for sgd and lion");
  }
  if (ctx.comm) {
    if (ranks.rank != 0) cfg.train.progress = ProgressMode::kOff;
    if (ctx.cpu_share > 0 && cfg.optim.cpu_threads == 0 && std::getenv("TANDEM_CPU_THREADS") == nullptr)
      cfg.optim.cpu_threads = ctx.cpu_share;
  }

  // Checkpoint to resume from, before anything is created.
  if (!options.resume.empty()) plan.resume_dir = resolve_checkpoint_dir(options.resume);

  // Architecture: the preset with overrides, or an HF directory's config.json.
  if (!cfg.model.init_from.empty()) {
    const std::string src = plan.resume_dir.empty() ? cfg.model.init_from : plan.resume_dir;
    plan.spec = spec_with_folder_overrides(spec_from_hf_config((fs::path(src) / "config.json").string()), cfg.model,
                                           src);  // Note [Folder overrides]
    plan.spec.name = "hf";
  } else {
    plan.spec = resolve_model_spec(cfg.model);
  }
  const ModelSpec& spec = plan.spec;
  plan.seq_len = cfg.train.seq_len > 0 ? cfg.train.seq_len : std::min<int64_t>(spec.max_seq_len, 2048);
  TANDEM_CHECK(plan.seq_len <= spec.max_seq_len, "train.seq_len=", plan.seq_len,
               " exceeds model.max_seq_len=", spec.max_seq_len, "; lower train.seq_len or raise model.max_seq_len");

  // Note [Plan layout]: this rank's stage (when the config cuts the pipeline), replicas and shards.
  if (ctx.comm && pipeline_stage_count(cfg.dist) != 1)
    if (auto cut = configured_pipeline_cut(cfg.dist, spec.n_layer + 2)) plan.stage_ends = *cut;
  const bool cut_later = ctx.comm && pipeline_stage_count(cfg.dist) != 1 && plan.stage_ends.empty();
  plan.layout = plan_layout(cfg, ranks.rank, ranks.world_size, plan.stage_ends, ctx.comm && ctx.comm->nccl());

  // Note [Host fit]: refused before anything is read or allocated when the host cannot hold the run
  // (the offload engine's plan is checked in plan_gpu_blocks).
  const bool cpu_device = !ctx.device.is_cuda();
  const int64_t available = (cfg.offload.host_memory_gib > 0
                                 ? static_cast<int64_t>(cfg.offload.host_memory_gib * double(1 << 30))
                                 : host_available_bytes()) /
                            ranks.local_world_size;
  resolve_auto_activation_offload(cfg, spec, plan.seq_len, ctx, available);
  if (!plan.offload && !cut_later) {
    check_host_fits(host_demand(spec, cfg, plan.seq_len, cpu_device), available, spec, cfg, cpu_device);
    if (!cpu_device && accelerator())
      check_gpu_fit(spec, cfg, plan.seq_len, accelerator()->memory_stats(ctx.device_index).total, plan.layout);
  }

  // Run directory: explicit, the resumed run's, or a new one under runs/ (made by the trainer).
  plan.run_dir = cfg.train.run_dir;
  if (plan.run_dir.empty() && !plan.resume_dir.empty())
    plan.run_dir = fs::path(plan.resume_dir).parent_path().parent_path().string();
  if (plan.run_dir.empty()) plan.run_dir = new_run_dir(spec.name);
  if (ctx.comm) plan.run_dir = ctx.comm->broadcast_string("run_dir", plan.run_dir);  // named by rank 0
  if (options.resume.empty() && !options.resume_asked) {  // Note [Run directory]: rank 0 looks, all refuse alike
    std::string why = ctx.main_rank() ? run_dir_refusal(plan.run_dir) : "";
    if (ctx.comm) why = ctx.comm->broadcast_string("run_dir_refusal", why);
    if (!why.empty()) throw UserError(why);
  }

  // The offload memory plan, checked against the machine before anything is allocated (the
  // model's own fp32 build would otherwise count against the host memory it is about to free).
  if (plan.offload && cut_later) plan.gpu_blocks = -1;  // settle_stage_plan, once the partitioner has cut
  if (plan.offload && !cut_later) plan_offload(plan, cfg, ctx);
  // Note [Adaptive micro-batch] retries a step on one rank only; the others' collectives would not match.
  if (ctx.comm && cfg.train.oom_retry) {
    cfg.train.oom_retry = false;
    log::info("train.oom_retry is off with several ranks (a retried step on one rank would not match the others)");
  }
  plan.cfg = std::move(cfg);
  return plan;
}

}  // namespace tandem

namespace tandem {

void settle_stage_plan(RunPlan& plan, const std::vector<int64_t>& ends, const RunContext& ctx) {
  if (!plan.stage_ends.empty() || ends.empty()) return;
  plan.stage_ends = ends;
  plan.layout = plan_layout(plan.cfg, ctx.ranks.rank, ctx.ranks.world_size, ends, ctx.comm && ctx.comm->nccl());
  if (plan.offload) {
    plan_offload(plan, plan.cfg, ctx);
  } else if (ctx.device.is_cuda() && accelerator()) {
    check_gpu_fit(plan.spec, plan.cfg, plan.seq_len, accelerator()->memory_stats(ctx.device_index).total, plan.layout);
  }
}

}  // namespace tandem
