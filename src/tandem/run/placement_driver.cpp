#include "tandem/run/placement_driver.h"

#include <algorithm>
#include <map>
#include <typeinfo>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"
#include "tandem/engine/offload_engine.h"
#include "tandem/models/block_sequence.h"
#include "tandem/monitor/sampler.h"

namespace tandem {
std::vector<bool> placement_movable(const PlacementConfig& cfg, const BlockSequence& model) {
  const size_t count = model.block_count();
  std::vector<bool> out(count, false);
  if (cfg.policy == PlacementPolicyKind::kOff || cfg.movable.kind == MovableBlocks::Kind::kNone) return out;
  if (cfg.movable.kind == MovableBlocks::Kind::kLayers) {
    for (size_t i = 0; i < count; ++i) out[i] = model.block_kind(i) == BlockKind::kLayer;
    return out;
  }
  for (const int64_t i : cfg.movable.blocks) {
    TANDEM_CHECK(i < static_cast<int64_t>(count), "placement.movable: ", i, " is not a block index in 0 .. ",
                 count - 1, " (0 = embedding; decoder layers are 1 .. ", count - 2, ")");
    TANDEM_CHECK(model.block_kind(static_cast<size_t>(i)) == BlockKind::kLayer, "placement.movable: block ", i, " (",
                 model.block_name(static_cast<size_t>(i)),
                 ") is not a decoder layer; only decoder layers move to the CPU");
    out[static_cast<size_t>(i)] = true;
  }
  return out;
}

PlacementDriver::PlacementDriver(const PlacementConfig& cfg, BlockSequence& model, OffloadEngine& engine,
                                 std::function<void(const std::string&)> log)
    : cfg_(cfg), model_(model), engine_(engine), log_(std::move(log)), movable_(placement_movable(cfg, model)) {
  const size_t count = model.block_count();
  const auto n = static_cast<int64_t>(count);
  current_.blocks.assign(count, BlockDevice::kGpu);
  // Movable Blocks, the cheapest first: the threshold rule moves them in this order.
  std::vector<int64_t> order;
  for (int64_t i = 0; i < n; ++i)
    if (movable_[static_cast<size_t>(i)]) order.push_back(i);
  const auto numel = [&](int64_t i) {
    int64_t k = 0;
    for (const auto& [name, p] : model.block_parameters(static_cast<size_t>(i))) k += p.numel();
    return k;
  };
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return numel(a) < numel(b); });
  if (cfg.policy == PlacementPolicyKind::kStatic) {
    Placement p = placement_of(StaticBlocks{}, n);
    if (cfg.blocks.kind == StaticBlocks::Kind::kCpu) {  // every movable Block, not every Block
      for (const int64_t i : order) p.blocks[static_cast<size_t>(i)] = BlockDevice::kCpu;
    } else if (cfg.blocks.kind == StaticBlocks::Kind::kLetters) {
      try {
        p = placement_of(cfg.blocks, n);
      } catch (const UserError& e) {
        TANDEM_FAIL("placement.blocks: ", e.what());
      }
      for (int64_t i = 0; i < n; ++i)
        TANDEM_CHECK(p.blocks[static_cast<size_t>(i)] == BlockDevice::kGpu || movable_[static_cast<size_t>(i)],
                     "placement.blocks puts block ", i, " (", model.block_name(static_cast<size_t>(i)),
                     ") on the CPU, but it is not movable: only decoder layers listed in placement.movable (all "
                     "of them when it is empty) run on the CPU");
    }
    policy_ = std::make_unique<StaticPlacement>(p);
  } else if (cfg.policy == PlacementPolicyKind::kThreshold) {
    ThresholdOptions o;
    o.gpu_power_w = cfg.threshold_w;
    o.cpu_util_pct = cfg.threshold_cpu_pct;
    o.release_w = cfg.release_w;
    o.dwell_steps = cfg.dwell_steps;
    o.movable = order;
    policy_ = std::make_unique<ThresholdPlacement>(n, o);
  } else if (cfg.policy == PlacementPolicyKind::kCost) {
    cost_options_.objective = cfg.objective == PlacementObjective::kEnergy
                                  ? CostModelOptions::Objective::kMinEnergy
                                  : CostModelOptions::Objective::kMaxThroughput;
    cost_options_.gpu_power_budget_w = cfg.gpu_power_budget_w;
    cost_options_.max_step_s = cfg.max_step_s;
    // Signatures: Blocks of one kind and size cost the same; one of each is profiled on the CPU.
    std::map<std::pair<int, int64_t>, int64_t> groups;
    std::vector<int64_t> sig(count, -1);
    for (int64_t i = 0; i < n; ++i) {
      if (!movable_[static_cast<size_t>(i)]) continue;
      const auto key = std::make_pair(static_cast<int>(model.block_kind(static_cast<size_t>(i))), numel(i));
      sig[static_cast<size_t>(i)] = groups.emplace(key, static_cast<int64_t>(groups.size())).first->second;
    }
    // Warm-up past the update split's first solve (step 3), whose step is slow.
    profiler_ = std::make_unique<PlacementProfiler>(sig, /*warmup=*/4, cfg.profile_steps);
  } else {
    TANDEM_FAIL("placement.policy must be static, threshold or cost here; got '", to_string(cfg.policy), "'");
  }
}

PlacementDriver::~PlacementDriver() = default;

void PlacementDriver::before_step(int64_t step, const TelemetrySample* latest) {
  inputs_ = PlacementInputs{};
  inputs_.step = step;
  if (latest != nullptr) {
    double w = 0;
    bool any = false;
    for (const auto& g : latest->gpus)
      if (g.power_w) w += *g.power_w, any = true;
    if (any) inputs_.gpu_power_w = w;
    inputs_.cpu_util_pct = latest->host.cpu_pct;
  }
  Placement next;
  if (profiler_ && !profiler_->done()) {
    next = *profiler_->next();
    phase_ = profiler_->describe();
  } else {
    next = policy_->decide(inputs_);
    phase_ = policy_->name();
  }
  if (next.blocks != current_.blocks) {
    ++moves_;
    std::string why;
    if (inputs_.gpu_power_w) why += strprintf("; GPU %.0f W", *inputs_.gpu_power_w);
    if (inputs_.cpu_util_pct) why += strprintf(", CPU %.0f%%", *inputs_.cpu_util_pct);
    if (log_)
      log_(strprintf("placement at step %lld: %s (%s%s)", static_cast<long long>(step), next.str().c_str(),
                     phase_.c_str(), why.c_str()));
  }
  current_ = next;
  std::vector<bool> host(current_.blocks.size());
  for (size_t i = 0; i < host.size(); ++i) host[i] = current_.blocks[i] == BlockDevice::kCpu;
  engine_.set_placement(host);
}

void PlacementDriver::after_step(double step_s, std::optional<double> gpu_j, std::optional<double> cpu_j,
                                 nlohmann::json& row) {
  row["placement"] = current_.str();
  row["placement_policy"] = phase_;
  row["placement_cpu_blocks"] = current_.cpu_blocks();
  row["placement_pace_s"] = current_.pace_s;
  if (inputs_.gpu_power_w) row["placement_in_gpu_power_w"] = *inputs_.gpu_power_w;
  if (inputs_.cpu_util_pct) row["placement_in_cpu_util_pct"] = *inputs_.cpu_util_pct;
  if (gpu_j && step_s > 0) row["placement_gpu_power_w"] = *gpu_j / step_s;  // this step's average
  const EngineStats es = engine_.stats();
  row["placement_mirror_refreshes"] = es.mirror_refreshes;
  row["placement_max_mirror_lag"] = es.max_mirror_lag;
  if (cost_ != nullptr) {
    const auto& pr = cost_->prediction();
    row["placement_pred_step_s"] = pr.step_s;
    row["placement_pred_gpu_power_w"] = pr.gpu_power_w;
    if (cfg_.gpu_power_budget_w > 0) row["placement_budget_w"] = cfg_.gpu_power_budget_w;
  }
  if (profiler_ && !profiler_->done()) {
    profiler_->record(engine_.block_seconds(), step_s, gpu_j, cpu_j);
    if (profiler_->done()) {
      costs_ = profiler_->costs(cost_options_);
      auto policy = std::make_unique<CostModelPlacement>(static_cast<int64_t>(costs_.size()), cost_options_);
      policy->set_costs(costs_);
      cost_ = policy.get();
      policy_ = std::move(policy);
      const auto& pr = cost_->prediction();
      const Placement chosen = cost_->decide(inputs_);
      std::string per_block;
      for (size_t i = 0; i < costs_.size(); ++i)
        if (costs_[i].movable)
          per_block += strprintf(" %s GPU %.1f ms / CPU %.1f ms;", model_.block_name(i).c_str(), costs_[i].gpu_s * 1e3,
                                 costs_[i].cpu_s * 1e3);
      if (log_)
        log_(
            strprintf("placement cost model: GPU idle %.0f W;%s chose %s with %.3f s pacing, predicted %.1f ms per "
                      "step at %.0f W",
                      cost_options_.gpu_idle_w, per_block.c_str(), chosen.str().c_str(), chosen.pace_s, pr.step_s * 1e3,
                      pr.gpu_power_w));
    }
    return;
  }
  // The closed loop on the budget: every 5 steps, from their summed GPU energy and time.
  if (cost_ != nullptr && gpu_j) {
    window_j_ += *gpu_j;
    window_s_ += step_s;
    if (++window_steps_ >= 5) {
      cost_->observe(window_j_ / window_s_, window_s_ / double(window_steps_));
      window_j_ = window_s_ = 0;
      window_steps_ = 0;
    }
  }
}

nlohmann::json PlacementDriver::summary() const {
  nlohmann::json j = {
      {"policy", to_string(cfg_.policy)}, {"moves", moves_}, {"final", current_.str()}, {"pace_s", current_.pace_s}};
  const EngineStats es = engine_.stats();
  j["mirror_every"] = cfg_.mirror_every;
  j["mirror_refreshes"] = es.mirror_refreshes;
  j["max_mirror_lag"] = es.max_mirror_lag;
  if (!costs_.empty()) {
    nlohmann::json blocks = nlohmann::json::array();
    for (size_t i = 0; i < costs_.size(); ++i)
      blocks.push_back({{"block", model_.block_name(i)},
                        {"movable", costs_[i].movable},
                        {"gpu_s", costs_[i].gpu_s},
                        {"cpu_s", costs_[i].cpu_s},
                        {"gpu_j", costs_[i].gpu_j},
                        {"cpu_j", costs_[i].cpu_j}});
    j["costs"] = blocks;
    j["gpu_idle_w"] = cost_options_.gpu_idle_w;
    if (cost_ != nullptr) {
      j["predicted_step_s"] = cost_->prediction().step_s;
      j["predicted_gpu_power_w"] = cost_->prediction().gpu_power_w;
    }
  }
  if (cfg_.gpu_power_budget_w > 0) j["gpu_power_budget_w"] = cfg_.gpu_power_budget_w;
  return j;
}

}  // namespace tandem
