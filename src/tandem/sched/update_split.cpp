#include "tandem/sched/update_split.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tandem/core/error.h"

namespace tandem {

// Note [Update split]
// In offload mode a Block's update runs in one of two places once its backward has finished:
//   CPU-updated: its gradient goes device-to-host on the D2H stream, the CPU updates the fp32
//     master and states in pinned memory, and the new bf16 weights go host-to-device on the H2D
//     stream, recording upload event U_i. D2H, the CPU updater and H2D are each one serial
//     resource, taken in backward order (last Block first).
//   GPU-updated: master and states stay on the GPU (gpu_bytes_per_param_resident bytes per
//     parameter) and a fused AdamW runs on the compute stream right after the Block's backward,
//     serial with the rest of the backward.
// The next forward runs Block 0 first; Block i starts when Block i-1 has finished and, if it is
// CPU-updated, after U_i. predict_step simulates exactly this with four "free at" times (compute,
// D2H, CPU, H2D), visiting every Block once in backward order and once in forward order.
//
// That span is one steady-state period: the forward waits for every upload, the last of which is
// the last use of D2H, CPU and H2D (each is serial and first-in first-out), so the next backward
// starts from the same idle state. Its length is the compute work plus the time the compute stream
// waits on uploads.
//
// Why the GPU set is a prefix (the first g Blocks in forward order): their gradients arrive last,
// when almost no backward is left to hide a D2H + CPU + H2D pipeline behind, and the forward needs
// them first. Moving a Block to the GPU costs its GPU update on the compute stream for certain and
// pays back only exposed waiting, which gathers at the front of the forward; a Block from the back
// of the model moved instead saves less and costs as much. A prefix also reduces the choice to
// one number, k = g / Blocks, which the user can fix and the log can report, and the solver to
// Blocks + 1 candidates.

namespace {

// Predictions this close (relative) differ only by rounding and count as a tie.
constexpr double kTieRelTol = 1e-9;

void check_time(double v, const char* field, size_t block) {
  TANDEM_CHECK(std::isfinite(v) && v >= 0, "update split: block ", block, " has ", field, " = ", v,
               "; block times must be finite and >= 0 seconds");
}

void check_cost(double v, const char* field) {
  TANDEM_CHECK(std::isfinite(v) && v >= 0, "update split: SplitCosts.", field, " = ", v,
               "; a per-parameter cost must be finite and >= 0 seconds");
}

void check_inputs(const std::vector<BlockTiming>& blocks, const SplitCosts& costs) {
  TANDEM_CHECK(!blocks.empty(), "update split: no blocks were given; pass one BlockTiming per Block in forward order");
  for (size_t i = 0; i < blocks.size(); ++i) {
    TANDEM_CHECK(blocks[i].params >= 0, "update split: block ", i, " has params = ", blocks[i].params,
                 "; a parameter count must be >= 0");
    check_time(blocks[i].fwd_s, "fwd_s", i);
    check_time(blocks[i].bwd_s, "bwd_s", i);
  }
  check_cost(costs.cpu_update_s_per_param, "cpu_update_s_per_param");
  check_cost(costs.gpu_update_s_per_param, "gpu_update_s_per_param");
  check_cost(costs.d2h_s_per_param, "d2h_s_per_param");
  check_cost(costs.h2d_s_per_param, "h2d_s_per_param");
  TANDEM_CHECK(costs.gpu_bytes_per_param_resident >= 0,
               "update split: SplitCosts.gpu_bytes_per_param_resident = ", costs.gpu_bytes_per_param_resident,
               "; a byte count must be >= 0");
}

// a + b and a * b for a, b >= 0, saturating at INT64_MAX (which fits no budget).
int64_t saturating_add(int64_t a, int64_t b) {
  return a > std::numeric_limits<int64_t>::max() - b ? std::numeric_limits<int64_t>::max() : a + b;
}
int64_t saturating_mul(int64_t a, int64_t b) {
  return b != 0 && a > std::numeric_limits<int64_t>::max() / b ? std::numeric_limits<int64_t>::max() : a * b;
}

// Note [Update split], on checked inputs.
StepPrediction simulate(const std::vector<BlockTiming>& blocks, const SplitCosts& c, int64_t gpu_blocks) {
  const int64_t n = static_cast<int64_t>(blocks.size());
  std::vector<double> upload_done(blocks.size(), 0.0);  // U_i of CPU-updated Blocks
  std::vector<double> landed(blocks.size(), 0.0);       // D_i: gradient on the host
  StepPrediction p;
  double compute = 0, d2h = 0, cpu = 0, h2d = 0;  // when each serial resource is next free
  for (int64_t i = n - 1; i >= 0; --i) {
    const BlockTiming& b = blocks[i];
    const double params = static_cast<double>(b.params);
    compute += b.bwd_s;
    p.compute_s += b.bwd_s;
    if (i < gpu_blocks) {
      const double update = c.gpu_update_s_per_param * params;
      compute += update;
      p.gpu_update_s += update;
    } else {
      const double update = c.cpu_update_s_per_param * params;
      d2h = std::max(d2h, compute) + c.d2h_s_per_param * params;
      landed[i] = d2h;
      p.cpu_update_s += update;
      if (c.cpu_start != SplitCosts::CpuStart::kAsGradientsArrive) continue;
      cpu = std::max(cpu, d2h) + update;
      h2d = std::max(h2d, cpu) + c.h2d_s_per_param * params;
      upload_done[i] = h2d;
    }
  }
  if (c.cpu_start != SplitCosts::CpuStart::kAsGradientsArrive) {
    // After the backward (the norm is known), in forward order so the forward's first Blocks are
    // ready first.
    cpu = compute;
    double h2d_sum = 0;
    for (int64_t i = gpu_blocks; i < n; ++i) {
      const double params = static_cast<double>(blocks[i].params);
      cpu = std::max(cpu, landed[i]) + c.cpu_update_s_per_param * params;
      h2d = std::max(h2d, cpu) + c.h2d_s_per_param * params;
      h2d_sum += c.h2d_s_per_param * params;
      upload_done[i] = h2d;
    }
    if (c.cpu_start == SplitCosts::CpuStart::kDelayed) {
      // Nobody waits for the uploads: the period is the busiest resource's total.
      double fwd = 0;
      for (const auto& b : blocks) fwd += b.fwd_s;
      const double work = compute + fwd;
      p.compute_s += fwd + p.gpu_update_s;
      p.step_s = std::max({work, d2h, p.cpu_update_s, h2d_sum});
      p.gpu_idle_s = p.step_s - work;
      p.last_upload_s = h2d;
      return p;
    }
  }
  p.last_upload_s = h2d;
  for (int64_t i = 0; i < n; ++i) {
    if (i >= gpu_blocks && upload_done[i] > compute) {
      p.gpu_idle_s += upload_done[i] - compute;
      compute = upload_done[i];
    }
    compute += blocks[i].fwd_s;
    p.compute_s += blocks[i].fwd_s;
  }
  p.compute_s += p.gpu_update_s;
  p.step_s = compute;
  return p;
}

std::string describe_split(int64_t g, int64_t n) {
  if (g == 0) return "every update on the CPU (k = 0)";
  if (g == n) return detail::concat("every update on the GPU (", n, " blocks, k = 1)");
  return detail::concat(g, " of ", n, " blocks updated on the GPU (k = ", static_cast<double>(g) / n, ")");
}

std::string describe_prediction(const StepPrediction& p) {
  return detail::concat("predicted ", p.step_s, " s per step, ", p.gpu_idle_s, " s of it waiting on uploads");
}

}  // namespace

StepPrediction predict_step(const std::vector<BlockTiming>& blocks, const SplitCosts& costs, int64_t gpu_blocks) {
  check_inputs(blocks, costs);
  TANDEM_CHECK(gpu_blocks >= 0 && gpu_blocks <= static_cast<int64_t>(blocks.size()),
               "update split: gpu_blocks = ", gpu_blocks, " is outside [0, ", blocks.size(), "], the number of blocks");
  return simulate(blocks, costs, gpu_blocks);
}

SplitDecision solve_update_split(const std::vector<BlockTiming>& blocks, const SplitCosts& costs,
                                 int64_t gpu_bytes_budget, std::optional<double> fixed_k, int64_t min_gpu_blocks) {
  check_inputs(blocks, costs);
  TANDEM_CHECK(costs.cpu_update_s_per_param > 0,
               "update split: SplitCosts.cpu_update_s_per_param = ", costs.cpu_update_s_per_param,
               "; the CPU update time per parameter must be > 0 (measure it)");
  TANDEM_CHECK(gpu_bytes_budget >= 0, "update split: gpu_bytes_budget = ", gpu_bytes_budget,
               "; the GPU memory left for resident optimizer states must be >= 0 bytes");
  if (fixed_k) {
    TANDEM_CHECK(*fixed_k >= 0 && *fixed_k <= 1, "update split: fixed k = ", *fixed_k,
                 " is outside [0, 1]; k is the fraction of blocks updated on the GPU");
  }
  const int64_t n = static_cast<int64_t>(blocks.size());

  // resident[g]: extra GPU bytes with the first g Blocks GPU-updated; non-decreasing in g.
  std::vector<int64_t> resident(blocks.size() + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    resident[i + 1] = saturating_add(resident[i], saturating_mul(blocks[i].params, costs.gpu_bytes_per_param_resident));
  }
  int64_t max_fit = 0;
  while (max_fit < n && resident[max_fit + 1] <= gpu_bytes_budget) ++max_fit;

  SplitDecision d;
  d.alpha = costs.gpu_update_s_per_param / costs.cpu_update_s_per_param;
  std::vector<StepPrediction> fitting;
  for (int64_t g = 0; g <= max_fit; ++g) {
    fitting.push_back(simulate(blocks, costs, g));
    d.predicted_by_gpu_blocks.push_back(fitting.back().step_s);
  }

  if (fixed_k) {
    const int64_t asked = std::llround(*fixed_k * static_cast<double>(n));
    d.gpu_blocks = std::min(asked, max_fit);
    const StepPrediction& p = fitting[d.gpu_blocks];
    if (d.gpu_blocks < asked) {
      d.reason =
          detail::concat("fixed k = ", *fixed_k, " asks for ", asked, " of ", n, " blocks on the GPU, clamped to ",
                         d.gpu_blocks, " by the GPU budget of ", gpu_bytes_budget, " bytes (", asked, " blocks need ",
                         resident[asked], " bytes): ", describe_prediction(p));
    } else {
      d.reason =
          detail::concat("fixed k = ", *fixed_k, ": ", describe_split(d.gpu_blocks, n), ", ", describe_prediction(p));
    }
  } else {
    int64_t best = 0;
    for (int64_t g = 1; g <= max_fit; ++g) {
      if (d.predicted_by_gpu_blocks[g] < d.predicted_by_gpu_blocks[best] * (1 - kTieRelTol)) best = g;
    }
    d.gpu_blocks = best;
    d.reason = detail::concat("auto: ", describe_split(best, n), ", the fastest of the ", max_fit + 1,
                              " splits that fit the GPU budget: ", describe_prediction(fitting[best]));
    if (best > 0) d.reason += detail::concat(" (all on the CPU: ", fitting[0].step_s, " s)");
    // Would a split the budget excludes be faster? Then memory, not time, decided.
    int64_t unconstrained = best;
    double unconstrained_s = fitting[best].step_s;
    for (int64_t g = max_fit + 1; g <= n; ++g) {
      const double s = simulate(blocks, costs, g).step_s;
      if (s < unconstrained_s * (1 - kTieRelTol)) {
        unconstrained = g;
        unconstrained_s = s;
      }
    }
    if (unconstrained != best) {
      d.reason += detail::concat("; the GPU budget of ", gpu_bytes_budget, " bytes binds: ", unconstrained,
                                 " GPU blocks would predict ", unconstrained_s, " s but need ", resident[unconstrained],
                                 " bytes");
    }
  }
  const int64_t floor = std::clamp<int64_t>(min_gpu_blocks, 0, max_fit);
  if (d.gpu_blocks < floor) {
    // The fastest split at or above the floor.
    int64_t best = floor;
    for (int64_t g = floor + 1; g <= max_fit && !fixed_k; ++g)
      if (d.predicted_by_gpu_blocks[g] < d.predicted_by_gpu_blocks[best] * (1 - kTieRelTol)) best = g;
    d.reason += detail::concat("; raised to ", best, " GPU blocks by the floor of ", min_gpu_blocks);
    d.gpu_blocks = best;
  }
  d.k = static_cast<double>(d.gpu_blocks) / static_cast<double>(n);
  d.predicted_step_s = d.predicted_by_gpu_blocks[d.gpu_blocks];
  d.gpu_resident_bytes = resident[d.gpu_blocks];
  return d;
}

}  // namespace tandem
