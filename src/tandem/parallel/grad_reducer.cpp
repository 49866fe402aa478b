#include "tandem/parallel/grad_reducer.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "tandem/core/error.h"

namespace tandem {

// Note [Gradient reducer]
// The engine-less path keeps fp32 parameters whose .grad autograd accumulates. A post-accumulate
// hook per parameter counts down its Block in the last micro-batch's backward; when the Block is
// complete its gradients go to one coalesced all-reduce (sum) on the step loop's device group,
// queued behind the Block's backward on the current stream, while backward goes on with the
// earlier Blocks (Note [Data-parallel engine] does the same inside the offload engine). Every
// rank issues the Blocks' all-reduces in one order, from the last Block down: a Block complete
// before a later one waits for it. Collectives pair up by their order, so a parameter that gets a
// gradient on one rank and none on another (a data-dependent branch) must not let the ranks
// reduce in different orders: that would sum one Block's gradients into another's. finish()
// reduces what never completed, in the same order (parameters without a gradient get zeros, as
// every rank must take part), and makes the current stream wait for every reduction (NCCL) or
// waits on the host (Gloo).
// The ranks' losses are weighted by their share of the global batch, so the sum is its gradient.

namespace {

struct ReadyHook : torch::autograd::PostAccumulateGradHook {
  std::function<void()> fn;
  explicit ReadyHook(std::function<void()> f) : fn(std::move(f)) {}
  void operator()(const torch::autograd::Variable&) override { fn(); }
};

}  // namespace

GradReducer::GradReducer(BlockSequence& model, Comm& comm) : comm_(comm) {
  for (size_t i = 0; i < model.block_count(); ++i) {
    std::vector<torch::Tensor> ps;
    for (auto& [name, p] : model.block_parameters(i)) {
      torch::autograd::impl::set_post_acc_grad_hooks(p, std::make_unique<ReadyHook>([this, i] { on_param_ready(i); }));
      ps.push_back(p);
    }
    params_.push_back(std::move(ps));
  }
  remaining_.assign(params_.size(), 0);
  ready_.assign(params_.size(), false);
  next_ = static_cast<int64_t>(params_.size()) - 1;
  work_.resize(params_.size());
}

GradReducer::~GradReducer() {
  for (auto& ps : params_)
    for (auto& p : ps) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
}

void GradReducer::begin_micro(bool last) {
  last_ = last;
  for (size_t i = 0; i < params_.size(); ++i) {
    remaining_[i] = static_cast<int64_t>(params_[i].size());
    if (last) ready_[i] = params_[i].empty();  // nothing to wait for
  }
  if (last) next_ = static_cast<int64_t>(params_.size()) - 1;
}

void GradReducer::on_param_ready(size_t block) {
  if (--remaining_[block] != 0 || !last_) return;
  ready_[block] = true;
  while (next_ >= 0 && ready_[static_cast<size_t>(next_)]) reduce(static_cast<size_t>(next_--));
}

void GradReducer::reduce(size_t i) {
  std::vector<at::Tensor> grads;
  for (auto& p : params_[i]) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad());
  }
  if (grads.empty()) return;
  work_[i] = comm_.device_group(0).allreduce_coalesced(grads);
}

void GradReducer::finish() {
  while (next_ >= 0) reduce(static_cast<size_t>(next_--));
  const Comm::Waiting waiting(&comm_, "the gradient reduction over the data-parallel replicas");
  for (auto& w : work_) {
    if (w) w->wait();
    w.reset();
  }
}

}  // namespace tandem
