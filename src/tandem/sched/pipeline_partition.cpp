#include "tandem/sched/pipeline_partition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"

namespace tandem {

// Note [Pipeline partition]
// A pipeline of p stages runs m micro-batches. With stage s taking t_s for one micro-batch's
// forward and backward, both GPipe and 1F1B take (m - 1) * max_s t_s + sum_s t_s per step: the
// slowest stage paces the steady state and the fill and drain pass every stage once (Narayanan et
// al. 2019, PipeDream-Flush; Huang et al. 2019, GPipe). With equal stages the idle share of each
// stage is (p - 1) / (m + p - 1), the bubble. The schedules differ in memory: under GPipe a stage
// keeps the activations of all m micro-batches until their backward, under 1F1B stage s keeps at
// most p - s of them.
// t_s is the stage's Blocks' measured time over its device's speed, plus the transfers of its
// boundary activations (down in the forward, their gradients up in the backward) over the link.
// The partitioner minimises that step over contiguous cuts, each stage within its device's memory:
// for every candidate bottleneck B (the time of some range of Blocks on some stage's device), a
// dynamic programme over (stage, end Block) finds the least sum of stage times with every stage
// at most B; the step is then at most (m - 1) B + that sum, and the optimum is the least over B
// (the optimal plan's own bottleneck is among the candidates). Candidates are taken in ascending
// order and the search stops once (m - 1) B alone passes the best step found.

namespace {

struct Prefix {
  std::vector<double> time;
  std::vector<int64_t> static_bytes, activation_bytes;
  explicit Prefix(const std::vector<PipelineBlockCost>& blocks)
      : time(blocks.size() + 1, 0.0), static_bytes(blocks.size() + 1, 0), activation_bytes(blocks.size() + 1, 0) {
    for (size_t i = 0; i < blocks.size(); ++i) {
      time[i + 1] = time[i] + blocks[i].time_s;
      static_bytes[i + 1] = static_bytes[i] + blocks[i].static_bytes;
      activation_bytes[i + 1] = activation_bytes[i] + blocks[i].activation_bytes;
    }
  }
};

int64_t in_flight(const PartitionOptions& o, int64_t stage, int64_t stages) {
  return o.schedule == PipelineSchedule::kGPipe ? o.micro_batches : std::min(o.micro_batches, stages - stage);
}

// Blocks [a, b) as stage s of p on device d.
struct StageCost {
  const std::vector<PipelineBlockCost>& blocks;
  const std::vector<PipelineDevice>& devices;
  const PartitionOptions& options;
  Prefix prefix;
  int64_t stages;

  double time(int64_t a, int64_t b, int64_t s) const {
    double bytes = 0;
    if (a > 0) bytes += static_cast<double>(blocks[a - 1].output_bytes);
    if (b < static_cast<int64_t>(blocks.size())) bytes += static_cast<double>(blocks[b - 1].output_bytes);
    return (prefix.time[b] - prefix.time[a]) / devices[s].speed + 2.0 * bytes / options.link_bytes_per_s;
  }
  int64_t memory(int64_t a, int64_t b, int64_t s) const {
    return prefix.static_bytes[b] - prefix.static_bytes[a] +
           (prefix.activation_bytes[b] - prefix.activation_bytes[a]) * in_flight(options, s, stages);
  }
  bool fits(int64_t a, int64_t b, int64_t s) const { return memory(a, b, s) <= devices[s].memory_bytes; }
};

// The least sum of stage times with every stage at most `bound` (and within memory unless
// `ignore_memory`): the stages' ends, or nullopt.
std::optional<std::vector<int64_t>> least_sum_cut(const StageCost& c, double bound, bool ignore_memory) {
  const int64_t n = static_cast<int64_t>(c.blocks.size()), p = c.stages;
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(p + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int64_t>> from(p + 1, std::vector<int64_t>(n + 1, -1));
  best[0][0] = 0;
  for (int64_t s = 0; s < p; ++s)
    for (int64_t a = s; a < n; ++a) {
      if (best[s][a] == inf) continue;
      for (int64_t b = a + 1; b <= n - (p - s - 1); ++b) {
        const double t = c.time(a, b, s);
        if (t > bound) continue;  // not monotonic in b: the boundary's transfer depends on where it is
        if (!ignore_memory && !c.fits(a, b, s)) continue;
        if (best[s][a] + t < best[s + 1][b]) {
          best[s + 1][b] = best[s][a] + t;
          from[s + 1][b] = a;
        }
      }
    }
  if (best[p][n] == inf) return std::nullopt;
  std::vector<int64_t> ends(p);
  for (int64_t s = p, b = n; s > 0; --s) {
    ends[s - 1] = b;
    b = from[s][b];
  }
  return ends;
}

std::optional<PipelinePlan> search(const std::vector<PipelineBlockCost>& blocks,
                                   const std::vector<PipelineDevice>& devices, const PartitionOptions& options,
                                   bool ignore_memory) {
  const StageCost c{blocks, devices, options, Prefix(blocks), static_cast<int64_t>(devices.size())};
  const int64_t n = static_cast<int64_t>(blocks.size());
  std::vector<double> candidates;
  for (int64_t s = 0; s < c.stages; ++s)
    for (int64_t a = 0; a < n; ++a)
      for (int64_t b = a + 1; b <= n; ++b) candidates.push_back(c.time(a, b, s));
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  std::optional<PipelinePlan> best;
  const double m1 = static_cast<double>(options.micro_batches - 1);
  for (const double bound : candidates) {
    if (best && m1 * bound >= best->step_s) break;
    const auto ends = least_sum_cut(c, bound, ignore_memory);
    if (!ends) continue;
    auto plan = evaluate_pipeline(blocks, devices, *ends, options);
    if (!best || plan.step_s < best->step_s) best = std::move(plan);
  }
  return best;
}

std::string gib(int64_t bytes) { return strprintf("%.2f GiB", static_cast<double>(bytes) / double(1 << 30)); }

}  // namespace

PipelinePlan evaluate_pipeline(const std::vector<PipelineBlockCost>& blocks, const std::vector<PipelineDevice>& devices,
                               const std::vector<int64_t>& ends, const PartitionOptions& options) {
  const int64_t p = static_cast<int64_t>(ends.size());
  TANDEM_ASSERT(p >= 1 && p <= static_cast<int64_t>(devices.size()) && ends.back() == int64_t(blocks.size()),
                "a cut of ", blocks.size(), " Blocks into ", p, " stages");
  const StageCost c{blocks, devices, options, Prefix(blocks), p};
  PipelinePlan plan;
  double slowest = 0, sum = 0;
  for (int64_t s = 0, a = 0; s < p; a = ends[s], ++s) {
    TANDEM_ASSERT(ends[s] > a, "stage ", s, " is empty");
    StagePlan st{a, ends[s], devices[s].name, c.time(a, ends[s], s), c.memory(a, ends[s], s), devices[s].memory_bytes};
    slowest = std::max(slowest, st.time_s);
    sum += st.time_s;
    plan.stages.push_back(st);
  }
  const double m = static_cast<double>(options.micro_batches);
  plan.step_s = (m - 1) * slowest + sum;
  double idle = 0;
  for (const auto& st : plan.stages) idle += 1.0 - m * st.time_s / plan.step_s;
  plan.bubble_fraction = idle / static_cast<double>(p);
  return plan;
}

bool fits(const PipelinePlan& plan) {
  return std::all_of(plan.stages.begin(), plan.stages.end(),
                     [](const StagePlan& s) { return s.memory_bytes <= s.memory_limit; });
}

PipelinePlan partition_pipeline(const std::vector<PipelineBlockCost>& blocks,
                                const std::vector<PipelineDevice>& devices, const PartitionOptions& options) {
  const int64_t n = static_cast<int64_t>(blocks.size()), p = static_cast<int64_t>(devices.size());
  TANDEM_CHECK(p >= 1 && p <= n, "dist.pipeline_stages=", p, " needs at least as many Blocks; the model has ", n,
               ": use at most ", n, " stages");
  TANDEM_CHECK(options.micro_batches >= 1, "a pipeline needs at least one micro-batch (train.grad_accum)");
  if (auto plan = search(blocks, devices, options, /*ignore_memory=*/false)) return *plan;
  const auto loose = search(blocks, devices, options, /*ignore_memory=*/true);
  TANDEM_ASSERT(loose.has_value(), "a cut without memory limits always exists");
  const auto worst = std::max_element(loose->stages.begin(), loose->stages.end(), [](const auto& x, const auto& y) {
    return double(x.memory_bytes) / double(std::max<int64_t>(1, x.memory_limit)) <
           double(y.memory_bytes) / double(std::max<int64_t>(1, y.memory_limit));
  });
  TANDEM_CHECK(false, "no cut of the ", n, " Blocks into ", p, " pipeline stages fits: the fastest one puts Blocks ",
               worst->first, "..", worst->end - 1, " on ", worst->device, ", which needs ", gib(worst->memory_bytes),
               " of its ", gib(worst->memory_limit),
               "; use more stages, the 1F1B schedule, fewer micro-batches, "
               "or offload (offload.optimizer=cpu)");
  return *loose;
}

PipelinePlan choose_pipeline(const std::vector<PipelineBlockCost>& blocks, const std::vector<PipelineDevice>& devices,
                             const std::vector<int64_t>& stage_counts, const PartitionOptions& options) {
  std::optional<PipelinePlan> best;
  std::string why;
  for (const int64_t p : stage_counts) {
    if (p < 1 || p > static_cast<int64_t>(devices.size()) || p > static_cast<int64_t>(blocks.size())) continue;
    try {
      auto plan =
          partition_pipeline(blocks, std::vector<PipelineDevice>(devices.begin(), devices.begin() + p), options);
      if (!best || plan.step_s < best->step_s) best = std::move(plan);
    } catch (const UserError& e) {
      why = e.what();
    }
  }
  TANDEM_CHECK(best.has_value(), why.empty() ? "no pipeline stage count fits the devices" : why);
  return *best;
}

// Note [Pipeline stage count]
// A run of n ranks with p stages is a grid of p stages x n/p replicas (Note [Pipeline parallel]);
// each replica runs m micro-batches per step, so a step trains n/p x m of them. The partitioner
// tries every p that dist.pipeline_stages allows (auto: every divisor of n, at most the Block
// count; a model whose embedding and head share a matrix only 1) and keeps the plan with the most
// micro-batches per second, n/p x m / step. Stage s is as fast and as large as the slowest and the
// smallest of its replicas' devices, which keep step through the stage's gradient reduction; that
// reduction is not in the step (it overlaps the backward, Note [Gradient reducer]), so with equal
// devices and memory to spare fewer stages and more replicas win: a pipeline pays off when the
// model does not fit one device or the devices differ.

std::vector<PipelineDevice> relative_to_first(std::vector<PipelineDevice> devices) {
  TANDEM_ASSERT(!devices.empty() && devices[0].speed > 0, "a reference device");
  const double unit = devices[0].speed;
  for (auto& d : devices) d.speed /= unit;
  return devices;
}

std::vector<PipelineDevice> stage_devices(const std::vector<PipelineDevice>& ranks, int64_t stages) {
  const int64_t n = static_cast<int64_t>(ranks.size());
  TANDEM_CHECK(stages >= 1 && n % stages == 0, "dist.pipeline_stages=", stages, " does not divide the ", n,
               " ranks; choose a stage count that divides ", n, " or auto");
  const int64_t width = n / stages;
  std::vector<PipelineDevice> out;
  for (int64_t s = 0; s < stages; ++s) {
    PipelineDevice d = ranks[static_cast<size_t>(s * width)];
    for (int64_t r = s * width + 1; r < (s + 1) * width; ++r) {
      const auto& o = ranks[static_cast<size_t>(r)];
      if (o.speed < d.speed) d.name = o.name, d.speed = o.speed;
      d.memory_bytes = std::min(d.memory_bytes, o.memory_bytes);
    }
    out.push_back(d);
  }
  return out;
}

std::vector<int64_t> pipeline_stage_counts(int64_t stages, int64_t ranks, int64_t blocks, bool tied) {
  TANDEM_CHECK(stages <= blocks, "dist.pipeline_stages=", stages, " is more stages than the model's ", blocks,
               " Blocks; use at most ", blocks, " stages");
  TANDEM_CHECK(stages <= 1 || !tied, "dist.pipeline_stages=", stages,
               ": the model ties its embedding and head, which the first and last stages would hold apart; set "
               "model.tie_embeddings=false or dist.pipeline_stages=1");
  if (stages >= 1) {
    TANDEM_CHECK(ranks % stages == 0, "dist.pipeline_stages=", stages, " does not divide the ", ranks,
                 " ranks; choose a stage count that divides ", ranks, " or auto");
    return {stages};
  }
  if (tied) return {1};
  std::vector<int64_t> out;
  for (int64_t p = 1; p <= std::min(ranks, blocks); ++p)
    if (ranks % p == 0) out.push_back(p);
  return out;
}

PipelinePlan plan_over_ranks(const std::vector<PipelineBlockCost>& blocks, const std::vector<PipelineDevice>& ranks,
                             const std::vector<int64_t>& counts, const PartitionOptions& options) {
  std::optional<PipelinePlan> best;
  std::string why = "no pipeline stage count fits the devices";
  const auto rate = [&](const PipelinePlan& p) { return double(p.replicas) / p.step_s; };
  for (const int64_t p : counts) {
    try {
      auto plan = partition_pipeline(blocks, stage_devices(ranks, p), options);
      plan.replicas = static_cast<int64_t>(ranks.size()) / p;
      if (!best || rate(plan) > rate(*best)) best = std::move(plan);
    } catch (const UserError& e) {
      why = e.what();
    }
  }
  TANDEM_CHECK(best.has_value(), why);
  return *best;
}

// Note [CPU pipeline stage]
// The host's cores can be one more pipeline stage, first or last, beside the GPU stages: they
// compute their Blocks on other micro-batches while the GPUs compute theirs, so a CPU that is
// slower per Block still shortens the step when its share takes no longer than the GPU stage's
// (the step is paced by the slowest stage, Note [Pipeline partition]). With one GPU every share of
// either end is tried; with several, the partitioner's fastest cut for each end. A GPU's average
// power over a step is idle_w + (busy_w - idle_w) x its busy share m t_s / step (the placement cost
// model's two-power model, Note [Placement policies]), so moving Blocks to the CPU also lowers it:
// with placement.gpu_power_budget_w set and exceeded by the GPUs alone, the fastest plan within the
// budget is chosen, even a slower one. Otherwise the CPU stage is chosen only for a shorter step,
// or when the GPUs alone cannot hold the model; when it is not, the verdict gives its best share's
// time against the GPU stage's.

namespace {

// The average power of the plan's GPUs (every stage but `cpu_stage`); none when one is unknown.
std::optional<double> gpu_power(const PipelinePlan& plan, const std::vector<PipelineDevice>& devices, int64_t cpu_stage,
                                int64_t micro_batches) {
  double w = 0;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    if (static_cast<int64_t>(s) == cpu_stage) continue;
    const auto& d = devices[s];
    if (!d.busy_w) return std::nullopt;
    const double busy = std::min(1.0, double(micro_batches) * plan.stages[s].time_s / plan.step_s);
    w += d.idle_w + (*d.busy_w - d.idle_w) * busy;
  }
  return w;
}

struct CpuPlan {
  PipelinePlan plan;
  int64_t cpu_stage = 0;
  std::optional<double> w;
};

// Every plan with the CPU first or last that fits (one GPU stage: every share; more: the fastest
// cut of each order).
std::vector<CpuPlan> cpu_plans(const std::vector<PipelineBlockCost>& blocks, const std::vector<PipelineDevice>& gpus,
                               const PipelineDevice& cpu, const PartitionOptions& o) {
  const int64_t n = static_cast<int64_t>(blocks.size()), k = static_cast<int64_t>(gpus.size());
  std::vector<CpuPlan> out;
  for (const bool first : {true, false}) {
    auto devices = gpus;
    devices.insert(first ? devices.begin() : devices.end(), cpu);
    const int64_t cpu_stage = first ? 0 : k;
    const auto add = [&](const PipelinePlan& plan) {
      if (fits(plan)) out.push_back({plan, cpu_stage, gpu_power(plan, devices, cpu_stage, o.micro_batches)});
    };
    if (k == 1) {
      for (int64_t c = 1; c < n; ++c) add(evaluate_pipeline(blocks, devices, {first ? c : n - c, n}, o));
    } else if (k + 1 <= n) {
      try {
        add(partition_pipeline(blocks, devices, o));
      } catch (const UserError&) {
      }
    }
  }
  return out;
}

std::string block_range(const std::vector<PipelineBlockCost>& blocks, const StagePlan& s) {
  return strprintf("Blocks %lld .. %lld (%s .. %s)", static_cast<long long>(s.first), static_cast<long long>(s.end - 1),
                   blocks[s.first].name.c_str(), blocks[s.end - 1].name.c_str());
}

// The slowest stage but the CPU's.
double gpu_stage_s(const CpuPlan& c) {
  double t = 0;
  for (size_t s = 0; s < c.plan.stages.size(); ++s)
    if (static_cast<int64_t>(s) != c.cpu_stage) t = std::max(t, c.plan.stages[s].time_s);
  return t;
}

std::string share_line(const std::vector<PipelineBlockCost>& blocks, const CpuPlan& c) {
  const auto& st = c.plan.stages[static_cast<size_t>(c.cpu_stage)];
  return strprintf("%s, %.2f ms per micro-batch on the CPU against %.2f ms for the GPU stage's",
                   block_range(blocks, st).c_str(), st.time_s * 1e3, gpu_stage_s(c) * 1e3);
}

std::string watts(const std::optional<double>& w) { return w ? strprintf("%.0f W", *w) : std::string("unknown W"); }

}  // namespace

CpuStageAnalysis analyse_cpu_stage(const std::vector<PipelineBlockCost>& blocks,
                                   const std::vector<PipelineDevice>& gpu_stages, const PipelineDevice& cpu,
                                   const PartitionOptions& options, double gpu_power_budget_w) {
  CpuStageAnalysis a;
  std::string alone_why;
  try {
    a.gpus_alone = partition_pipeline(blocks, gpu_stages, options);
    a.gpus_alone_w = gpu_power(*a.gpus_alone, gpu_stages, -1, options.micro_batches);
  } catch (const UserError& e) {
    alone_why = e.what();
  }
  const auto plans = cpu_plans(blocks, gpu_stages, cpu, options);
  if (plans.empty()) {
    a.verdict = strprintf("the host CPU cannot take a stage: no share of the Blocks fits its %s",
                          format_bytes(double(cpu.memory_bytes)).c_str());
    return a;
  }
  const auto faster = [](const CpuPlan& x, const CpuPlan& y) { return x.plan.step_s < y.plan.step_s; };
  const CpuPlan* fastest = &*std::min_element(plans.begin(), plans.end(), faster);
  const bool budget = gpu_power_budget_w > 0;
  const bool over = budget && a.gpus_alone && a.gpus_alone_w && *a.gpus_alone_w > gpu_power_budget_w;
  const CpuPlan* chosen = fastest;
  if (over) {
    chosen = nullptr;
    for (const auto& c : plans)
      if (c.w && *c.w <= gpu_power_budget_w && (!chosen || faster(c, *chosen))) chosen = &c;
  }
  const auto take = [&](const CpuPlan& c) {
    a.with_cpu = c.plan;
    a.cpu_stage = c.cpu_stage;
    a.with_cpu_w = c.w;
  };
  if (over && chosen == nullptr) {
    const auto coolest = std::min_element(plans.begin(), plans.end(), [](const CpuPlan& x, const CpuPlan& y) {
      return x.w.value_or(1e300) < y.w.value_or(1e300);
    });
    take(*coolest);
    a.verdict = strprintf(
        "the host CPU cannot bring the GPUs within placement.gpu_power_budget_w=%.0f W: %s alone, %s at best with "
        "the CPU taking %s",
        gpu_power_budget_w, watts(a.gpus_alone_w).c_str(), watts(coolest->w).c_str(),
        block_range(blocks, coolest->plan.stages[static_cast<size_t>(coolest->cpu_stage)]).c_str());
    return a;
  }
  take(*chosen);
  if (!a.gpus_alone) {
    a.helps = true;
    a.verdict = "the host CPU takes " + share_line(blocks, *chosen) +
                strprintf("; the GPU stages alone cannot hold the model (%s)", one_line(alone_why).c_str());
  } else if (over) {
    a.helps = true;
    a.verdict = strprintf(
        "the host CPU takes %s, so the GPUs average %s within placement.gpu_power_budget_w=%.0f W "
        "(%s alone); step %.1f ms against %.1f ms on the GPUs alone",
        share_line(blocks, *chosen).c_str(), watts(chosen->w).c_str(), gpu_power_budget_w,
        watts(a.gpus_alone_w).c_str(), chosen->plan.step_s * 1e3, a.gpus_alone->step_s * 1e3);
  } else if (chosen->plan.step_s < a.gpus_alone->step_s) {
    a.helps = true;
    a.verdict = strprintf("the host CPU helps: it takes %s; step %.1f ms against %.1f ms on the GPUs alone",
                          share_line(blocks, *chosen).c_str(), chosen->plan.step_s * 1e3, a.gpus_alone->step_s * 1e3);
  } else {
    a.verdict = strprintf(
        "the host CPU is too slow to help: its best share is %s; step %.1f ms against %.1f ms on "
        "the GPUs alone",
        share_line(blocks, *chosen).c_str(), chosen->plan.step_s * 1e3, a.gpus_alone->step_s * 1e3);
  }
  if (budget && !a.gpus_alone_w)
    a.verdict +=
        strprintf(" (the GPUs' power is unknown: placement.gpu_power_budget_w=%.0f W not checked)", gpu_power_budget_w);
  return a;
}

PartitionOptions partition_options(const Config& cfg) {
  PartitionOptions o;
  o.micro_batches = cfg.train.grad_accum;
  o.schedule = cfg.dist.pipeline_schedule;
  return o;
}

PipelinePlan plan_pipeline_costs(const std::vector<PipelineBlockCost>& blocks, const Config& cfg,
                                 const std::vector<PipelineDevice>& ranks, bool tied) {
  TANDEM_CHECK(!ranks.empty(), "no device to place pipeline stages on");
  const auto counts = pipeline_stage_counts(pipeline_stage_count(cfg.dist), static_cast<int64_t>(ranks.size()),
                                            static_cast<int64_t>(blocks.size()), tied);
  return plan_over_ranks(blocks, relative_to_first(ranks), counts, partition_options(cfg));
}

std::vector<int64_t> stage_ends(const PipelinePlan& plan) {
  std::vector<int64_t> ends;
  for (const auto& s : plan.stages) ends.push_back(s.end);
  return ends;
}

std::string format_pipeline_profile(const std::vector<PipelineBlockCost>& blocks) {
  std::string out =
      strprintf("%-6s %-12s %12s %12s %12s %12s\n", "block", "name", "time/micro", "static", "activations", "output");
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto& b = blocks[i];
    out += strprintf("%-6zu %-12s %9.2f ms %12s %12s %12s\n", i, b.name.c_str(), b.time_s * 1e3,
                     format_bytes(double(b.static_bytes)).c_str(), format_bytes(double(b.activation_bytes)).c_str(),
                     format_bytes(double(b.output_bytes)).c_str());
  }
  return out;
}

std::string format_pipeline_plan(const std::vector<PipelineBlockCost>& blocks, const PipelinePlan& plan) {
  std::string out =
      strprintf("%-6s %-28s %-10s %12s %22s\n", "stage", "blocks", "device", "time/micro", "memory / limit");
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const auto& st = plan.stages[s];
    const std::string range = blocks[st.first].name + " .. " + blocks[st.end - 1].name;
    out += strprintf("%-6zu %-28s %-10s %9.2f ms %22s\n", s, range.c_str(), st.device.c_str(), st.time_s * 1e3,
                     (gib(st.memory_bytes) + " / " + gib(st.memory_limit)).c_str());
  }
  out += strprintf("predicted step %.1f ms, bubble %.1f%%", plan.step_s * 1e3, plan.bubble_fraction * 100.0);
  if (plan.replicas > 1) out += strprintf(", %lld replicas of the pipeline", static_cast<long long>(plan.replicas));
  out += "\n";
  return out;
}

}  // namespace tandem
