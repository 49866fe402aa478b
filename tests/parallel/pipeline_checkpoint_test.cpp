// Pipeline checkpoints (parallel/pipeline_checkpoint.h): stage leaders' weights and states reach
// rank 0, a later gather replaces the earlier one's states, and GatheredOptimizer passes the stage's
// work through. Ranks are threads on loopback Gloo.

#include "tandem/parallel/pipeline_checkpoint.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "../error_of.h"
#include "comm_threads.h"
#include "tandem/models/model.h"
#include "tandem/models/stage_blocks.h"
#include "tandem/parallel/comm.h"
#include "tandem/parallel/pipeline_grid.h"

namespace tandem::test {
namespace {

// A stage's optimizer with given states, counting what reaches it.
class StagedOptimizer : public Optimizer {
 public:
  explicit StagedOptimizer(std::vector<NamedTensor> states) : states_(std::move(states)) {}
  void step(double lr, const std::optional<torch::Tensor>& found_inf) override {
    lrs.push_back(lr);
    found_infs.push_back(found_inf.has_value());
  }
  void zero_grad() override { ++zero_grads; }
  std::vector<NamedTensor> state() override { return states_; }

  std::vector<double> lrs;
  std::vector<bool> found_infs;
  int zero_grads = 0;

 private:
  std::vector<NamedTensor> states_;
};

// Embedding, 2 decoder layers and an untied head: 4 Blocks.
ModelSpec small_spec() {
  ModelSpec s = preset_spec("tiny");
  s.n_layer = 2, s.d_model = 16, s.n_head = 2, s.n_kv_head = 2, s.d_ff = 32;
  s.vocab_size = 64, s.max_seq_len = 16, s.tie_embeddings = false;
  return s;
}

// Rank `rank`'s weights: parameter i (in hf_parameters() order) is rank * 1000 + i everywhere.
void fill_weights(Model& model, double rank) {
  torch::NoGradGuard no_grad;
  int i = 0;
  for (auto& [name, p] : model.hf_parameters()) p.fill_(rank * 1000 + i++);
}

// Rank `rank`'s optimizer states: fp32, bf16 and a 0-d int64 step, each telling the rank.
std::vector<NamedTensor> states_of(int rank) {
  const auto r = static_cast<double>(rank);
  const std::string tag = "rank" + std::to_string(rank);
  return {{tag + ".exp_avg", torch::arange(6, torch::kFloat32).reshape({2, 3}) + 100 * r},
          {tag + ".exp_avg_sq", (torch::arange(5, torch::kFloat32) + r).to(torch::kBFloat16)},
          {tag + ".step", torch::full({}, 7 + rank, torch::kInt64)}};
}

void expect_states(const std::vector<NamedTensor>& got, const std::vector<NamedTensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first) << what;
    ASSERT_EQ(got[i].second.scalar_type(), want[i].second.scalar_type()) << what << " " << want[i].first;
    ASSERT_EQ(got[i].second.sizes(), want[i].second.sizes()) << what << " " << want[i].first;
    EXPECT_TRUE(torch::equal(got[i].second, want[i].second)) << what << " " << want[i].first;
  }
}

// The names of stage `stage`'s weights under `grid`'s cut of `model`.
std::set<std::string> stage_names(Model& model, const std::vector<int64_t>& ends, int stage) {
  StageBlocks blocks(model, stage == 0 ? 0 : static_cast<size_t>(ends[static_cast<size_t>(stage - 1)]),
                     static_cast<size_t>(ends[static_cast<size_t>(stage)]));
  std::set<std::string> out;
  for (auto& [name, p] : blocks.hf_parameters()) out.insert(name);
  return out;
}

// Each weight's value, which names the rank whose copy it is (fill_weights).
std::vector<std::pair<std::string, int>> owners(Model& model) {
  std::vector<std::pair<std::string, int>> out;
  int i = 0;
  for (auto& [name, p] : model.hf_parameters()) {
    const double v = p.flatten()[0].item<double>();
    EXPECT_TRUE(torch::equal(p, torch::full_like(p, v))) << name << " is not one value";
    out.emplace_back(name, static_cast<int>((v - i++) / 1000));
  }
  return out;
}

// 3 stages x 2 replicas: rank 0 takes stage 1's weights from rank 2 and stage 2's from rank 4 (the
// first replicas), their states after its own, in stage order; no other rank changes.
TEST(PipelineCheckpoint, StageLeadersSendRankZeroTheirWeightsAndStates) {
  const int world = 6, stages = 3;
  const auto errors = on_ranks(world, 1, port(10), [&](Comm& comm) {
    const int rank = comm.rank();
    const PipelineGrid grid(rank, world, stages);
    auto model = build_model(small_spec(), false);
    const auto ends = even_pipeline_cut(stages, static_cast<int64_t>(model->block_count()));
    ASSERT_EQ(ends, (std::vector<int64_t>{2, 3, 4}));
    fill_weights(*model, rank);
    StageBlocks stage(*model, grid.stage() == 0 ? 0 : static_cast<size_t>(ends[static_cast<size_t>(grid.stage() - 1)]),
                      static_cast<size_t>(ends[static_cast<size_t>(grid.stage())]));
    StagedOptimizer own(states_of(rank));
    GatheredOptimizer optimizer(own);
    gather_pipeline_state(comm, grid, stage, optimizer, *model, /*round=*/0);
    if (rank != 0) {
      EXPECT_TRUE(optimizer.gathered().empty()) << "rank " << rank;
      for (const auto& [name, owner] : owners(*model)) EXPECT_EQ(owner, rank) << "rank " << rank << ": " << name;
      return;
    }
    std::map<std::string, int> want_owner;
    for (int s = 0; s < stages; ++s)
      for (const auto& name : stage_names(*model, ends, s)) want_owner[name] = grid.rank_of(s, 0);
    for (const auto& [name, owner] : owners(*model)) EXPECT_EQ(owner, want_owner.at(name)) << name;
    std::vector<NamedTensor> want = states_of(2);
    for (auto& s : states_of(4)) want.push_back(s);
    expect_states(optimizer.gathered(), want, "gathered");
    std::vector<NamedTensor> all = states_of(0);
    for (auto& s : want) all.push_back(s);
    expect_states(optimizer.state(), all, "state()");
  });
  expect_no_errors(errors);
}

// A second gather (the next checkpoint) brings the stage's new weights, and its states replace the
// first gather's instead of adding to them.
TEST(PipelineCheckpoint, AnotherRoundReplacesTheLastOnesStates) {
  const auto errors = on_ranks(2, 1, port(11), [&](Comm& comm) {
    const int rank = comm.rank();
    const PipelineGrid grid(rank, 2, 2);
    auto model = build_model(small_spec(), false);
    fill_weights(*model, rank);
    StageBlocks stage(*model, rank == 0 ? 0 : 2, rank == 0 ? 2 : 4);
    StagedOptimizer own(states_of(rank));
    GatheredOptimizer optimizer(own);
    gather_pipeline_state(comm, grid, stage, optimizer, *model, 0);
    if (rank == 1) fill_weights(*model, 5);  // trained on
    gather_pipeline_state(comm, grid, stage, optimizer, *model, 1);
    if (rank == 1) return;
    expect_states(optimizer.gathered(), states_of(1), "gathered after round 1");
    const auto second = stage_names(*model, {2, 4}, 1);
    for (const auto& [name, owner] : owners(*model)) EXPECT_EQ(owner, second.count(name) ? 5 : 0) << name;
  });
  expect_no_errors(errors);
}

// What a checkpoint does not gather goes to the stage's optimizer: steps, zero_grad, and a resume,
// which reads the stage's own states alone (the other stages' in the file are theirs).
TEST(PipelineCheckpoint, TheGatheredOptimizerPassesTheStagesWorkThrough) {
  const auto own_states = states_of(0);
  StagedOptimizer own(own_states);
  GatheredOptimizer optimizer(own);
  optimizer.step(0.5, std::nullopt);
  optimizer.step(0.25, torch::zeros({}));
  optimizer.zero_grad();
  EXPECT_EQ(own.lrs, (std::vector<double>{0.5, 0.25}));
  EXPECT_EQ(own.found_infs, (std::vector<bool>{false, true}));
  EXPECT_EQ(own.zero_grads, 1);

  optimizer.gathered() = states_of(3);
  std::map<std::string, torch::Tensor> file;
  for (const auto& [name, t] : states_of(9)) file[name.substr(name.find('.'))] = t;  // rank 9's values, our names
  std::vector<std::string> asked;
  const auto lookup = [&](const std::string& name) -> std::optional<torch::Tensor> {
    asked.push_back(name);
    const auto it = file.find(name.substr(name.find('.')));
    if (name.rfind("rank0.", 0) != 0 || it == file.end()) return std::nullopt;
    return it->second;
  };
  optimizer.load_state(lookup, "ckpt");
  EXPECT_EQ(asked, (std::vector<std::string>{"rank0.exp_avg", "rank0.exp_avg_sq", "rank0.step"}));
  auto want = states_of(9);
  for (size_t i = 0; i < want.size(); ++i) want[i].first = own_states[i].first;
  expect_states(own.state(), want, "the stage's states after the resume");
  expect_states(optimizer.gathered(), states_of(3), "the gathered states, untouched");
  // A state the file lacks is the stage optimizer's error, naming it.
  file.erase(".step");
  EXPECT_NE(error_of([&] { optimizer.load_state(lookup, "ckpt"); }).find("optimizer state 'rank0.step' is missing"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::test
