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

std::string format_pipeline_plan(const std::vector<PipelineBlockCost>& blocks, const PipelinePlan& plan) {
  std::string out =
      strprintf("%-6s %-28s %-10s %12s %22s\n", "stage", "blocks", "device", "time/micro", "memory / limit");
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const auto& st = plan.stages[s];
    const std::string range = blocks[st.first].name + " .. " + blocks[st.end - 1].name;
    out += strprintf("%-6zu %-28s %-10s %9.2f ms %22s\n", s, range.c_str(), st.device.c_str(), st.time_s * 1e3,
                     (gib(st.memory_bytes) + " / " + gib(st.memory_limit)).c_str());
  }
  out += strprintf("predicted step %.1f ms, bubble %.1f%%\n", plan.step_s * 1e3, plan.bubble_fraction * 100.0);
  return out;
}

}  // namespace tandem
