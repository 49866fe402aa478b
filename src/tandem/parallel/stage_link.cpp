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
// Measured alternatives (1B in 2 stages, 1F1B, 8 micro-batches, 2 H200s, against
// torch.distributed.pipelining in the same call): a header only on a step's first message, the
// later payloads' receives posted at once so the host never waits for a header, made the passes
// 5-7 % slower (the payload's receive, a kernel of many blocks, spins beside the computation until
// the neighbour sends): 0.946x the peer. Every header received but only the first read on the host
// (the small header receive doing the waiting) gave 0.993x against this design's 0.990-0.991x:
// within the calls' noise, so the host's wait for a header is not where the pipeline's last
// percent goes.
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
      down_(comm.stage_link(Comm::Link::kDown)),
      up_(comm.stage_link(Comm::Link::kUp)),
      grid_(grid),
      device_(device),
      host_transport_(down_.getBackendName() != "nccl") {
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

void StageLink::send(c10d::Backend& link, const torch::Tensor& x, int rank, int64_t micro) {
  TANDEM_ASSERT(x.dim() <= kMaxDims, "a stage output of ", x.dim(), " dimensions");
  const c10::Device wire = host_transport_ ? c10::Device(c10::kCPU) : device_;
  auto header = torch::zeros({kHeader}, torch::TensorOptions().dtype(torch::kInt64).pinned_memory(wire.is_cuda()));
  auto h = header.accessor<int64_t, 1>();
  h[0] = static_cast<int64_t>(x.scalar_type());
  h[1] = x.dim();
  for (int64_t d = 0; d < x.dim(); ++d) h[2 + d] = x.size(d);
  // Pinned, so the copy up does not synchronise the compute stream; the send waits for it.
  std::vector<at::Tensor> hv{header.to(wire, /*non_blocking=*/true)}, pv{x.detach().to(wire).contiguous()};
  sends_.push_back(link.send(hv, rank, header_tag(micro)));
  sends_.push_back(link.send(pv, rank, payload_tag(micro)));
  // Completed sends release their buffers now, not at the step's end.
  while (!sends_.empty() && sends_.front()->isCompleted()) {
    sends_.front()->wait();  // rethrows a failure
    sends_.pop_front();
  }
}

torch::Tensor StageLink::recv(c10d::Backend& link, int rank, int64_t micro, const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  const Comm::Waiting waiting(&comm_, strprintf("micro-batch %lld's %s from rank %d (stage %d) over the stage link",
                                                static_cast<long long>(micro), what, rank, rank / grid_.replicas()));
  const c10::Device wire = host_transport_ ? c10::Device(c10::kCPU) : device_;
  std::optional<c10::StreamGuard> on_side;
  if (side_) on_side.emplace(*side_);
  std::vector<at::Tensor> hv{torch::empty({kHeader}, torch::TensorOptions().dtype(torch::kInt64).device(wire))};
  link.recv(hv, rank, header_tag(micro))->wait();
  const auto header = hv[0].to(torch::kCPU);  // the side stream's synchronisation, not the compute stream's
  const auto h = header.accessor<int64_t, 1>();
  TANDEM_ASSERT(h[1] >= 0 && h[1] <= kMaxDims, "a stage link header of ", h[1], " dimensions from rank ", rank);
  std::vector<int64_t> sizes(h.data() + 2, h.data() + 2 + h[1]);
  std::vector<at::Tensor> pv{
      torch::empty(sizes, torch::TensorOptions().dtype(static_cast<c10::ScalarType>(h[0])).device(wire))};
  auto work = link.recv(pv, rank, payload_tag(micro));
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
