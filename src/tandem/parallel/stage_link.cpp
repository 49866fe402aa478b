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
// Every message is preceded by its header (dtype and shape). A receive that reads the header on
// the host before it posts the payload's receive stops the host there until the neighbour's GPU
// has computed and sent the message, so the host cannot queue the pass's work ahead of its
// arrival. Every micro-batch of a step has one shape (the step's batches are drawn alike; the
// adaptive micro-batch is off with several ranks), so only micro-batch 0's header is read on the
// host: a later micro-batch's header and payload receives are posted at once, the payload's into a
// tensor of the step's shape, and the compute stream waits for them on the device while the host
// queues the pass. Its header is still received first: on a GPU the small header receive is what
// waits for the neighbour, and the payload's (a kernel of many blocks) starts only once the message
// is there, so no large receive spins beside the computation (posting the payload's receive alone
// made a 2-stage 1B pipeline's passes 5-7 % slower on H200s). The later headers are checked against
// the step's shape when the step's sends are waited for; a sender whose later micro-batch has
// another dtype or shape is refused before it sends. Over Gloo the host waits for each header.
namespace {

constexpr int64_t kMaxDims = 6;
constexpr int64_t kHeader = 2 + kMaxDims;  // dtype, ndim, sizes

// Tags (kept for Gloo and the strict link; NCCL matches by order): two per message (header,
// payload), one message per micro-batch and direction.
int header_tag(int64_t micro) { return static_cast<int>(2 * micro); }
int payload_tag(int64_t micro) { return static_cast<int>(2 * micro + 1); }

}  // namespace

StageLink::StageLink(Comm& comm, const PipelineGrid& grid, c10::Device device)
    : comm_(comm),
      down_{comm.stage_link(Comm::Link::kDown), {}, {}, {}},
      up_{comm.stage_link(Comm::Link::kUp), {}, {}, {}},
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
  if (micro == 0) d.sent = Shape{x.scalar_type(), x.sizes().vec()};  // Note [Header per step]
  TANDEM_ASSERT(x.scalar_type() == d.sent.dtype && x.sizes().vec() == d.sent.sizes, "micro-batch ", micro,
                "'s message is ", x.scalar_type(), " ", x.sizes(), " but the step's (micro-batch 0's) is ", d.sent.dtype,
                " ", c10::IntArrayRef(d.sent.sizes), " (Note [Header per step])");
  const c10::Device wire = host_transport_ ? c10::Device(c10::kCPU) : device_;
  auto header = torch::zeros({kHeader}, torch::TensorOptions().dtype(torch::kInt64).pinned_memory(wire.is_cuda()));
  auto h = header.accessor<int64_t, 1>();
  h[0] = static_cast<int64_t>(x.scalar_type());
  h[1] = x.dim();
  for (int64_t i = 0; i < x.dim(); ++i) h[2 + i] = x.size(i);
  // Pinned, so the copy up does not synchronise the compute stream; the send waits for it.
  std::vector<at::Tensor> hv{header.to(wire, /*non_blocking=*/true)}, pv{x.detach().to(wire).contiguous()};
  sends_.push_back(d.link.send(hv, rank, header_tag(micro)));
  sends_.push_back(d.link.send(pv, rank, payload_tag(micro)));
  // Completed sends release their buffers now, not at the step's end.
  while (!sends_.empty() && sends_.front()->isCompleted()) {
    sends_.front()->wait();  // rethrows a failure
    sends_.pop_front();
  }
}

StageLink::Shape StageLink::header_shape(const torch::Tensor& header, int rank) {
  const auto h = header.accessor<int64_t, 1>();
  TANDEM_ASSERT(h[1] >= 0 && h[1] <= kMaxDims, "a stage link header of ", h[1], " dimensions from rank ", rank);
  return Shape{static_cast<c10::ScalarType>(h[0]), std::vector<int64_t>(h.data() + 2, h.data() + 2 + h[1])};
}

void StageLink::expect_step_shape(const Direction& d, const Shape& got, int64_t micro, int rank) {
  TANDEM_ASSERT(got.dtype == d.received.dtype && got.sizes == d.received.sizes, "micro-batch ", micro,
                "'s header from rank ", rank, " says ", got.dtype, " ", c10::IntArrayRef(got.sizes),
                " but the step's (micro-batch 0's) is ", d.received.dtype, " ", c10::IntArrayRef(d.received.sizes),
                " (Note [Header per step])");
}

torch::Tensor StageLink::recv(Direction& d, int rank, int64_t micro, const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  const Comm::Waiting waiting(&comm_, strprintf("micro-batch %lld's %s from rank %d (stage %d) over the stage link",
                                                static_cast<long long>(micro), what, rank, rank / grid_.replicas()));
  TANDEM_ASSERT(micro == 0 || d.received.dtype != c10::ScalarType::Undefined, "micro-batch ", micro, "'s ", what,
                " before micro-batch 0's: the step's shape is unknown");
  const c10::Device wire = host_transport_ ? c10::Device(c10::kCPU) : device_;
  std::optional<c10::StreamGuard> on_side;
  if (side_) on_side.emplace(*side_);
  std::vector<at::Tensor> hv{torch::empty({kHeader}, torch::TensorOptions().dtype(torch::kInt64).device(wire))};
  auto header_work = d.link.recv(hv, rank, header_tag(micro));
  if (micro == 0 || !side_) {  // Note [Header per step]: read on the host
    header_work->wait();
    const Shape got = header_shape(hv[0].to(torch::kCPU), rank);  // the side stream's synchronisation
    if (micro == 0) d.received = got;
    expect_step_shape(d, got, micro, rank);
  } else {
    d.unread.push_back({micro, rank, hv[0]});  // read at the step's end (check_headers)
  }
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

void StageLink::check_headers(Direction& d) {
  if (d.unread.empty()) return;
  std::optional<c10::StreamGuard> on_side;
  if (side_) on_side.emplace(*side_);
  for (const auto& u : d.unread) expect_step_shape(d, header_shape(u.header.to(torch::kCPU), u.rank), u.micro, u.rank);
  d.unread.clear();
}

void StageLink::wait_sends() {
  while (!sends_.empty()) {
    sends_.front()->wait();
    sends_.pop_front();
  }
  check_headers(down_);
  check_headers(up_);
}

double StageLink::take_wait_s() {
  const double s = wait_s_;
  wait_s_ = 0;
  return s;
}

}  // namespace tandem
