#include "tandem/parallel/stage_link.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"
#include "tandem/parallel/comm.h"

namespace tandem {

// Note [Stage links]
// Under NCCL a rank's sends and receives with one peer in one process group run in the order they
// were issued, each send waiting for its receive (Note [Strict point to point]). 1F1B interleaves a
// stage's sends of activations with its receives of gradients in another order than its neighbour
// does (stage s sends F(i+1) and then receives B(i); stage s+1 sends B(i) and then receives F(i+1)),
// so over one group the two wait for each other: the hang of the first pipeline on two H100s. So
// each direction has a group of its own: over `down` a stage only sends activations to the next
// stage and receives them from the previous one, over `up` the same for gradients, each in micro-
// batch order on both sides whatever the schedule, and every message of a group between two
// neighbours goes one way. On the GPU a receive is issued and awaited on a side stream: NCCL's
// stream waits for the issuing stream's queue, and the header's copy to the host synchronises its
// stream, so on the compute stream every receive would wait for the compute queued before it; on
// the side stream the transfer overlaps that compute and the host waits only for the message. The
// compute stream then waits for the payload alone, and the payload's memory is recorded on it.

// Note [Header per step]
// A receive whose shape is unknown must wait on the host for the header before it can post the
// payload's receive and hand the tensor on: the host stops there until the neighbour's GPU has
// computed and sent the message, and cannot queue the pass's work ahead of its arrival. Every
// micro-batch of a step has one shape (the step's batches are drawn alike; the adaptive
// micro-batch is off with several ranks), so only micro-batch 0 of each direction carries a
// header; a later one is received into a tensor of the step's shape posted at once, the compute
// stream waiting for it on the device while the host queues the pass. A sender whose later
// micro-batch has another dtype or shape is refused before it sends (a bug: the receiver would
// read it as the step's shape). Over Gloo the host still waits for the payload.
namespace {

constexpr int64_t kMaxDims = 6;
constexpr int64_t kHeader = 2 + kMaxDims;  // dtype, ndim, sizes

// Tags (kept for Gloo and the strict link; NCCL matches by order): two per message (header, which
// only micro-batch 0 sends, and payload), one message per micro-batch and direction.
int header_tag(int64_t micro) { return static_cast<int>(2 * micro); }
int payload_tag(int64_t micro) { return static_cast<int>(2 * micro + 1); }

}  // namespace

StageLink::StageLink(Comm& comm, const PipelineGrid& grid, c10::Device device)
    : comm_(comm),
      down_{comm.stage_link(Comm::Link::kDown), {}, {}},
      up_{comm.stage_link(Comm::Link::kUp), {}, {}},
      grid_(grid),
      device_(device),
      host_transport_(down_.link.getBackendName() != "nccl") {
  if (!host_transport_) side_ = c10::impl::VirtualGuardImpl(device_.type()).getStreamFromGlobalPool(device_);
}

StageLink::~StageLink() {
  try {
    wait_sends();
  } catch (...) {  // a peer gone: the step's error is already on its way
  }
}

void StageLink::send_activation(const torch::Tensor& y, int64_t micro) { send(down_, y, grid_.next_rank(), micro); }
torch::Tensor StageLink::recv_activation(int64_t micro) {
  return recv(down_, grid_.previous_rank(), micro, "activation");
}
void StageLink::send_gradient(const torch::Tensor& g, int64_t micro) { send(up_, g, grid_.previous_rank(), micro); }
torch::Tensor StageLink::recv_gradient(int64_t micro) { return recv(up_, grid_.next_rank(), micro, "gradient"); }

void StageLink::send(Direction& d, const torch::Tensor& x, int rank, int64_t micro) {
  TANDEM_ASSERT(x.dim() <= kMaxDims, "a stage output of ", x.dim(), " dimensions");
  const c10::Device wire = host_transport_ ? c10::Device(c10::kCPU) : device_;
  if (micro == 0) {  // Note [Header per step]
    d.sent = Shape{x.scalar_type(), x.sizes().vec()};
    auto header = torch::zeros({kHeader}, torch::TensorOptions().dtype(torch::kInt64).pinned_memory(wire.is_cuda()));
    auto h = header.accessor<int64_t, 1>();
    h[0] = static_cast<int64_t>(x.scalar_type());
    h[1] = x.dim();
    for (int64_t i = 0; i < x.dim(); ++i) h[2 + i] = x.size(i);
    // Pinned, so the copy up does not synchronise the compute stream; the send waits for it.
    std::vector<at::Tensor> hv{header.to(wire, /*non_blocking=*/true)};
    sends_.push_back(d.link.send(hv, rank, header_tag(micro)));
  } else {
    TANDEM_ASSERT(x.scalar_type() == d.sent.dtype && x.sizes().vec() == d.sent.sizes, "micro-batch ", micro,
                  "'s message is ", x.scalar_type(), " ", x.sizes(), " but the step's (micro-batch 0's) is ",
                  d.sent.dtype, " ", c10::IntArrayRef(d.sent.sizes), " (Note [Header per step])");
  }
  std::vector<at::Tensor> pv{x.detach().to(wire).contiguous()};
  sends_.push_back(d.link.send(pv, rank, payload_tag(micro)));
  // Completed sends release their buffers now, not at the step's end.
  while (!sends_.empty() && sends_.front()->isCompleted()) {
    sends_.front()->wait();  // rethrows a failure
    sends_.pop_front();
  }
}

StageLink::Shape StageLink::recv_header(c10d::Backend& link, int rank, int64_t micro, const c10::Device& wire) {
  std::vector<at::Tensor> hv{torch::empty({kHeader}, torch::TensorOptions().dtype(torch::kInt64).device(wire))};
  link.recv(hv, rank, header_tag(micro))->wait();
  const auto header = hv[0].to(torch::kCPU);  // the side stream's synchronisation, not the compute stream's
  const auto h = header.accessor<int64_t, 1>();
  TANDEM_ASSERT(h[1] >= 0 && h[1] <= kMaxDims, "a stage link header of ", h[1], " dimensions from rank ", rank);
  return Shape{static_cast<c10::ScalarType>(h[0]), std::vector<int64_t>(h.data() + 2, h.data() + 2 + h[1])};
}

torch::Tensor StageLink::recv(Direction& d, int rank, int64_t micro, const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  const Comm::Waiting waiting(&comm_, strprintf("micro-batch %lld's %s from rank %d (stage %d) over the stage link",
                                                static_cast<long long>(micro), what, rank, rank / grid_.replicas()));
  const c10::Device wire = host_transport_ ? c10::Device(c10::kCPU) : device_;
  std::optional<c10::StreamGuard> on_side;
  if (side_) on_side.emplace(*side_);
  if (micro == 0) d.received = recv_header(d.link, rank, micro, wire);  // Note [Header per step]
  TANDEM_ASSERT(d.received.dtype != c10::ScalarType::Undefined, "micro-batch ", micro, "'s ", what,
                " before micro-batch 0's: the step's shape is unknown");
  std::vector<at::Tensor> pv{torch::empty(d.received.sizes, torch::TensorOptions().dtype(d.received.dtype).device(wire))};
  auto work = d.link.recv(pv, rank, payload_tag(micro));
  on_side.reset();
  work->wait();  // NCCL: the compute stream waits for the payload; otherwise the host does
  if (side_) {
    c10::impl::VirtualGuardImpl impl(device_.type());
    impl.recordDataPtrOnStream(pv[0].storage().data_ptr(), impl.getStream(device_));
  }
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return pv[0].to(device_);
}

void StageLink::wait_sends() {
  while (!sends_.empty()) {
    sends_.front()->wait();
    sends_.pop_front();
  }
}

double StageLink::take_wait_s() {
  const double s = wait_s_;
  wait_s_ = 0;
  return s;
}

}  // namespace tandem
