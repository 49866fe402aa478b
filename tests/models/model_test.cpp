// The Model as a sequence of Blocks: HF-named parameters (unique, complete, exported without
// padding and loaded back exactly), the loss over the real vocabulary only, Blocks that partition
// the parameters, and activation checkpointing.

#include "tandem/models/model.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "../test_util.h"
#include "tandem/core/error.h"
#include "tandem/io/hf.h"
#include "tandem/models/amx_moe.h"
#include "tandem/models/resnet_bk.h"
#include "tandem/models/spec.h"
#include "tandem/run/trainer.h"

namespace tandem {
namespace {

using test::error_of;

ModelSpec small_spec() {
  ModelSpec s = preset_spec("tiny");
  s.n_layer = 2, s.d_model = 32, s.n_head = 4, s.n_kv_head = 2, s.d_ff = 48, s.vocab_size = 50, s.max_seq_len = 16;
  return s;
}

/// One spec of each architecture, small; the LLaMA ones with vocabulary and feed-forward padding.
std::vector<ModelSpec> small_specs() {
  ModelSpec untied = small_spec();
  untied.name = "small-untied";
  untied.tie_embeddings = false;
  ModelSpec tied = small_spec();
  tied.name = "small-tied";
  ModelSpec mlp = preset_spec("mlp");
  mlp.d_ff = 1000, mlp.vocab_size = 200;  // padded to 1024 and 256
  return {untied, tied, mlp, preset_spec("bk-tiny"), preset_spec("amx-moe-tiny")};
}

const c10::TensorImpl* impl(const torch::Tensor& t) { return t.unsafeGetTensorImpl(); }

// Tolerances from fp32's epsilon for a result of a few dozen fp32 operations.
constexpr double kFp32Eps = std::numeric_limits<float>::epsilon();
constexpr double kRtol = 16 * kFp32Eps, kAtol = 16 * kFp32Eps;

TEST(Model, HfParametersAreUniqueAndComplete) {
  for (const ModelSpec& s : small_specs()) {
    torch::manual_seed(0);
    Model m(s, false);
    std::set<std::string> names;
    std::set<const c10::TensorImpl*> tensors;
    int64_t numel = 0;
    for (auto& [name, p] : m.hf_parameters()) {
      EXPECT_TRUE(names.insert(name).second) << s.name << ": '" << name << "' twice";
      EXPECT_TRUE(tensors.insert(impl(p)).second) << s.name << ": the tensor of '" << name << "' twice";
      numel += p.numel();
    }
    // Every registered parameter has an HF name, and nothing else has one.
    std::set<const c10::TensorImpl*> registered;
    for (const auto& p : m.parameters()) registered.insert(impl(p));
    EXPECT_EQ(tensors, registered) << s.name;
    EXPECT_EQ(numel, s.num_params()) << s.name << ": stored, padded";
    EXPECT_EQ(names.count("lm_head.weight"), s.tie_embeddings ? 0u : 1u) << s.name;
    EXPECT_EQ(names.count("model.embed_tokens.weight"), 1u) << s.name;
    EXPECT_EQ(names.count("model.norm.weight"), 1u) << s.name;
    // The export: the same names in the same order, views of the parameters cut to the real sizes.
    const auto params = m.hf_parameters();
    const auto hf = m.hf_state_dict();
    ASSERT_EQ(hf.size(), params.size()) << s.name;
    int64_t hf_numel = 0;
    for (size_t i = 0; i < hf.size(); ++i) {
      EXPECT_EQ(hf[i].first, params[i].first) << s.name;
      EXPECT_EQ(hf[i].second.data_ptr(), params[i].second.data_ptr()) << s.name << ": " << hf[i].first;
      hf_numel += hf[i].second.numel();
    }
    EXPECT_EQ(hf_numel, s.num_params_unpadded()) << s.name << ": as an HF checkpoint counts them";
  }
  // The padded LLaMA: vocabulary rows and feed-forward units cut.
  ModelSpec s = small_spec();
  s.tie_embeddings = false;
  Model m(s, false);
  std::map<std::string, torch::Tensor> hf;
  for (auto& [n, t] : m.hf_state_dict()) hf[n] = t;
  EXPECT_EQ(hf.at("model.embed_tokens.weight").sizes(), (std::vector<int64_t>{50, 32}));
  EXPECT_EQ(hf.at("lm_head.weight").sizes(), (std::vector<int64_t>{50, 32}));
  EXPECT_EQ(hf.at("model.layers.1.mlp.gate_proj.weight").sizes(), (std::vector<int64_t>{48, 32}));
  EXPECT_EQ(hf.at("model.layers.1.mlp.up_proj.weight").sizes(), (std::vector<int64_t>{48, 32}));
  EXPECT_EQ(hf.at("model.layers.1.mlp.down_proj.weight").sizes(), (std::vector<int64_t>{32, 48}));
  EXPECT_EQ(hf.at("model.layers.1.self_attn.k_proj.weight").sizes(), (std::vector<int64_t>{16, 32}));
}

TEST(Model, HfStateDictLoadsIntoAFreshModelExactly) {
  for (const ModelSpec& s : small_specs()) {
    torch::manual_seed(1);
    Model a(s, false);
    torch::manual_seed(2);
    Model b(s, false);
    std::map<std::string, torch::Tensor> saved;
    for (auto& [n, t] : a.hf_state_dict()) saved[n] = t.clone();
    const auto lookup = [&](const std::string& n) -> std::optional<torch::Tensor> {
      const auto it = saved.find(n);
      if (it == saved.end()) return std::nullopt;
      return it->second;
    };
    // Feed-forward padding is zero after a load, whatever was there.
    const int64_t pad = s.padded_d_ff() - s.d_ff;
    const auto ff_padding = [&](const std::string& n, const torch::Tensor& p) -> std::optional<torch::Tensor> {
      if (pad == 0 || n.find("_proj") == std::string::npos || n.find("mlp.") == std::string::npos) return std::nullopt;
      return n.find("down_proj") != std::string::npos ? p.narrow(1, s.d_ff, pad) : p.narrow(0, s.d_ff, pad);
    };
    {
      torch::NoGradGuard no_grad;
      for (auto& [n, p] : b.hf_parameters())
        if (auto padding = ff_padding(n, p)) padding->fill_(1.0f);
    }
    b.load_hf_state_dict(lookup, "saved");
    for (auto& [n, t] : b.hf_state_dict()) EXPECT_TRUE(torch::equal(t, saved.at(n))) << s.name << ": " << n;
    int64_t padded = 0;
    for (auto& [n, p] : b.hf_parameters()) {
      if (auto padding = ff_padding(n, p)) {
        EXPECT_TRUE(padding->eq(0).all().item<bool>()) << s.name << ": " << n;
        ++padded;
      }
    }
    EXPECT_EQ(padded, pad == 0 ? 0 : (s.arch == Arch::kMlp ? 2 : 3) * s.n_layer) << s.name;
    // The two compute the same function on the real vocabulary.
    torch::NoGradGuard no_grad;
    const auto tokens = torch::randint(0, s.vocab_size, {2, 9}, torch::kInt64);
    const auto la = a.forward(tokens).narrow(-1, 0, s.vocab_size);
    const auto lb = b.forward(tokens).narrow(-1, 0, s.vocab_size);
    EXPECT_TRUE(test::AllClose(lb, la, 0, 0)) << s.name;
  }
}

TEST(Model, LoadHfStateDictCastsAndRefusesWhatDoesNotFit) {
  ModelSpec s = small_spec();
  s.tie_embeddings = false;
  torch::manual_seed(3);
  Model a(s, false);
  Model b(s, false);
  std::map<std::string, torch::Tensor> saved;
  for (auto& [n, t] : a.hf_state_dict()) saved[n] = t.to(torch::kBFloat16);
  const auto lookup = [&](const std::string& n) -> std::optional<torch::Tensor> {
    const auto it = saved.find(n);
    if (it == saved.end()) return std::nullopt;
    return it->second;
  };
  b.load_hf_state_dict(lookup, "bf16 file");
  for (auto& [n, t] : b.hf_state_dict()) {
    EXPECT_EQ(t.scalar_type(), torch::kFloat32) << n;
    EXPECT_TRUE(torch::equal(t, saved.at(n).to(torch::kFloat32))) << n << ": each value the bf16 one";
  }
  saved.erase("lm_head.weight");
  std::string msg = error_of([&] { b.load_hf_state_dict(lookup, "a.safetensors"); });
  EXPECT_NE(msg.find("a.safetensors: tensor 'lm_head.weight' is missing"), std::string::npos) << msg;
  saved["lm_head.weight"] = torch::zeros({50, 32});
  saved["model.layers.0.mlp.gate_proj.weight"] = torch::zeros({49, 32});
  msg = error_of([&] { b.load_hf_state_dict(lookup, "b.safetensors"); });
  EXPECT_NE(msg.find("b.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has shape [49, 32] but the model "
                     "expects [48, 32]"),
            std::string::npos)
      << msg;
  // A padded shape is not the HF shape either.
  saved["model.layers.0.mlp.gate_proj.weight"] = torch::zeros({64, 32});
  EXPECT_NE(error_of([&] { b.load_hf_state_dict(lookup, "c"); }).find("has shape [64, 32]"), std::string::npos);
  saved["model.layers.0.mlp.gate_proj.weight"] = torch::zeros({48, 32}, torch::kInt64);
  msg = error_of([&] { b.load_hf_state_dict(lookup, "d"); });
  EXPECT_NE(
      msg.find("d: tensor 'model.layers.0.mlp.gate_proj.weight' has dtype Long; expected a floating-point tensor"),
      std::string::npos)
      << msg;
}

/// Mean cross-entropy over the first `vocab` columns of (N, V_pad) logits, by hand in double.
double reference_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab) {
  const auto l = logits.to(torch::kFloat64).contiguous();
  const auto t = targets.contiguous();
  const int64_t n = l.size(0);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double* row = l.data_ptr<double>() + i * l.size(1);
    double max = row[0];
    for (int64_t j = 1; j < vocab; ++j) max = std::max(max, row[j]);
    double z = 0;
    for (int64_t j = 0; j < vocab; ++j) z += std::exp(row[j] - max);
    sum += max + std::log(z) - row[t.data_ptr<int64_t>()[i]];
  }
  return sum / n;
}

TEST(Model, LossIsTheCrossEntropyOverTheRealVocabularyOnly) {
  const ModelSpec s = small_spec();  // vocabulary 50, padded to 64
  Model m(s, false);
  torch::manual_seed(4);
  const int64_t B = 3, T = 7, N = B * T;
  auto logits = torch::randn({B, T, 64}).mul_(3);
  logits.narrow(-1, 50, 14).fill_(40.0f);  // padding columns that would win any softmax they entered
  logits.requires_grad_(true);
  const auto targets = torch::randint(0, 50, {B, T}, torch::kInt64);
  const auto loss = m.loss(logits, targets);
  ASSERT_EQ(loss.dim(), 0);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
  const double ref = reference_cross_entropy(logits.detach().reshape({N, 64}), targets.reshape({N}), 50);
  EXPECT_TRUE(test::AllClose(loss.reshape({1}), torch::tensor({ref}, torch::kFloat64), kRtol, kAtol));
  // The gradient: (softmax over the real vocabulary - one-hot) / N, and exactly zero on the padding.
  loss.backward();
  const auto grad = logits.grad().reshape({N, 64});
  EXPECT_TRUE(grad.narrow(1, 50, 14).eq(0).all().item<bool>()) << "padding columns get no gradient";
  auto expected = torch::softmax(logits.detach().reshape({N, 64}).narrow(1, 0, 50).to(torch::kFloat64), 1);
  expected.scatter_add_(1, targets.reshape({N, 1}), -torch::ones({N, 1}, torch::kFloat64));
  EXPECT_TRUE(test::AllClose(grad.narrow(1, 0, 50), expected / N, kRtol, kAtol / N));
  // Low-precision logits are taken in fp32: the loss of bf16 logits is that of their fp32 values.
  const auto low = logits.detach().to(torch::kBFloat16);
  const auto low_loss = m.loss(low, targets);
  EXPECT_EQ(low_loss.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(low_loss, m.loss(low.to(torch::kFloat32), targets)));
  EXPECT_TRUE(test::AllClose(
      low_loss.reshape({1}),
      torch::tensor({reference_cross_entropy(low.reshape({N, 64}), targets.reshape({N}), 50)}, torch::kFloat64), kRtol,
      kAtol));
  // Without padding every column counts.
  ModelSpec full = small_spec();
  full.vocab_size = 64;
  Model f(full, false);
  const auto all_cols = f.loss(logits.detach(), targets);
  EXPECT_TRUE(test::AllClose(
      all_cols.reshape({1}),
      torch::tensor({reference_cross_entropy(logits.detach().reshape({N, 64}), targets.reshape({N}), 64)},
                    torch::kFloat64),
      kRtol, kAtol));
  EXPECT_GT(all_cols.item<double>(), loss.item<double>() + 10) << "the padding columns entered the softmax here";
}

TEST(Model, LossAddsTheMeanLoadBalanceLossOfTheMoeLayers) {
  for (const char* preset : {"bk-tiny", "amx-moe-tiny"}) {
    ModelSpec with = preset_spec(preset), without = with;
    with.moe_aux_weight = 0.25;
    without.moe_aux_weight = 0;
    torch::manual_seed(5);
    Model a(with, false);
    torch::manual_seed(5);
    Model b(without, false);
    const auto tokens = torch::randint(0, 256, {2, 12}, torch::kInt64);
    const auto logits_a = a.forward(tokens);
    const auto logits_b = b.forward(tokens);
    ASSERT_TRUE(torch::equal(logits_a, logits_b)) << preset << ": the weight changes only the loss";
    std::vector<double> aux;
    for (const auto& block : a.blocks()) {
      if (const auto* l = dynamic_cast<const ResNetBkLayer*>(block.get())) aux.push_back(l->aux_loss().item<double>());
      if (const auto* l = dynamic_cast<const MoeFfnLayer*>(block.get())) aux.push_back(l->aux_loss().item<double>());
    }
    ASSERT_EQ(aux.size(), static_cast<size_t>(with.n_layer - with.n_dense)) << preset;
    double mean = 0;
    for (double x : aux) mean += x / aux.size();
    const auto targets = torch::randint(0, 256, {2, 12}, torch::kInt64);
    const double ce = reference_cross_entropy(logits_b.detach().reshape({24, 256}), targets.reshape({24}), 256);
    const auto plain = b.loss(logits_b, targets);
    EXPECT_TRUE(test::AllClose(plain.reshape({1}), torch::tensor({ce}, torch::kFloat64), kRtol, kAtol)) << preset;
    const auto weighted = a.loss(logits_a, targets);
    EXPECT_TRUE(test::AllClose(weighted.reshape({1}), torch::tensor({ce + 0.25 * mean}, torch::kFloat64), kRtol, kAtol))
        << preset << ": aux losses " << aux.size() << ", mean " << mean;
    // The aux term carries gradient to the routers.
    weighted.backward();
    for (auto& [n, p] : a.hf_parameters())
      if (n.find("router") != std::string::npos) {
        ASSERT_TRUE(p.grad().defined()) << n;
        EXPECT_GT(p.grad().abs().sum().item<double>(), 0.0) << n;
      }
  }
}

TEST(Model, BlocksPartitionTheParameters) {
  for (const ModelSpec& s : small_specs()) {
    Model m(s, false);
    const auto& blocks = m.blocks();
    ASSERT_EQ(blocks.size(), static_cast<size_t>(s.n_layer + 2)) << s.name;
    std::set<const c10::TensorImpl*> seen;
    int64_t total = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const auto& b = *blocks[i];
      const bool first = i == 0, last = i + 1 == blocks.size();
      EXPECT_EQ(b.kind(), first ? BlockKind::kEmbedding : last ? BlockKind::kHead : BlockKind::kLayer) << s.name << i;
      EXPECT_EQ(b.name(), first ? "embed" : last ? "head" : "layer." + std::to_string(i - 1)) << s.name;
      int64_t n = 0;
      for (const auto& p : blocks[i]->parameters()) {
        EXPECT_TRUE(seen.insert(impl(p)).second) << s.name << ": a tensor of " << b.name() << " in two Blocks";
        n += p.numel();
      }
      total += n;
      const std::string prefix = first  ? "model.embed_tokens."
                                 : last ? ""
                                        : "model.layers." + std::to_string(i - 1) + ".";
      for (auto& [name, p] : blocks[i]->hf_parameters()) {
        if (last)
          EXPECT_TRUE(name == "model.norm.weight" || name == "lm_head.weight") << name;
        else
          EXPECT_EQ(name.rfind(prefix, 0), 0u) << b.name() << ": " << name;
      }
      if (first)
        EXPECT_EQ(n, s.padded_vocab() * s.d_model) << s.name;
      else if (last)
        EXPECT_EQ(n, s.d_model + (s.tie_embeddings ? 0 : s.padded_vocab() * s.d_model)) << s.name;
      else
        EXPECT_EQ(n, s.layer_params(static_cast<int64_t>(i) - 1)) << s.name << " " << b.name();
    }
    std::set<const c10::TensorImpl*> registered;
    for (const auto& p : m.parameters()) registered.insert(impl(p));
    EXPECT_EQ(seen, registered) << s.name << ": every parameter in exactly one Block";
    EXPECT_EQ(total, s.num_params()) << s.name;
  }
}

TEST(Model, BeforeBlockIsCalledForEveryBlockInOrder) {
  const ModelSpec s = small_spec();
  torch::manual_seed(6);
  Model m(s, false);
  const auto tokens = torch::randint(0, 50, {1, 5}, torch::kInt64);
  const auto plain = m.forward(tokens);
  std::vector<size_t> calls;
  m.set_before_block([&](size_t i) { calls.push_back(i); });
  const auto hooked = m.forward(tokens);
  EXPECT_EQ(calls, (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_TRUE(torch::equal(hooked, plain));
  m.set_before_block({});
  m.forward(tokens);
  EXPECT_EQ(calls.size(), 4u) << "an empty function is no hook";
  // On one device the host path is the same computation and cross_device is the tensor itself.
  m.set_host_blocks({true, false, true, true});
  EXPECT_TRUE(torch::equal(m.forward(tokens), plain));
  EXPECT_EQ(impl(cross_device(plain, torch::kCPU)), impl(plain));
}

TEST(Model, BuildModelDrawsFromTorchsRng) {
  const ModelSpec s = small_spec();
  torch::manual_seed(7);
  auto a = build_model(s, false);
  torch::manual_seed(7);
  auto b = build_model(s, false);
  auto c = build_model(s, false);  // the RNG has moved on
  EXPECT_FALSE(b->checkpointing());
  EXPECT_TRUE(build_model(s, true)->checkpointing());
  EXPECT_EQ(a->spec().name, s.name);
  const auto pa = a->hf_parameters(), pb = b->hf_parameters(), pc = c->hf_parameters();
  bool any_differs = false;
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::equal(pa[i].second, pb[i].second)) << pa[i].first;
    any_differs = any_differs || !torch::equal(pa[i].second, pc[i].second);
  }
  EXPECT_TRUE(any_differs);
}

// Moved from tests/models/llama_test.cpp.

TEST(Llama, ShapesAndPaddedVocab) {
  torch::manual_seed(0);
  const ModelSpec s = small_spec();
  Model m(s, false);
  EXPECT_EQ(s.padded_vocab(), 64);
  auto tokens = torch::randint(0, s.vocab_size, {3, 7}, torch::kInt64);
  auto logits = m.forward(tokens);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 7, 64}));
  auto loss = m.loss(logits, torch::randint(0, s.vocab_size, {3, 7}, torch::kInt64));
  EXPECT_EQ(loss.dim(), 0);
  // Near-uniform predictions at initialisation: loss close to ln(vocab).
  EXPECT_NEAR(loss.item<double>(), std::log(50.0), 0.3);
  int64_t counted = 0;
  for (auto& p : m.parameters()) counted += p.numel();
  EXPECT_EQ(counted, s.num_params());
  EXPECT_EQ(m.blocks().size(), static_cast<size_t>(s.n_layer + 2));
}

TEST(Llama, ActivationCheckpointingGivesTheSameGradients) {
  const ModelSpec s = small_spec();
  torch::manual_seed(3);
  Model plain(s, false);
  torch::manual_seed(3);
  Model ckpt(s, true);
  auto tokens = torch::randint(0, 50, {2, 9}, torch::kInt64);
  auto targets = torch::randint(0, 50, {2, 9}, torch::kInt64);
  plain.loss(plain.forward(tokens), targets).backward();
  ckpt.loss(ckpt.forward(tokens), targets).backward();
  auto a = plain.hf_parameters(), b = ckpt.hf_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(b[i].second.grad().defined()) << b[i].first;
    EXPECT_TRUE(test::AllClose(b[i].second.grad(), a[i].second.grad(), 1e-5, 1e-7)) << a[i].first;
  }
}

// Moved from tests/models/shapes_test.cpp.

// d_ff = 300 is stored as 320: the 20 extra units start at zero, stay exactly zero through
// training, and leave the HF export (and a model loaded from it) unchanged.
TEST(Shapes, FeedForwardPaddingStaysZeroAndLeavesTheExport) {
  test::TempDir dir;
  Config c = test::tiny_cpu_config(dir.path(), 15);
  c.model.d_ff = 300;
  c.train.save_final = true;
  train(c, {});
  const ModelSpec spec = resolve_model_spec(c.model);
  auto model = build_model(spec, false);
  // Load the run's final HF checkpoint into a fresh model and inspect the padding.
  const auto ckpt = dir.path() + "/checkpoints/step_00000015";
  const auto export_of = [&](Model& m) {
    std::map<std::string, torch::Tensor> out;
    for (auto& [n, t] : m.hf_state_dict()) out[n] = t.clone();
    return out;
  };
  load_hf_weights(*model, ckpt);
  for (auto& [name, p] : model->hf_parameters()) {
    if (name.find("gate_proj") != std::string::npos || name.find("up_proj") != std::string::npos) {
      EXPECT_EQ(p.size(0), 320);
      EXPECT_TRUE(p.narrow(0, 300, 20).eq(0).all().item<bool>()) << name;
    }
    if (name.find("down_proj") != std::string::npos) {
      EXPECT_EQ(p.size(1), 320);
      EXPECT_TRUE(p.narrow(1, 300, 20).eq(0).all().item<bool>()) << name;
    }
  }
  const auto hf = export_of(*model);
  EXPECT_EQ(hf.at("model.layers.0.mlp.gate_proj.weight").size(0), 300);
  EXPECT_EQ(hf.at("model.layers.0.mlp.down_proj.weight").size(1), 300);
  // An unpadded computation of the feed-forward equals the padded one.
  torch::NoGradGuard no_grad;
  auto x = torch::randn({3, 128});
  const auto& g = hf.at("model.layers.0.mlp.gate_proj.weight");
  const auto& u = hf.at("model.layers.0.mlp.up_proj.weight");
  const auto& d = hf.at("model.layers.0.mlp.down_proj.weight");
  const auto unpadded = torch::matmul(torch::silu(x.matmul(g.t())) * x.matmul(u.t()), d.t());
  torch::Tensor gp, up, dp;
  for (auto& [name, p] : model->hf_parameters()) {
    if (name == "model.layers.0.mlp.gate_proj.weight") gp = p;
    if (name == "model.layers.0.mlp.up_proj.weight") up = p;
    if (name == "model.layers.0.mlp.down_proj.weight") dp = p;
  }
  const auto padded = torch::matmul(torch::silu(x.matmul(gp.t())) * x.matmul(up.t()), dp.t());
  EXPECT_TRUE(test::AllClose(padded, unpadded, 1e-6, 1e-6));
}

// Moved from tests/models/resnet_bk_test.cpp.

TEST(ResNetBk, CheckpointingIsRefusedWithTheReason) {
  EXPECT_NE(
      test::error_of([] { build_model(preset_spec("bk-tiny"), true); }).find("model.checkpointing is not supported"),
      std::string::npos);
}

}  // namespace
}  // namespace tandem
