#include "tandem/serve/residency_plan.h"

#include <algorithm>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"

namespace tandem {

int64_t ResidencyPlan::streamed() const {
  return static_cast<int64_t>(std::count(layers.begin(), layers.end(), LayerHome::kHost));
}

std::string ResidencyPlan::describe() const {
  const auto n = static_cast<long long>(layers.size());
  if (streamed() == 0)
    return strprintf("all %lld layers resident (%s of weights on the device)", n,
                     format_bytes(double(device_bytes())).c_str());
  return strprintf(
      "%lld of %lld layers resident, %lld streamed from pinned host memory (%s) through %lld device buffers; "
      "%s of weights on the device",
      static_cast<long long>(resident()), n, static_cast<long long>(streamed()),
      format_bytes(double(host_bytes())).c_str(), static_cast<long long>(slots),
      format_bytes(double(device_bytes())).c_str());
}

int64_t decoder_layer_numel(const ModelSpec& spec) { return spec.params_per_layer(/*padded=*/false); }

int64_t decoder_fixed_numel(const ModelSpec& spec) {
  const int64_t embed = spec.vocab_size * spec.d_model;
  return embed + spec.position_params() + spec.norm_params() + (spec.tie_embeddings ? 0 : embed);
}

ResidencyPlan plan_residency(const ModelSpec& spec, torch::ScalarType dtype, int64_t device_budget_bytes,
                             int64_t prefetch_layers) {
  TANDEM_CHECK(prefetch_layers >= 1, "--prefetch-layers must be at least 1; got ", prefetch_layers);
  const auto elem = static_cast<int64_t>(c10::elementSize(dtype));
  ResidencyPlan plan;
  plan.layer_bytes = decoder_layer_numel(spec) * elem;
  plan.fixed_bytes = decoder_fixed_numel(spec) * elem;
  plan.layers.assign(static_cast<size_t>(spec.n_layer), LayerHome::kDevice);
  if (device_budget_bytes < 0 || plan.device_bytes() <= device_budget_bytes) return plan;

  plan.slots = std::min<int64_t>(prefetch_layers + 1, spec.n_layer);
  const int64_t room = device_budget_bytes - plan.fixed_bytes - plan.slots * plan.layer_bytes;
  TANDEM_CHECK(room >= 0, "the device's weight budget of ", format_bytes(double(device_budget_bytes)),
               " does not hold the embedding and output projection (", format_bytes(double(plan.fixed_bytes)), ") and ",
               plan.slots, " layer buffers for streaming (", format_bytes(double(plan.layer_bytes)),
               " each); raise --gpu-memory-gib, lower --prefetch-layers or --kv-cache-gib, or use --device cpu");
  const int64_t resident = std::min(room / plan.layer_bytes, spec.n_layer - plan.slots);
  for (int64_t i = resident; i < spec.n_layer; ++i) plan.layers[static_cast<size_t>(i)] = LayerHome::kHost;
  return plan;
}

}  // namespace tandem
