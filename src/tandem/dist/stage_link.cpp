#include "tandem/dist/stage_link.h"

#include <chrono>

#include "tandem/core/error.h"

namespace tandem {
namespace {

constexpr int64_t kMaxDims = 6;
constexpr int64_t kHeader = 2 + kMaxDims;  // dtype, ndim, sizes

// Tags: two per message (header, payload).
int header_tag(int tag) { return 2 * tag; }
int payload_tag(int tag) { return 2 * tag + 1; }

}  // namespace

StageLink::StageLink(c10d::Backend& link, c10::Device device)
    : link_(link), device_(device), host_transport_(link.getBackendName() != "nccl") {}

StageLink::~StageLink() {
  try {
    wait_sends();
  } catch (...) {  // a peer gone: the step's error is already on its way
  }
}

void StageLink::send(const torch::Tensor& x, int rank, int tag) {
  TANDEM_ASSERT(x.dim() <= kMaxDims, "a stage output of ", x.dim(), " dimensions");
  const c10::Device wire = host_transport_ ? c10::Device(c10::kCPU) : device_;
  auto header = torch::zeros({kHeader}, torch::TensorOptions().dtype(torch::kInt64));
  auto h = header.accessor<int64_t, 1>();
  h[0] = static_cast<int64_t>(x.scalar_type());
  h[1] = x.dim();
  for (int64_t d = 0; d < x.dim(); ++d) h[2 + d] = x.size(d);
  std::vector<at::Tensor> hv{header.to(wire)}, pv{x.detach().to(wire).contiguous()};
  sends_.push_back(link_.send(hv, rank, header_tag(tag)));
  sends_.push_back(link_.send(pv, rank, payload_tag(tag)));
  in_flight_.push_back(hv[0]);
  in_flight_.push_back(pv[0]);
}

torch::Tensor StageLink::recv(int rank, int tag) {
  const auto t0 = std::chrono::steady_clock::now();
  const c10::Device wire = host_transport_ ? c10::Device(c10::kCPU) : device_;
  std::vector<at::Tensor> hv{torch::empty({kHeader}, torch::TensorOptions().dtype(torch::kInt64).device(wire))};
  link_.recv(hv, rank, header_tag(tag))->wait();
  const auto header = hv[0].cpu();
  const auto h = header.accessor<int64_t, 1>();
  std::vector<int64_t> sizes(h.data() + 2, h.data() + 2 + h[1]);
  std::vector<at::Tensor> pv{
      torch::empty(sizes, torch::TensorOptions().dtype(static_cast<c10::ScalarType>(h[0])).device(wire))};
  link_.recv(pv, rank, payload_tag(tag))->wait();
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return pv[0].to(device_);
}

void StageLink::wait_sends() {
  for (auto& w : sends_) w->wait();
  sends_.clear();
  in_flight_.clear();
}

double StageLink::take_wait_s() {
  const double s = wait_s_;
  wait_s_ = 0;
  return s;
}

}  // namespace tandem
