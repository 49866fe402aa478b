#include "tandem/models/model.h"

#include <unordered_set>

#include "tandem/core/error.h"
#include "tandem/models/checkpointing.h"
#include "tandem/models/llama.h"
#include "tandem/models/resnet_bk.h"

namespace tandem {

Model::Model(const ModelSpec& spec, bool checkpointing) : spec_(spec), checkpointing_(checkpointing) {
  validate_spec(spec_);
  TANDEM_CHECK(!(checkpointing && spec_.arch == Arch::kResNetBk),
               "model.checkpointing is not supported for ResNet-BK models yet (its load-balance loss is taken in the "
               "forward pass); set model.checkpointing=false");
  auto embed = std::make_shared<EmbeddingBlock>(spec_);
  blocks_.push_back(register_module("embed", embed));
  auto rope = spec_.arch == Arch::kLlama ? std::make_shared<RopeTable>(spec_) : nullptr;
  for (int64_t i = 0; i < spec_.n_layer; ++i) {
    std::shared_ptr<Block> layer;
    if (spec_.arch == Arch::kLlama)
      layer = std::make_shared<LlamaLayer>(spec_, i, rope);
    else if (spec_.arch == Arch::kResNetBk)
      layer = std::make_shared<ResNetBkLayer>(spec_, i);
    else
      layer = std::make_shared<MlpLayer>(spec_, i);
    blocks_.push_back(register_module("layer" + std::to_string(i), layer));
  }
  auto head = std::make_shared<HeadBlock>(spec_, spec_.tie_embeddings ? embed->embed_tokens->weight : torch::Tensor());
  blocks_.push_back(register_module("head", head));
}

torch::Tensor Model::forward(const torch::Tensor& tokens) {
  const bool recompute = checkpointing_ && is_training() && torch::GradMode::is_enabled();
  torch::Tensor x = tokens;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    auto& block = blocks_[i];
    if (before_block_) before_block_(i);
    if (recompute && block->kind() == BlockKind::kLayer)
      x = checkpointed_forward(*block, x);
    else
      x = block->forward(x);
  }
  return x;
}

torch::Tensor Model::loss(const torch::Tensor& logits, const torch::Tensor& targets) const {
  auto l = logits;
  if (spec_.padded_vocab() != spec_.vocab_size) l = l.narrow(-1, 0, spec_.vocab_size);
  auto ce = torch::nn::functional::cross_entropy(l.reshape({-1, spec_.vocab_size}).to(torch::kFloat32),
                                                 targets.reshape({-1}));
  if (spec_.arch == Arch::kResNetBk && spec_.moe_aux_weight > 0) {
    // The load-balance losses of the forward pass that produced these logits, averaged over layers.
    torch::Tensor aux;
    for (const auto& b : blocks_)
      if (const auto* layer = dynamic_cast<const ResNetBkLayer*>(b.get()))
        aux = aux.defined() ? aux + layer->aux_loss() : layer->aux_loss();
    if (aux.defined()) ce = ce + spec_.moe_aux_weight * aux / double(spec_.n_layer);
  }
  return ce;
}

std::vector<NamedTensor> Model::hf_parameters() {
  std::vector<NamedTensor> out;
  for (auto& b : blocks_)
    for (auto& nt : b->hf_parameters()) out.push_back(std::move(nt));
  return out;
}

std::vector<int64_t> Model::hf_shape(const std::string& name, const torch::Tensor& param) const {
  auto shape = param.sizes().vec();
  const auto ends_with = [&](const char* suffix) {
    const std::string s(suffix);
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") shape[0] = spec_.vocab_size;
  if (spec_.padded_d_ff() != spec_.d_ff) {  // Note [Zero padding keeps the function]
    if (ends_with("mlp.gate_proj.weight") || ends_with("mlp.up_proj.weight")) shape[0] = spec_.d_ff;
    if (ends_with("mlp.down_proj.weight")) shape[1] = spec_.d_ff;
  }
  return shape;
}

std::vector<NamedTensor> Model::hf_state_dict() {
  std::vector<NamedTensor> out;
  for (auto& [name, p] : hf_parameters()) {
    const auto shape = hf_shape(name, p);
    auto t = p.detach();
    for (size_t d = 0; d < shape.size(); ++d)
      if (shape[d] != t.size(d)) t = t.narrow(d, 0, shape[d]);
    out.emplace_back(name, t);
  }
  return out;
}

void Model::load_hf_state_dict(const std::function<std::optional<torch::Tensor>(const std::string&)>& lookup,
                               const std::string& source) {
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : hf_parameters()) {
    const auto expected = hf_shape(name, p);
    auto t = lookup(name);
    TANDEM_CHECK(t.has_value(), source, ": tensor '", name,
                 "' is missing; the checkpoint does not match this architecture (check model.* settings)");
    TANDEM_CHECK(t->sizes().vec() == expected, source, ": tensor '", name, "' has shape ", t->sizes(),
                 " but the model expects ", c10::IntArrayRef(expected),
                 "; the checkpoint was made for a different architecture (check model.* settings)");
    TANDEM_CHECK(t->is_floating_point(), source, ": tensor '", name, "' has dtype ", t->scalar_type(),
                 "; expected a floating-point tensor");
    const bool vocab = name == "model.embed_tokens.weight" || name == "lm_head.weight";
    if (!vocab && expected != p.sizes().vec()) p.zero_();  // feed-forward padding stays zero
    auto dst = p;
    for (size_t d = 0; d < expected.size(); ++d)
      if (expected[d] != dst.size(d)) dst = dst.narrow(d, 0, expected[d]);
    dst.copy_(*t);
  }
}

std::shared_ptr<Model> build_model(const ModelSpec& spec, bool checkpointing) {
  return std::make_shared<Model>(spec, checkpointing);
}

}  // namespace tandem
