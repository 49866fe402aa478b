// The NCCL backend, in a CUDA-only source (ProcessGroupNCCL.hpp needs the CUDA headers).
#include "tandem/parallel/comm.h"

#ifdef TANDEM_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "tandem/core/error.h"

namespace tandem {

c10::intrusive_ptr<c10d::Backend> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
                                                  int cuda_device, std::chrono::milliseconds timeout) {
#ifdef TANDEM_WITH_NCCL
  keep_flight_recorder_off();
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, opts);
  // Bind the communicator to this rank's GPU now, so the first collective does not guess it.
  pg->setBoundDeviceId(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(cuda_device)));
  return pg;
#else
  TANDEM_FAIL(
      "this build of tandem has no NCCL, so it cannot reduce GPU tensors across processes; build with the "
      "NCCL headers (nccl.h) present, or set dist.backend=gloo");
#endif
}

}  // namespace tandem
