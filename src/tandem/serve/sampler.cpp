#include "tandem/serve/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "tandem/core/error.h"

namespace tandem {

void check_sampling_params(const SamplingParams& p) {
  TANDEM_CHECK(std::isfinite(p.temperature) && p.temperature >= 0, "temperature must be >= 0 (0 = greedy); got ",
               p.temperature);
  TANDEM_CHECK(p.top_k >= 0, "top_k must be >= 0 (0 = no limit); got ", p.top_k);
  TANDEM_CHECK(p.top_p > 0 && p.top_p <= 1, "top_p must be in (0, 1]; got ", p.top_p);
  TANDEM_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0,
               "repetition_penalty must be > 0 (1 = none); got ", p.repetition_penalty);
}

namespace {

// HF's repetition penalty on every row at once: the logits of the row's context tokens divided by
// the penalty where positive, multiplied where negative. Rows without a penalty are left alone.
void apply_penalty(torch::Tensor& z, const std::vector<SamplingRow>& rows) {
  std::vector<std::vector<int64_t>> ids(rows.size());
  size_t widest = 0;
  bool any = false;
  for (size_t b = 0; b < rows.size(); ++b) {
    if (rows[b].params->repetition_penalty == 1.0 || rows[b].context == nullptr || rows[b].context->empty()) continue;
    ids[b].assign(rows[b].context->begin(), rows[b].context->end());
    std::sort(ids[b].begin(), ids[b].end());
    ids[b].erase(std::unique(ids[b].begin(), ids[b].end()), ids[b].end());
    ids[b].erase(std::remove_if(ids[b].begin(), ids[b].end(), [&](int64_t t) { return t < 0 || t >= z.size(1); }),
                 ids[b].end());
    widest = std::max(widest, ids[b].size());
    any = true;
  }
  if (!any || widest == 0) return;
  std::vector<int64_t> index;
  std::vector<float> penalty;
  for (size_t b = 0; b < rows.size(); ++b) {
    for (size_t j = 0; j < widest; ++j) index.push_back(ids[b].empty() ? 0 : ids[b][std::min(j, ids[b].size() - 1)]);
    penalty.push_back(ids[b].empty() ? 1.0f : static_cast<float>(rows[b].params->repetition_penalty));
  }
  const auto B = static_cast<int64_t>(rows.size());
  const auto idx = torch::tensor(index, torch::kInt64).view({B, static_cast<int64_t>(widest)}).to(z.device());
  const auto p = torch::tensor(penalty, torch::kFloat32).view({B, 1}).to(z.device());
  const auto g = z.gather(1, idx);  // duplicates (padding) write the same value back
  z.scatter_(1, idx, torch::where(g > 0, g / p, g * p));
}

// The sampled rows (temperature > 0) of z: top-k, top-p and the inverse-CDF draw.
torch::Tensor sample_rows(const torch::Tensor& z, const std::vector<SamplingRow>& rows,
                          const std::vector<int64_t>& which) {
  const auto dev = z.device();
  const int64_t V = z.size(1), n = static_cast<int64_t>(which.size());
  std::vector<float> temperature, top_p;
  std::vector<int64_t> kth;
  std::vector<double> uniform;
  bool nucleus = false;
  for (const int64_t b : which) {
    const auto& p = *rows[static_cast<size_t>(b)].params;
    temperature.push_back(static_cast<float>(p.temperature));
    kth.push_back((p.top_k > 0 ? std::min(p.top_k, V) : V) - 1);
    top_p.push_back(static_cast<float>(p.top_p));
    nucleus = nucleus || p.top_p < 1.0;
    uniform.push_back(rows[static_cast<size_t>(b)].uniform);
  }
  const auto rows_index = torch::tensor(which, torch::kInt64).to(dev);
  auto zs = z.index_select(0, rows_index) / torch::tensor(temperature).view({n, 1}).to(dev);  // (n, V)
  auto [sorted, order] = zs.sort(/*stable=*/true, /*dim=*/1, /*descending=*/true);
  // top-k by value: ties with the k-th are kept.
  const auto threshold = sorted.gather(1, torch::tensor(kth, torch::kInt64).view({n, 1}).to(dev));
  sorted = sorted.masked_fill(sorted < threshold, -std::numeric_limits<float>::infinity());
  auto probs = torch::softmax(sorted, 1);
  if (nucleus) {  // keep a token while the mass before it is below top_p (the first always)
    const auto before = probs.cumsum(1) - probs;
    probs = probs * (before < torch::tensor(top_p).view({n, 1}).to(dev)).to(probs.scalar_type());
  }
  const auto cdf = probs.to(torch::kFloat64).cumsum(1);  // (n, V)
  const auto target = torch::tensor(uniform, torch::kFloat64).view({n, 1}).to(dev) * cdf.narrow(1, V - 1, 1);
  const auto pos = torch::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true).clamp_max(V - 1);
  return order.gather(1, pos).view({n});
}

}  // namespace

std::vector<TokenId> sample_tokens(const torch::Tensor& logits, const std::vector<SamplingRow>& rows) {
  TANDEM_ASSERT(logits.dim() == 2 && logits.size(0) == static_cast<int64_t>(rows.size()), "logits ", logits.sizes(),
                " for ", rows.size(), " rows");
  const c10::InferenceMode inference;
  auto z = logits.to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);  // (B, V)
  apply_penalty(z, rows);
  auto chosen = z.argmax(1);  // (B) int64: greedy
  std::vector<int64_t> sampled;
  for (size_t b = 0; b < rows.size(); ++b)
    if (rows[b].params->temperature > 0) sampled.push_back(static_cast<int64_t>(b));
  if (!sampled.empty())
    chosen.index_put_({torch::tensor(sampled, torch::kInt64).to(z.device())}, sample_rows(z, rows, sampled));
  const auto host = chosen.to(torch::kCPU);
  const auto* p = host.data_ptr<int64_t>();
  return std::vector<TokenId>(p, p + host.numel());
}

TokenId sample_token_reference(const std::vector<float>& logits, const SamplingParams& params,
                               const std::vector<TokenId>& context, double uniform) {
  const auto V = static_cast<int64_t>(logits.size());
  std::vector<double> z(logits.begin(), logits.end());
  if (params.repetition_penalty != 1.0) {
    std::vector<bool> seen(z.size(), false);
    for (const TokenId t : context)
      if (t >= 0 && t < V && !seen[static_cast<size_t>(t)]) {
        seen[static_cast<size_t>(t)] = true;
        double& v = z[static_cast<size_t>(t)];
        v = v > 0 ? v / params.repetition_penalty : v * params.repetition_penalty;
      }
  }
  if (params.temperature == 0) return static_cast<TokenId>(std::max_element(z.begin(), z.end()) - z.begin());
  std::vector<int64_t> order(z.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return z[a] > z[b]; });
  const int64_t k = params.top_k > 0 ? std::min(params.top_k, V) : V;
  const double threshold = z[static_cast<size_t>(order[static_cast<size_t>(k - 1)])];
  std::vector<double> w(z.size(), 0.0);  // weights in sorted order
  const double top = z[static_cast<size_t>(order[0])];
  double mass = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const double v = z[static_cast<size_t>(order[i])];
    if (v < threshold) break;
    w[i] = std::exp((v - top) / params.temperature);
    mass += w[i];
  }
  if (params.top_p < 1.0) {
    double before = 0;
    for (double& x : w) {
      const double p = x / mass;
      if (before >= params.top_p) x = 0;
      before += p;
    }
  }
  double total = 0;
  for (const double x : w) total += x;
  double cum = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    cum += w[i];
    if (cum > uniform * total) return static_cast<TokenId>(order[i]);
  }
  return static_cast<TokenId>(order.back());
}

}  // namespace tandem
