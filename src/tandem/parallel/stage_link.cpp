#include "tandem/parallel/stage_link.h"

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>
#include <thread>

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
// neighbours goes one way.
//
// Only a step's first activation (micro-batch 0, also an evaluation's) carries a header, its dtype
// and shape; the step's other activations must have the same (the sender checks), and a gradient has
// the shape of the activation it belongs to. So no receive but the first waits for anything on the
// host: on a GPU each is queued on the compute stream where the pass that needs it is queued, and
// NCCL's receive starts once the work queued before it is done; the compute stream waits for it,
// the host runs on. The first version posted every receive on a side stream as soon as the host
// reached it, to overlap the transfer with the pass before, and read a header for every message:
// its receive kernels then waited on the GPU beside the passes for most of each pass, and the passes
// ran 4-5 % slower (1B in 2 stages, 1F1B, 8 micro-batches of 4 rows, 2 H200s, in one call: stages
// busy 650 and 704 ms a step against 616 and 681 in this order; NCCL_MAX_CTAS=1 did not change it,
// so the cause within NCCL was not isolated). The transfers this order leaves unhidden cost the
// bottleneck stage about 1 ms a step there; the step went from 0.790 to 0.763 s, 0.99x to 1.02x
// torch.distributed.pipelining in the same call (docs/benchmarks.md).
namespace {

constexpr int64_t kMaxDims = 6;
constexpr int64_t kHeader = 2 + kMaxDims;  // dtype, ndim, sizes

// Tags (kept for Gloo and the strict link; NCCL matches by order): two per micro-batch and
// direction (the header, where there is one, and the payload).
int header_tag(int64_t micro) { return static_cast<int>(2 * micro); }
int payload_tag(int64_t micro) { return static_cast<int>(2 * micro + 1); }

std::string describe(const std::vector<int64_t>& sizes, c10::ScalarType dtype) {
  return c10::str(dtype, " ", c10::IntArrayRef(sizes));
}

}  // namespace

StageLink::StageLink(Comm& comm, const PipelineGrid& grid, c10::Device device)
    : comm_(comm),
      down_(comm.stage_link(Comm::Link::kDown)),
      up_(comm.stage_link(Comm::Link::kUp)),
      grid_(grid),
      device_(device),
      host_transport_(down_.getBackendName() != "nccl") {}

StageLink::~StageLink() {
  try {
    receives_.clear();
    wait_sends();
  } catch (...) {  // a peer gone: the step's error is already on its way
  }
}

void StageLink::send_activation(const torch::Tensor& y, int64_t micro) {
  if (micro == 0) sent_ = Shape{y.sizes().vec(), y.scalar_type()};
  TANDEM_ASSERT(y.sizes() == c10::IntArrayRef(sent_.sizes) && y.scalar_type() == sent_.dtype, "micro-batch ", micro,
                "'s stage output is ", describe(y.sizes().vec(), y.scalar_type()), ", micro-batch 0's ",
                describe(sent_.sizes, sent_.dtype), " (a step's micro-batches must have one shape)");
  send(down_, y, grid_.next_rank(), micro, micro == 0);
}

torch::Tensor StageLink::recv_activation(int64_t micro) {
  if (micro == 0) received_ = recv_header(grid_.previous_rank(), micro);
  TANDEM_ASSERT(received_.dtype != c10::ScalarType::Undefined, "micro-batch ", micro,
                "'s activation asked for before micro-batch 0's");
  return recv(down_, grid_.previous_rank(), micro, received_, "activation");
}

void StageLink::send_gradient(const torch::Tensor& g, int64_t micro) {
  TANDEM_ASSERT(g.sizes() == c10::IntArrayRef(received_.sizes) && g.scalar_type() == received_.dtype,
                "the gradient of micro-batch ", micro, "'s input is ", describe(g.sizes().vec(), g.scalar_type()),
                ", its input ", describe(received_.sizes, received_.dtype));
  send(up_, g, grid_.previous_rank(), micro, false);
}

torch::Tensor StageLink::recv_gradient(int64_t micro) { return recv(up_, grid_.next_rank(), micro, sent_, "gradient"); }

void StageLink::send(c10d::Backend& link, const torch::Tensor& x, int rank, int64_t micro, bool with_header) {
  const c10::Device wire = host_transport_ ? c10::Device(c10::kCPU) : device_;
  if (with_header) {
    TANDEM_ASSERT(x.dim() <= kMaxDims, "a stage output of ", x.dim(), " dimensions");
    auto header = torch::zeros({kHeader}, torch::TensorOptions().dtype(torch::kInt64).pinned_memory(wire.is_cuda()));
    auto h = header.accessor<int64_t, 1>();
    h[0] = static_cast<int64_t>(x.scalar_type());
    h[1] = x.dim();
    for (int64_t d = 0; d < x.dim(); ++d) h[2 + d] = x.size(d);
    // Pinned, so the copy up does not synchronise the compute stream; the send waits for it.
    std::vector<at::Tensor> hv{header.to(wire, /*non_blocking=*/true)};
    sends_.push_back(link.send(hv, rank, header_tag(micro)));
  }
  std::vector<at::Tensor> pv{x.detach().to(wire).contiguous()};
  sends_.push_back(link.send(pv, rank, payload_tag(micro)));
  // Completed sends release their buffers now, not at the step's end.
  while (!sends_.empty() && sends_.front()->isCompleted()) {
    sends_.front()->wait();  // rethrows a failure
    sends_.pop_front();
  }
}

StageLink::Shape StageLink::recv_header(int rank, int64_t micro) {
  const auto t0 = std::chrono::steady_clock::now();
  const Comm::Waiting waiting(&comm_,
                              strprintf("micro-batch %lld's activation from rank %d (stage %d) over the stage link",
                                        static_cast<long long>(micro), rank, rank / grid_.replicas()));
  const c10::Device wire = host_transport_ ? c10::Device(c10::kCPU) : device_;
  std::vector<at::Tensor> hv{torch::empty({kHeader}, torch::TensorOptions().dtype(torch::kInt64).device(wire))};
  down_.recv(hv, rank, header_tag(micro))->wait();
  // On a GPU this waits for the compute stream, whose queue is empty at a step's start.
  const auto header = hv[0].to(torch::kCPU);
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto h = header.accessor<int64_t, 1>();
  TANDEM_ASSERT(h[1] >= 0 && h[1] <= kMaxDims, "a stage link header of ", h[1], " dimensions from rank ", rank);
  return Shape{std::vector<int64_t>(h.data() + 2, h.data() + 2 + h[1]), static_cast<c10::ScalarType>(h[0])};
}

torch::Tensor StageLink::recv(c10d::Backend& link, int rank, int64_t micro, const Shape& shape, const char* what) {
  const c10::Device wire = host_transport_ ? c10::Device(c10::kCPU) : device_;
  std::string waited = strprintf("micro-batch %lld's %s from rank %d (stage %d) over the stage link",
                                 static_cast<long long>(micro), what, rank, rank / grid_.replicas());
  std::vector<at::Tensor> pv{torch::empty(shape.sizes, torch::TensorOptions().dtype(shape.dtype).device(wire))};
  if (!host_transport_) {  // the compute stream waits for it, the host does not
    link.recv(pv, rank, payload_tag(micro))->wait();
    // An event behind it on the compute stream, not the Work: that holds the tensor until the step's end.
    c10::impl::VirtualGuardImpl impl(device_.type());
    receives_.push_back({c10::Event(device_.type()), std::move(waited)});
    receives_.back().arrived.record(impl.getStream(device_));
    return pv[0];
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Comm::Waiting waiting(&comm_, std::move(waited));
  link.recv(pv, rank, payload_tag(micro))->wait();
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return pv[0].to(device_);
}

void StageLink::wait_receives() {
  const auto t0 = std::chrono::steady_clock::now();
  for (; !receives_.empty(); receives_.pop_front()) {
    Queued& q = receives_.front();
    if (q.arrived.query()) continue;
    const Comm::Waiting waiting(&comm_, q.what);
    while (!q.arrived.query()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
