#pragma once
// Shared by the serve tests: a small random Llama (tandem's own Model) and a generation decoder over
// the same weights.

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>

#include "tandem/models/model.h"
#include "tandem/serve/decoder.h"
#include "tandem/serve/decoder_weights.h"
#include "tandem/serve/residency_plan.h"

namespace tandem::test {

#define REQUIRE_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

/// 4 layers, grouped-query attention, a feed-forward of 40 (stored padded to 64), an untied head.
inline ModelSpec small_llama_spec(int64_t vocab = 61) {
  ModelSpec s = preset_spec("tiny");
  s.n_layer = 4, s.d_model = 32, s.n_head = 4, s.n_kv_head = 2, s.d_ff = 40;
  s.vocab_size = vocab, s.max_seq_len = 96, s.tie_embeddings = false;
  return s;
}

/// A Model with random weights, its matrices scaled up so that attention and the logits are far
/// from uniform (a test that cannot tell positions apart cannot fail).
inline std::shared_ptr<Model> random_llama(const ModelSpec& spec, uint64_t seed) {
  torch::manual_seed(seed);
  auto m = build_model(spec, false);
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : m->hf_parameters())
    if (p.dim() == 2) p.mul_(6.0);
  m->eval();
  return m;
}

/// The model's HF-named weights as a lookup (copies, so the model may go).
inline TensorLookup lookup_of(Model& model) {
  auto state = std::make_shared<std::map<std::string, torch::Tensor>>();
  for (auto& [name, t] : model.hf_state_dict()) (*state)[name] = t.clone();
  return [state](const std::string& name) -> std::optional<torch::Tensor> {
    const auto it = state->find(name);
    if (it == state->end()) return std::nullopt;
    return it->second;
  };
}

/// A decoder over `model`'s weights on `device`, every layer resident (budget < 0) or streamed
/// through `prefetch` + 1 slots as `budget` bytes allow.
inline std::unique_ptr<Decoder> decoder_of(Model& model, torch::ScalarType dtype = torch::kFloat32, int64_t budget = -1,
                                           int64_t prefetch = 1, c10::Device device = c10::kCPU) {
  WeightPlacement p;
  p.device = device;
  p.dtype = dtype;
  p.plan = plan_residency(model.spec(), dtype, budget, prefetch);
  return std::make_unique<Decoder>(std::make_shared<DecoderWeights>(model.spec(), p, lookup_of(model), "test"));
}

}  // namespace tandem::test
