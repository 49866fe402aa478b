#include "tandem/models/model.h"

#include <ATen/autocast_mode.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <unordered_set>

#include "tandem/core/error.h"
#include "tandem/models/amx_moe.h"
#include "tandem/models/checkpointing.h"
#include "tandem/models/decoder.h"
#include "tandem/models/family.h"
#include "tandem/models/init.h"
#include "tandem/models/mlp_layer.h"
#include "tandem/models/resnet_bk.h"

namespace tandem {

// Note [Stage build]
// Every rank builds the whole model (Note [Pipeline checkpoints]), but a pipeline stage fills only
// its own Blocks when the cut is known before the build (dist.pipeline_cut): the others draw their
// initial weights' seeds (Note [Parallel initialisation]), so the stage's weights are a one-process
// build's, and leave their memory unwritten, which the kernel does not back until it is written
// (rank 0's checkpoint gather writes it then). Without this, each of two stages of a 30B model
// would hold its 120 GB fp32 build on the host at once.
Model::Model(const ModelSpec& spec, bool checkpointing, std::pair<size_t, size_t> fill)
    : spec_(spec), checkpointing_(checkpointing) {
  validate_spec(spec_);
  TANDEM_CHECK(!(checkpointing && spec_.arch == Arch::kResNetBk),
               "model.checkpointing is not supported for ResNet-BK models yet (its load-balance loss is taken in the "
               "forward pass); set model.checkpointing=false");
  const auto outside = [&](size_t block) { return block < fill.first || block >= fill.second; };
  std::shared_ptr<EmbeddingBlock> embed;
  {
    const SkipInitialFill skip(outside(0));
    embed = std::make_shared<EmbeddingBlock>(spec_);
  }
  blocks_.push_back(register_module("embed", embed));
  const bool decoder = spec_.arch == Arch::kDecoder;
  auto rope = decoder && !spec_.parts.learned_positions ? std::make_shared<RopeTable>(spec_) : nullptr;
  for (int64_t i = 0; i < spec_.n_layer; ++i) {
    const SkipInitialFill skip(outside(static_cast<size_t>(i) + 1));
    std::shared_ptr<Block> layer;
    if (decoder)
      layer = std::make_shared<DecoderLayer>(spec_, i, rope);
    else if (spec_.arch == Arch::kResNetBk)
      layer = std::make_shared<ResNetBkLayer>(spec_, i);
    else if (spec_.arch == Arch::kAmxMoe && i >= spec_.n_dense)
      layer = std::make_shared<MoeFfnLayer>(spec_, i);
    else
      layer = std::make_shared<MlpLayer>(spec_, i);
    blocks_.push_back(register_module("layer" + std::to_string(i), layer));
  }
  const SkipInitialFill skip(outside(static_cast<size_t>(spec_.n_layer) + 1));
  auto head = std::make_shared<HeadBlock>(spec_, spec_.tie_embeddings ? embed->embed_tokens->weight : torch::Tensor());
  blocks_.push_back(register_module("head", head));
  const auto& names = family_names(spec_.family);
  vocab_names_ = {names.base + names.embed + ".weight", "lm_head.weight"};
}

namespace {

torch::Tensor copy_across(const torch::Tensor& x, c10::Device to) {
  if (x.device() == to) return x;
  if (to.is_cpu()) {
    auto out = torch::empty(x.sizes(), x.options().device(torch::kCPU).pinned_memory(true));
    out.copy_(x, /*non_blocking=*/true);
    c10::impl::VirtualGuardImpl impl(x.device().type());
    c10::Event done(x.device().type());
    done.record(impl.getStream(x.device()));
    done.synchronize();  // the CPU computes with it next
    return out;
  }
  // The caching host allocator keeps the pinned block until the copy has read it.
  const auto src = x.is_pinned() ? x : x.pin_memory();
  return src.to(to, /*non_blocking=*/true);
}

// The CPU's autocast set as the device's for one host-run Block; restored on exit.
class HostAutocast {
 public:
  HostAutocast(bool on, c10::DeviceType device)
      : on_(on), was_(at::autocast::is_autocast_enabled(at::kCPU)), dtype_(at::autocast::get_autocast_dtype(at::kCPU)) {
    if (!on_) return;
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::autocast::get_autocast_dtype(device));
  }
  ~HostAutocast() {
    if (!on_) return;
    at::autocast::set_autocast_enabled(at::kCPU, was_);
    at::autocast::set_autocast_dtype(at::kCPU, dtype_);
  }
  HostAutocast(const HostAutocast&) = delete;
  HostAutocast& operator=(const HostAutocast&) = delete;

 private:
  bool on_, was_;
  at::ScalarType dtype_;
};

struct CrossDevice : torch::autograd::Function<CrossDevice> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, c10::Device to) {
    ctx->saved_data["from"] = x.device();
    return copy_across(x, to);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    return {copy_across(grad[0], ctx->saved_data["from"].toDevice()), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor cross_device(const torch::Tensor& x, c10::Device device) {
  if (x.device() == device) return x;
  return CrossDevice::apply(x, device);
}

torch::Tensor Model::forward(const torch::Tensor& tokens) { return forward_blocks(tokens, 0, blocks_.size()); }

torch::Tensor Model::forward_blocks(const torch::Tensor& input, size_t first, size_t end) {
  TANDEM_ASSERT(first < end && end <= blocks_.size(), "Blocks [", first, ", ", end, ") of ", blocks_.size());
  const bool training = is_training() && torch::GradMode::is_enabled();
  const bool recompute = checkpointing_ && training;
  torch::Tensor x = input;
  for (size_t i = first; i < end; ++i) {
    auto& block = blocks_[i];
    if (before_block_) before_block_(i);
    const bool host = i < host_blocks_.size() && host_blocks_[i];
    const c10::Device home = x.device();
    if (host) x = cross_device(x, torch::kCPU);
    // A host-run Block computes under the device's autocast, moved to the CPU (its weights are
    // bf16 host copies; activations may arrive in fp32 from the device's norms).
    const HostAutocast cast(host && !home.is_cpu() && at::autocast::is_autocast_enabled(home.type()), home.type());
    const bool offload = training && i < offloaded_blocks_.size() && offloaded_blocks_[i];
    if (offload) {
      const ActivationOffloadScope scope(*activation_offload_, static_cast<int64_t>(i));
      x = block->forward(x);
    } else if (recompute && block->kind() == BlockKind::kLayer) {
      x = checkpointed_forward(*block, x);
    } else {
      x = block->forward(x);
    }
    if (host) x = cross_device(x, home);
  }
  if (training && activation_offload_) activation_offload_->forward_ended();  // Note [Activation prefetch]
  return x;
}

void Model::set_activation_offload(std::shared_ptr<const ActivationOffload> offload, std::vector<bool> blocks) {
  const bool any = std::find(blocks.begin(), blocks.end(), true) != blocks.end();
  TANDEM_CHECK(!any || use_tandem_autograd_engine(),
               "model.activation_offload needs tandem's own autograd engine, which only a C++ program can run; "
               "inside Python use torch.autograd.graph.save_on_cpu instead, or set model.activation_offload=0");
  TANDEM_ASSERT(!any || offload != nullptr, "activation offload flags without an offload");
  TANDEM_ASSERT(blocks.size() <= blocks_.size(), blocks.size(), " flags for ", blocks_.size(), " Blocks");
  for (size_t i = 0; i < blocks.size(); ++i)
    TANDEM_ASSERT(!blocks[i] || blocks_[i]->kind() == BlockKind::kLayer, "only decoder layers offload: ", i);
  activation_offload_ = any ? std::move(offload) : nullptr;
  offloaded_blocks_ = any ? std::move(blocks) : std::vector<bool>{};
}

void offload_activations(Model& model, int64_t layers, const c10::Device& device, HostArena::Allocator host_slab) {
  if (layers == 0) return;
  TANDEM_ASSERT(layers >= -1, "model.activation_offload=auto must be resolved first (resolve_activation_offload)");
  const int64_t n_layer = model.spec().n_layer;
  TANDEM_CHECK(!device.is_cpu(), "model.activation_offload=", layers,
               " copies activations from the GPU to the host; on the CPU they are in host memory already: set "
               "model.activation_offload=0");
  TANDEM_CHECK(layers <= n_layer, "model.activation_offload=", layers, " but the model has ", n_layer,
               " decoder layers: set at most ", n_layer, " (or -1 for all)");
  const int64_t n = layers < 0 ? n_layer : layers;
  std::vector<bool> flags(model.blocks().size(), false);
  int64_t taken = 0;
  for (size_t i = 0; i < flags.size() && taken < n; ++i)
    if (model.blocks()[i]->kind() == BlockKind::kLayer) flags[i] = true, ++taken;
  ActivationOffload::Options options;
  options.host_slab = std::move(host_slab);
  model.set_activation_offload(std::make_shared<ActivationOffload>(std::move(options)), std::move(flags));
}

torch::Tensor Model::loss(const torch::Tensor& logits, const torch::Tensor& targets) const {
  const auto ce = cross_entropy(logits, targets);
  const auto balance = balance_loss(0, blocks_.size(), ce.device());
  return balance.defined() ? ce + balance : ce;
}

torch::Tensor Model::cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) const {
  auto l = logits;
  if (spec_.padded_vocab() != spec_.vocab_size) l = l.narrow(-1, 0, spec_.vocab_size);
  return torch::nn::functional::cross_entropy(l.reshape({-1, spec_.vocab_size}).to(torch::kFloat32),
                                              targets.reshape({-1}));
}

namespace {
// The load-balance loss of Block `b` from its last forward; undefined for a Block without experts.
torch::Tensor block_balance_loss(const Block& b) {
  if (const auto* layer = dynamic_cast<const ResNetBkLayer*>(&b)) return layer->aux_loss();
  if (const auto* layer = dynamic_cast<const MoeFfnLayer*>(&b)) return layer->aux_loss();
  return {};
}
}  // namespace

torch::Tensor Model::balance_loss(size_t first, size_t end, const c10::Device& device) const {
  if ((spec_.arch != Arch::kResNetBk && spec_.arch != Arch::kAmxMoe) || spec_.moe_aux_weight <= 0) return {};
  // Averaged over the model's MoE layers (a host-run layer's comes to `device` inside autograd).
  int64_t layers = 0;
  for (const auto& b : blocks_)
    layers +=
        dynamic_cast<const ResNetBkLayer*>(b.get()) != nullptr || dynamic_cast<const MoeFfnLayer*>(b.get()) != nullptr;
  torch::Tensor sum;
  for (size_t i = first; i < end; ++i) {
    const auto a = block_balance_loss(*blocks_[i]);
    if (!a.defined()) continue;
    const auto t = cross_device(a, device);
    sum = sum.defined() ? sum + t : t;
  }
  return sum.defined() ? spec_.moe_aux_weight * sum / double(layers) : sum;
}

std::vector<NamedTensor> Model::hf_parameters() {
  std::vector<NamedTensor> out;
  for (auto& b : blocks_)
    for (auto& nt : b->hf_parameters()) out.push_back(std::move(nt));
  return out;
}

std::vector<NamedTensor> Model::hf_state_dict() {
  std::vector<NamedTensor> out;
  for (auto& b : blocks_)
    for (auto& [name, p] : b->hf_parameters()) {
      const auto shape = b->hf_shape(name, p);
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
  for (auto& b : blocks_)
    for (auto& [name, p] : b->hf_parameters()) {
      const auto expected = b->hf_shape(name, p);
      auto t = lookup(name);
      TANDEM_CHECK(t.has_value(), source, ": tensor '", name,
                   "' is missing; the checkpoint does not match this architecture (check model.* settings)");
      const bool vocab = vocab_names_.count(name) > 0;
      if (vocab && t->dim() == 2 && t->size(1) == expected[1] && t->size(0) < expected[0]) {
        p.narrow(0, 0, t->size(0)).copy_(*t);  // Note [Folder overrides]: a grown vocabulary keeps its new rows
        continue;
      }
      TANDEM_CHECK(t->sizes().vec() == expected, source, ": tensor '", name, "' has shape ", t->sizes(),
                   " but the model expects ", c10::IntArrayRef(expected),
                   "; the checkpoint was made for a different architecture (check model.* settings)");
      TANDEM_CHECK(t->is_floating_point(), source, ": tensor '", name, "' has dtype ", t->scalar_type(),
                   "; expected a floating-point tensor");
      if (!vocab && expected != p.sizes().vec()) p.zero_();  // feed-forward padding stays zero
      auto dst = p;
      for (size_t d = 0; d < expected.size(); ++d)
        if (expected[d] != dst.size(d)) dst = dst.narrow(d, 0, expected[d]);
      dst.copy_(*t);
    }
}

std::shared_ptr<Model> build_model(const ModelSpec& spec, bool checkpointing, std::pair<size_t, size_t> fill) {
  return std::make_shared<Model>(spec, checkpointing, fill);
}

}  // namespace tandem
