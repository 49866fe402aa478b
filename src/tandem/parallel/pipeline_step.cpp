#include "tandem/parallel/pipeline_step.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <chrono>

#include "tandem/core/error.h"
#include "tandem/models/autocast.h"
#include "tandem/models/model.h"
#include "tandem/parallel/comm.h"
#include "tandem/parallel/stage_link.h"

namespace tandem {
namespace {

// The wall clock, which the processes of a host (and NTP-synchronised hosts) share.
double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

PipelineStep::PipelineStep(Model& model, const PipelineGrid& grid, StageLink& link, size_t first, size_t end,
                           PipelineSchedule schedule, Precision precision, c10::Device device)
    : model_(model),
      grid_(grid),
      link_(link),
      first_(first),
      end_(end),
      schedule_(schedule),
      precision_(precision),
      device_(device) {}

// Note [Pipeline pass timing]
// On the CPU a pass's work is done when its call returns, so the host's clock times it. On a GPU
// the host only queues the work and runs ahead until it must wait for a neighbour's message, so the
// host's view makes every stage look idle most of the step (a 65 % "bubble" for 1F1B's 11 % on two
// GPUs). There each pass records a timing event on the compute stream at its start and end, and
// the step's times are read from them once the step's host synchronisation has made them complete.
// A pass starts once its message has arrived on the compute stream (the stream's wait for it is
// idle time), so its span is its computation; the section runs from the first pass's start to the
// last one's end on the GPU, and the wait is the section's rest. The wall-clock positions (for the trace)
// are the first pass's host start plus the events' offsets from it.
torch::Tensor PipelineStep::run(const std::vector<Batch>& batches,
                                const std::function<torch::Tensor(const torch::Tensor&, int64_t)>& scaled,
                                const std::function<void(bool)>& before_backward) {
  const auto t0 = std::chrono::steady_clock::now();
  link_.take_wait_s();
  const auto m = static_cast<int64_t>(batches.size());
  std::vector<InFlight> flight(batches.size());
  torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device_));
  times_.passes.clear();
  pass_events_.clear();
  const bool gpu = device_.is_cuda();
  c10::impl::VirtualGuardImpl impl(device_.type());
  const auto record = [&](c10::Event& e) { e.record(impl.getStream(device_)); };
  for (const PipelinePass& pass : pipeline_passes(schedule_, grid_.stage(), grid_.stages(), m)) {
    InFlight& f = flight[static_cast<size_t>(pass.micro)];
    const double start = wall_seconds();
    if (gpu)  // the start is recorded once the pass's message has arrived (begin_compute)
      pass_events_.emplace_back(c10::Event(device_.type(), c10::EventFlag::BACKEND_DEFAULT),
                                c10::Event(device_.type(), c10::EventFlag::BACKEND_DEFAULT));
    if (pass.kind == PipelinePass::Kind::kForward) {
      forward(batches[static_cast<size_t>(pass.micro)], pass.micro, f, scaled);
    } else {
      before_backward(pass.micro + 1 == m);
      if (f.loss.defined()) loss_sum += f.loss.detach();
      backward(pass.micro, f);
      f = InFlight{};  // the micro-batch's activations are released
    }
    if (gpu) record(pass_events_.back().second);
    times_.passes.emplace_back(start, wall_seconds());
  }
  link_.wait_receives();
  link_.wait_sends();
  times_.wait_s = link_.take_wait_s();
  times_.section_s = seconds_since(t0);
  return loss_sum;
}

void PipelineStep::begin_compute() {
  if (pass_events_.empty()) return;
  c10::impl::VirtualGuardImpl impl(device_.type());
  pass_events_.back().first.record(impl.getStream(device_));
}

const StageTimes& PipelineStep::last_times() {
  if (!pass_events_.empty()) time_passes_on_device();
  return times_;
}

// Note [Pipeline pass timing]: the step's times from its passes' events.
void PipelineStep::time_passes_on_device() {
  const auto events = std::move(pass_events_);
  pass_events_.clear();
  if (times_.passes.size() != events.size()) return;
  const c10::Event& first = events.front().first;
  const double host0 = times_.passes.front().first;
  std::vector<std::pair<double, double>> passes;
  double busy = 0, end = 0;
  try {
    for (const auto& [start, stop] : events) {
      const double a = first.elapsedTime(start) / 1e3, b = first.elapsedTime(stop) / 1e3;
      passes.emplace_back(host0 + a, host0 + b);
      busy += b - a;
      end = std::max(end, b);
    }
  } catch (const c10::Error&) {  // an event the step never reached (it failed part-way): the host's times stay
    return;
  }
  times_.passes = std::move(passes);
  times_.section_s = end;
  times_.wait_s = std::max(0.0, end - busy);
}

// A forward of micro-batch `micro`: the first stage embeds its inputs, the others take the previous
// stage's activation as a leaf whose gradient goes back; the last stage keeps the loss and the
// tensor its backward starts from, the others send their output on.
void PipelineStep::forward(const Batch& b, int64_t micro, InFlight& f,
                           const std::function<torch::Tensor(const torch::Tensor&, int64_t)>& scaled) {
  torch::Tensor x = b.inputs;
  if (!grid_.first_stage()) {
    x = link_.recv_activation(micro);
    if (x.is_floating_point()) x.requires_grad_(true);
  }
  begin_compute();
  f.input = x;
  AutocastGuard ac(device_.type(), precision_);
  torch::Tensor y = model_.forward_blocks(x, first_, end_);
  // Each stage's MoE layers add their share of the balance loss (Model::balance_loss); its
  // gradient stays within the stage, its value joins the loss the step reports.
  const torch::Tensor balance = model_.balance_loss(first_, end_, device_);
  if (grid_.last_stage()) {
    const torch::Tensor ce = model_.cross_entropy(y, b.targets);
    f.loss = balance.defined() ? ce + balance : ce;
    f.output = scaled(f.loss, micro);
    return;
  }
  link_.send_activation(y, micro);
  f.output = y;
  if (balance.defined()) {
    f.loss = balance;
    f.balance = scaled(balance, micro);
  }
}

// The backward of micro-batch `micro`: from the scaled loss on the last stage, else from the next
// stage's gradient of this stage's output; the gradient of this stage's input goes back.
void PipelineStep::backward(int64_t micro, InFlight& f) {
  if (grid_.last_stage()) {
    begin_compute();
    f.output.backward();
  } else {
    const torch::Tensor g = link_.recv_gradient(micro);
    begin_compute();
    if (f.balance.defined())
      torch::autograd::backward({f.output, f.balance}, {g.to(f.output.scalar_type()), torch::ones_like(f.balance)});
    else
      torch::autograd::backward({f.output}, {g.to(f.output.scalar_type())});
  }
  if (grid_.first_stage()) return;
  TANDEM_ASSERT(f.input.grad().defined(), "stage ", grid_.stage(), ": no gradient reached its input");
  link_.send_gradient(f.input.grad(), micro);
}

torch::Tensor pipeline_global_norm(Comm& comm, const torch::Tensor& stage_norm) {
  std::vector<at::Tensor> sq{stage_norm.to(torch::kFloat32).square().reshape({1})};
  comm.world_device_group().allreduce(sq)->wait();
  return (sq[0] / double(comm.replicas())).sqrt().squeeze();
}

torch::Tensor PipelineStep::evaluate(const std::vector<Batch>& batches) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device_));
  for (size_t i = 0; i < batches.size(); ++i) {
    const auto micro = static_cast<int64_t>(i);
    torch::Tensor x = grid_.first_stage() ? batches[i].inputs : link_.recv_activation(micro);
    AutocastGuard ac(device_.type(), precision_);
    torch::Tensor y = model_.forward_blocks(x, first_, end_);
    const torch::Tensor balance = model_.balance_loss(first_, end_, device_);
    if (balance.defined()) loss_sum += balance.detach();
    if (grid_.last_stage())
      loss_sum += model_.cross_entropy(y, batches[i].targets).detach();
    else
      link_.send_activation(y, micro);
  }
  link_.wait_receives();
  link_.wait_sends();
  link_.take_wait_s();
  return loss_sum;
}

}  // namespace tandem
