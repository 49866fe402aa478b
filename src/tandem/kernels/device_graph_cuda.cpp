// The CUDA GraphRecorder (compiled only in CUDA builds; see Note [Build layout]): CUDA graphs through
// LibTorch's CUDAGraph, so tensors allocated while recording come from the caching allocator's
// graph pools (Note [Recorded device work]).

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <map>
#include <mutex>

#include "tandem/core/device_graph.h"

namespace tandem {
namespace {

class CudaGraph : public DeviceGraph {
 public:
  at::cuda::CUDAGraph graph;
  void replay() override { graph.replay(); }
};

class CudaGraphRecorder : public GraphRecorder {
 public:
  std::unique_ptr<DeviceGraph> record(int index, const std::function<void()>& work) override {
    const auto device = static_cast<c10::DeviceIndex>(index);
    const c10::cuda::CUDAGuard guard(device);
    const PerDevice& d = per_device(device);
    const auto current = c10::cuda::getCurrentCUDAStream(device);
    current.synchronize();  // the side stream must see what the caller queued (recording is rare)
    auto recorded = std::make_unique<CudaGraph>();
    {
      const c10::cuda::CUDAStreamGuard on_side(d.side);
      work();  // warm-up: lazy initialisation (cuBLAS handles and workspaces) happens outside the recording
      d.side.synchronize();
      // Thread-local: other threads (an HTTP server's, a layer stream's) may use the device meanwhile.
      recorded->graph.capture_begin(d.pool, cudaStreamCaptureModeThreadLocal);
      try {
        work();
      } catch (...) {
        try {
          recorded->graph.capture_end();
        } catch (...) {  // the capture was invalidated: the work's own error is the one to report
        }
        (void)cudaGetLastError();
        throw;
      }
      recorded->graph.capture_end();
    }
    return recorded;
  }

 private:
  struct PerDevice {
    c10::cuda::CUDAStream side;
    c10::MempoolId_t pool;
  };
  // One side stream (its cuBLAS workspace made once) and one memory pool per device.
  const PerDevice& per_device(c10::DeviceIndex device) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = devices_.find(device);
    if (it == devices_.end())
      it = devices_
               .emplace(device, PerDevice{c10::cuda::getStreamFromPool(false, device), at::cuda::graph_pool_handle()})
               .first;
    return it->second;
  }
  std::mutex mutex_;
  std::map<c10::DeviceIndex, PerDevice> devices_;
};

const bool kRegistered = [] {
  register_graph_recorder(std::make_unique<CudaGraphRecorder>());
  return true;
}();

}  // namespace
}  // namespace tandem
