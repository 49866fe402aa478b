// Note [NVMe tier]: a ParamStore whose last Blocks keep their states in files against one that keeps
// them in memory, after the same updates: the checkpoint's view of them (state()), one parameter's
// (param_state), moves to the device side and back, and loading a state into the tier.
#include "tandem/engine/disk_states.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>

#include "../test_util.h"
#include "engine_fixtures.h"
#include "tandem/engine/offload_engine.h"
#include "tandem/engine/param_store.h"
#include "tandem/models/model.h"

namespace tandem {
namespace {

ModelSpec small_spec() { return test::small_engine_spec(3); }

std::shared_ptr<Model> small_model() { return test::small_engine_model(3); }

void train_three_steps(Model& model, ParamStore& store) {
  EngineOptions eo;
  eo.speculate = EngineOptions::Speculate::kNever;
  OffloadEngine engine(model, store, eo);
  for (int step = 0; step < 3; ++step) {
    engine.begin_step(3e-3);
    engine.begin_micro(true);
    torch::manual_seed(1000 + step);
    auto t = torch::randint(0, small_spec().vocab_size, {4, 17}, torch::kInt64);
    model.loss(model.forward(t.narrow(1, 0, 16)), t.narrow(1, 1, 16)).backward();
    engine.end_step();
  }
  engine.wait_all();
}

std::map<std::string, torch::Tensor> state_of(ParamStore& store) {
  std::map<std::string, torch::Tensor> out;
  for (auto& [name, t] : store.state(torch::zeros({}))) out[name] = t.clone();
  return out;
}

void expect_same_state(const std::map<std::string, torch::Tensor>& got,
                       const std::map<std::string, torch::Tensor>& want, const char* when) {
  ASSERT_EQ(got.size(), want.size()) << when;
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << name << " " << when;
    EXPECT_TRUE(torch::equal(got.at(name), t)) << name << " " << when;
  }
}

ParamStoreOptions options(torch::ScalarType state, const std::string& nvme_path, int64_t nvme_blocks) {
  ParamStoreOptions so;
  so.undo = false;
  so.host_state_dtype = state;
  so.nvme_path = nvme_path;
  so.nvme_blocks = nvme_blocks;
  return so;
}

TEST(DiskStates, TheTiersStatesEqualTheHostsThroughMovesAndLoads) {
  test::TempDir tmp;
  for (const auto state : {torch::kFloat32, torch::kBFloat16, torch::kInt8}) {
    SCOPED_TRACE(c10::toString(state));
    auto ref_model = small_model();
    ParamStore ref(*ref_model, options(state, "", 0), 0);
    train_three_steps(*ref_model, ref);
    const auto want = state_of(ref);

    auto model = small_model();
    ParamStore store(*model, options(state, tmp.file("nvme"), 3), 0);
    ASSERT_NE(store.disk(), nullptr);
    train_three_steps(*model, store);
    int on_tier = 0;
    for (auto& b : store.blocks())
      if (b.nvme) {
        ++on_tier;
        EXPECT_FALSE(b.m.defined()) << b.name << ": its states live in the file between updates";
      }
    EXPECT_EQ(on_tier, 3);
    expect_same_state(state_of(store), want, "after training");

    // One parameter of the last Block (on the tier): its master and moments, as the host's.
    auto& last = store.blocks().back().params.front().param;
    auto& ref_last = ref.blocks().back().params.front().param;
    const auto got_p = store.param_state(last), want_p = ref.param_state(ref_last);
    for (size_t k = 0; k < want_p.size(); ++k) EXPECT_TRUE(torch::equal(got_p[k], want_p[k])) << k;

    store.set_gpu_blocks(3);  // the embedding and two layers: layer 1 comes off the tier
    expect_same_state(state_of(store), want, "after moving to the device side");
    store.set_gpu_blocks(0);
    expect_same_state(state_of(store), want, "after moving back");
    for (auto& b : store.blocks())
      if (b.nvme) {
        EXPECT_FALSE(b.m.defined()) << b.name << ": moved back, its states went to the file again";
      }

    // A state loaded into a fresh store with the tier: the same values (8-bit states re-encode the
    // decoded values to the same codes).
    auto fresh_model = small_model();
    ParamStore fresh(*fresh_model, options(state, tmp.file("nvme2"), 3), 0);
    torch::Tensor step = torch::zeros({});
    fresh.load_state(
        [&](const std::string& name) -> std::optional<torch::Tensor> {
          if (name.size() > 5 && name.substr(name.size() - 5) == ".step") return torch::ones({});
          const auto it = want.find(name);
          return it == want.end() ? std::nullopt : std::optional<torch::Tensor>(it->second);
        },
        "test", step);
    auto loaded = state_of(fresh);
    for (auto& [name, t] : loaded)
      if (name.size() > 5 && name.substr(name.size() - 5) == ".step") t = want.at(name);
    expect_same_state(loaded, want, "after load_state");
  }
}

}  // namespace
}  // namespace tandem
