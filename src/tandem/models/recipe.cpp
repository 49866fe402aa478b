#include "tandem/models/recipe.h"

#include <cmath>
#include <limits>

#include "tandem/core/error.h"
#include "tandem/models/spec.h"

namespace tandem {
namespace {

constexpr int64_t kM = 1'000'000, kB = 1'000'000'000;
constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

// Note [Training recipes]
// A run's learning rate is chosen by the model's size, from published runs of that size; the other
// AdamW constants are the same in every source used here (betas 0.9/0.95, eps 1e-8, weight decay
// 0.1, cosine decay to 10% of the peak) and the same in every row.
//
// - GPT-3 (Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1 and Appendix B)
//   gives one schedule for every size from 125M to 175B, with the batch (0.5M to 3.2M tokens) and
//   a warmup of 375M tokens. Its rates are the real-data rows from 125M up.
// - Pythia (Biderman et al. 2023; EleutherAI/pythia models/*/pythia-*.yml) agrees at every size
//   both have (160M 6e-4, 410M 3e-4, 1.4B 2e-4, 2.8B 1.6e-4, 6.9B 1.2e-4; 12B 1.2e-4 against
//   GPT-3 13B's 1e-4) and adds 70M at 1e-3, the row below 125M; warmup 1% of 143,000 steps.
// - LLaMA (Touvron et al. 2023, Table 2) trained 7B and 13B at 3e-4 and 33B/65B at 1.5e-4 with
//   4M-token batches, warmup 2000 steps, eps 1e-5. tandem's 7B and 13B presets have LLaMA-2's
//   shapes, but a run on one host has batches of 16k-64k tokens, 60-250x smaller, and the rate that
//   is stable shrinks with the batch: the 7B and 13B rows take GPT-3's (and Pythia's) 1.2e-4 and
//   1e-4, the rates published for 0.5M-2M-token batches. 3e-3 made both diverge (their losses rose).
// A preset or an HF directory gets the row of its parameter count (as an HF checkpoint counts
// them); ResNet-BK and MoE presets too, by their total count. Each row serves the models below its
// max_params, the geometric mean of its size and the next row's.
//
// The generated corpus (data.path=synthetic) is 2 MB of byte-level text with a small grammar; the
// small presets learn it at rates well above a real-data recipe's. The default job (tiny, 300
// steps, 2 CPU cores, about 27 s) keeps the rate and warmup it always had, 3e-3 and 20: loss 5.64
// -> 0.249 (eval 0.248). Measured beside it: 1e-3 (Pythia-70M's, the real-data row of tiny) ends
// at 0.267, 3e-4 (the generic row) at 0.803. That row covers models below 10M parameters on the
// generated corpus only; larger models on it, and every model on real data, take the published
// rows.
//
// The Python package chooses by the nn.Module's own parameter count (resolve_config's
// module_params). A model of unknown size (a Config built by hand) gets the generic row, the built-in defaults: 3e-4,
// the rate LLaMA used at 7B and 13B and GPT-3 and Pythia at 350M-1B. It is within a factor of 2 of the published rate
// for every size from 125M (6e-4) to 2.7B (1.6e-4), and at most 3.3x off from 70M to 13B, where 3e-3 was 5-30x too
// high.
//
// One AdamW run of the table: every source shares cosine decay to 10%, betas 0.9/0.95, eps 1e-8 and
// weight decay 0.1 (above).
RecipeRow adamw_row(const char* name, DataKind data, int64_t params, int64_t max_params, double lr,
                    int64_t published_warmup, const char* source) {
  return {name, data, params, max_params, lr, published_warmup, LrSchedule::kCosine, 0.1, 0.9, 0.95, 1e-8, 0.1, source};
}

const std::vector<RecipeRow>& rows() {
  static const std::vector<RecipeRow> kRows = {
      // The generated corpus, small models: tandem's default job, measured (above).
      adamw_row("tandem default job", DataKind::kSynthetic, 820'352, 10 * kM, 3e-3, 20,
                "measured: tiny on the generated corpus, 300 steps, loss 5.5 -> 0.3"),
      // Real data, smallest first. published_warmup: Pythia 1% of 143,000 steps; GPT-3 375M tokens
      // over the row's batch (0.5M: 750 steps, 1M: 375, 2M: 188, 3.2M: 117).
      adamw_row("Pythia-70M", DataKind::kReal, 70 * kM, 95 * kM, 1e-3, 1430,
                "Pythia (Biderman et al. 2023), pythia-70m.yml"),
      adamw_row("GPT-3 Small", DataKind::kReal, 125 * kM, 210 * kM, 6e-4, 750,
                "GPT-3 (Brown et al. 2020) Table 2.1; Pythia-160M 6e-4"),
      adamw_row("GPT-3 Medium", DataKind::kReal, 350 * kM, 520 * kM, 3e-4, 750,
                "GPT-3 (Brown et al. 2020) Table 2.1; Pythia-410M 3e-4"),
      adamw_row("GPT-3 Large", DataKind::kReal, 760 * kM, 1 * kB, 2.5e-4, 750, "GPT-3 (Brown et al. 2020) Table 2.1"),
      adamw_row("GPT-3 XL", DataKind::kReal, 1300 * kM, 1900 * kM, 2e-4, 375,
                "GPT-3 (Brown et al. 2020) Table 2.1; Pythia-1.4B 2e-4"),
      adamw_row("GPT-3 2.7B", DataKind::kReal, 2700 * kM, 4300 * kM, 1.6e-4, 375,
                "GPT-3 (Brown et al. 2020) Table 2.1; Pythia-2.8B 1.6e-4"),
      adamw_row("GPT-3 6.7B", DataKind::kReal, 6700 * kM, 9300 * kM, 1.2e-4, 188,
                "GPT-3 (Brown et al. 2020) Table 2.1; Pythia-6.9B 1.2e-4; LLaMA-7B 3e-4 at 4M-token batches"),
      adamw_row("GPT-3 13B", DataKind::kReal, 13 * kB, 48 * kB, 1e-4, 188,
                "GPT-3 (Brown et al. 2020) Table 2.1; Pythia-12B 1.2e-4; LLaMA-13B 3e-4 at 4M-token batches"),
      adamw_row("GPT-3 175B", DataKind::kReal, 175 * kB, kNoLimit, 6e-5, 117,
                "GPT-3 (Brown et al. 2020) Table 2.1; LLaMA-33B/65B 1.5e-4 at 4M-token batches"),
  };
  return kRows;
}

const RecipeRow& generic_row() {
  static const RecipeRow kRow =
      adamw_row("generic", DataKind::kReal, 0, kNoLimit, 3e-4, 2000,
                "LLaMA 7B/13B (Touvron et al. 2023) Table 2, warmup 2000; GPT-3 Medium, Pythia-410M/1B 3e-4");
  return kRow;
}

}  // namespace

const std::vector<RecipeRow>& recipe_rows() { return rows(); }

const RecipeRow& recipe_row(int64_t params, DataKind data) {
  TANDEM_ASSERT(params > 0, "a recipe for a model of ", params, " parameters");
  if (data == DataKind::kSynthetic)
    for (const auto& r : rows())
      if (r.data == DataKind::kSynthetic && params < r.max_params) return r;
  for (const auto& r : rows())
    if (r.data == DataKind::kReal && params < r.max_params) return r;
  return rows().back();  // not reached: the last row has no size limit
}

const RecipeRow& generic_recipe_row() { return generic_row(); }

// Note [Recipe warmup]
// The published warmups (750 steps for GPT-3 Small, 1430 for Pythia, 2000 for LLaMA) belong to
// runs of 100k-600k steps, 0.1-1% of them; a run of a few hundred steps would spend all of it
// warming up. A short run warms up over 10% of its steps instead (40 of 400: at 6e-4 the 125M
// preset on real text ends at loss 1.12 where 3e-3 with 20 ends at 1.95), and a long one keeps the
// source's count: warmup = min(published, round(train.steps / 10)). This is the one place the rule
// lives.
int64_t recipe_warmup_steps(const RecipeRow& row, int64_t train_steps) {
  const int64_t tenth = std::llround(0.1 * double(std::max<int64_t>(train_steps, 0)));
  return std::min(row.published_warmup, tenth);
}

const std::vector<std::string>& recipe_keys() {
  static const std::vector<std::string> kKeys = {"optim.lr",           "optim.warmup_steps", "optim.schedule",
                                                 "optim.min_lr_ratio", "optim.beta1",        "optim.beta2",
                                                 "optim.eps",          "optim.weight_decay"};
  return kKeys;
}

void apply_recipe(const RecipeRow& row, int64_t train_steps, OptimConfig& o) {
  o.lr = row.lr;
  o.warmup_steps = recipe_warmup_steps(row, train_steps);
  o.schedule = row.schedule;
  o.min_lr_ratio = row.min_lr_ratio;
  o.beta1 = row.beta1;
  o.beta2 = row.beta2;
  o.eps = row.eps;
  o.weight_decay = row.weight_decay;
}

bool recipe_applies(OptimizerType type) { return type == OptimizerType::kAdamW || type == OptimizerType::kAdam; }

const RecipeRow& preset_recipe_row(const Config& cfg) {
  return recipe_row(resolve_model_spec(cfg.model).num_params_unpadded(), cfg.data.kind());
}

void apply_preset_recipe(Config& cfg) {
  if (recipe_applies(cfg.optim.type)) apply_recipe(preset_recipe_row(cfg), cfg.train.steps, cfg.optim);
}

}  // namespace tandem
