// The gradient reducer (parallel/grad_reducer.h): gradients summed over the ranks after the last
// micro-batch only, missing ones reduced as zeros, every step afresh, hooks gone with the reducer.
// Ranks are threads on loopback Gloo.

#include "tandem/parallel/grad_reducer.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/variable.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comm_threads.h"
#include "tandem/models/block_sequence.h"

namespace tandem::test {
namespace {

// Blocks as a test lays them out: named leaf tensors, grouped.
class TestBlocks : public BlockSequence {
 public:
  explicit TestBlocks(std::vector<std::vector<NamedTensor>> blocks) : blocks_(std::move(blocks)) {}
  size_t block_count() const override { return blocks_.size(); }
  std::string block_name(size_t i) const override { return "block." + std::to_string(i); }
  BlockKind block_kind(size_t) const override { return BlockKind::kLayer; }
  std::vector<NamedTensor> block_parameters(size_t i) override { return blocks_.at(i); }
  void set_before_block(std::function<void(size_t)>) override {}
  void set_host_blocks(std::vector<bool>) override {}

 private:
  std::vector<std::vector<NamedTensor>> blocks_;
};

// One replica's parameters: Block 0 holds a (4) and b (2, 3), Block 1 c (5) and e (2), Block 2 d (3),
// Block 3 none.
struct Replica {
  std::map<std::string, torch::Tensor> p;
  std::unique_ptr<TestBlocks> blocks;
  Replica() {
    for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"a", {4}}, {"b", {2, 3}}, {"c", {5}}, {"e", {2}}, {"d", {3}}})
      p[name] = torch::ones(shape).requires_grad_(true);
    blocks = std::make_unique<TestBlocks>(std::vector<std::vector<NamedTensor>>{
        {{"a", p["a"]}, {"b", p["b"]}}, {{"c", p["c"]}, {"e", p["e"]}}, {{"d", p["d"]}}, {}});
  }
  void clear_grads() {
    for (auto& [name, t] : p) t.mutable_grad() = torch::Tensor();
  }
};

// The gradient of parameter `name` from rank `rank`'s micro-batch `micro` of step `step`: distinct
// small integers, so sums are exact in fp32.
torch::Tensor input(const std::string& name, const torch::Tensor& like, int rank, int micro, int step = 0) {
  const double base = 10.0 * rank + 100.0 * micro + 1000.0 * step + 5000.0 * (name[0] - 'a');
  return torch::arange(like.numel(), torch::kFloat32).reshape(like.sizes()) + base;
}

// A backward whose gradient for each parameter in `used` is input(name, ...).
void backward(Replica& r, const std::vector<std::string>& used, int rank, int micro, int step = 0) {
  torch::Tensor loss = torch::zeros({});
  for (const auto& name : used) loss = loss + (r.p[name] * input(name, r.p[name], rank, micro, step)).sum();
  loss.backward();
}

torch::Tensor summed(const std::string& name, const torch::Tensor& like, int world, const std::vector<int>& micros,
                     int step = 0) {
  auto out = torch::zeros_like(like);
  for (int rank = 0; rank < world; ++rank)
    for (const int m : micros) out += input(name, like, rank, m, step);
  return out;
}

void expect_grad(const torch::Tensor& p, const torch::Tensor& want, const std::string& what) {
  ASSERT_TRUE(p.grad().defined()) << what;
  EXPECT_TRUE(torch::equal(p.grad(), want)) << what << ": got " << p.grad() << ", want " << want;
}

// Micro-batch 0 accumulates locally; the last one's backward and finish() sum both over the ranks.
TEST(GradReducer, GradientsAreSummedOverTheRanksOnlyAfterTheLastMicroBatch) {
  const std::vector<std::string> all = {"a", "b", "c", "e", "d"};
  const auto errors = on_ranks(2, 1, port(15), [&](Comm& comm) {
    const int rank = comm.rank();
    Replica r;
    GradReducer reducer(*r.blocks, comm);
    reducer.begin_micro(false);
    backward(r, all, rank, 0);
    for (const auto& name : all) expect_grad(r.p[name], input(name, r.p[name], rank, 0), "local " + name);
    reducer.begin_micro(true);
    backward(r, all, rank, 1);
    reducer.finish();
    for (const auto& name : all) expect_grad(r.p[name], summed(name, r.p[name], 2, {0, 1}), "reduced " + name);
  });
  expect_no_errors(errors);
}

// e gets no gradient on any rank, so Block 1 never completes in backward: finish() reduces it, e as
// zeros (every rank takes part in the collective), c summed; d, used in micro-batch 0 alone, keeps
// its accumulated gradient and is summed too.
TEST(GradReducer, ParametersWithoutAGradientInTheLastBackwardAreReducedByFinish) {
  const auto errors = on_ranks(3, 1, port(16), [&](Comm& comm) {
    const int rank = comm.rank();
    Replica r;
    GradReducer reducer(*r.blocks, comm);
    reducer.begin_micro(false);
    backward(r, {"a", "b", "c", "d"}, rank, 0);
    reducer.begin_micro(true);
    backward(r, {"a", "b", "c"}, rank, 1);
    reducer.finish();
    expect_grad(r.p["a"], summed("a", r.p["a"], 3, {0, 1}), "a");
    expect_grad(r.p["c"], summed("c", r.p["c"], 3, {0, 1}), "c");
    expect_grad(r.p["d"], summed("d", r.p["d"], 3, {0}), "d");
    expect_grad(r.p["e"], torch::zeros({2}), "e");
  });
  expect_no_errors(errors);
}

// A data-dependent branch: rank 1's last backward gives c and e no gradient, so Block 1 completes
// on rank 0 (before Block 0: backward runs d, e, c, b, a) and only in finish() on rank 1. Both
// ranks still reduce in one order, so no Block's sum lands in another's (or pairs Blocks of other
// sizes): c and e hold rank 0's gradient plus rank 1's zeros.
TEST(GradReducer, AParameterWithoutAGradientOnOneRankKeepsTheBlocksApart) {
  const auto errors = on_ranks(2, 1, port(19), [&](Comm& comm) {
    const int rank = comm.rank();
    Replica r;
    GradReducer reducer(*r.blocks, comm);
    reducer.begin_micro(true);
    backward(r, rank == 0 ? std::vector<std::string>{"a", "b", "c", "e", "d"} : std::vector<std::string>{"a", "b", "d"},
             rank, 0);
    reducer.finish();
    for (const std::string name : {"a", "b", "d"}) expect_grad(r.p[name], summed(name, r.p[name], 2, {0}), name);
    for (const std::string name : {"c", "e"}) expect_grad(r.p[name], input(name, r.p[name], 0, 0), name);
  });
  expect_no_errors(errors);
}

// A Block reduced in one step is reduced again in the next.
TEST(GradReducer, EveryStepReducesAfresh) {
  const std::vector<std::string> all = {"a", "b", "c", "e", "d"};
  const auto errors = on_ranks(2, 1, port(17), [&](Comm& comm) {
    const int rank = comm.rank();
    Replica r;
    GradReducer reducer(*r.blocks, comm);
    for (int step = 0; step < 3; ++step) {
      r.clear_grads();
      reducer.begin_micro(true);
      backward(r, all, rank, 0, step);
      reducer.finish();
      for (const auto& name : all)
        expect_grad(r.p[name], summed(name, r.p[name], 2, {0}, step), name + " in step " + std::to_string(step));
    }
  });
  expect_no_errors(errors);
}

// The reducer hooks every parameter while it lives and removes its hooks when it goes: a backward
// afterwards accumulates locally and calls nothing of it.
TEST(GradReducer, ItsHooksGoWithIt) {
  const std::vector<std::string> all = {"a", "b", "c", "e", "d"};
  const auto errors = on_ranks(2, 1, port(18), [&](Comm& comm) {
    const int rank = comm.rank();
    Replica r;
    {
      GradReducer reducer(*r.blocks, comm);
      for (const auto& name : all)
        EXPECT_TRUE(torch::autograd::impl::post_acc_grad_hooks(r.p[name]) != nullptr) << name;
      reducer.begin_micro(true);
      backward(r, all, rank, 0);
      reducer.finish();
    }
    for (const auto& name : all) EXPECT_TRUE(torch::autograd::impl::post_acc_grad_hooks(r.p[name]) == nullptr) << name;
    r.clear_grads();
    backward(r, all, rank, 1);
    for (const auto& name : all) expect_grad(r.p[name], input(name, r.p[name], rank, 1), "after the reducer " + name);
  });
  expect_no_errors(errors);
}

}  // namespace
}  // namespace tandem::test
