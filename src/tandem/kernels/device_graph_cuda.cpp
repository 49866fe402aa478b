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
  c10::MempoolId_t pool{0, 0};  // the caching allocator's pool the recording allocated from
  void replay() override { graph.replay(); }
};

class CudaGraphRecorder : public GraphRecorder {
 public:
  std::unique_ptr<DeviceGraph> record(int index, const std::function<void()>& work,
                                      const DeviceGraph* share_memory_with) override {
    const auto device = static_cast<c10::DeviceIndex>(index);
    const c10::cuda::CUDAGuard guard(device);
    const auto side = side_stream(device);
    // {0, 0}: a pool of its own. A shared pool must have a live recording: the allocator refuses an
    // id whose recordings are all gone while its memory is still held.
    const c10::MempoolId_t pool =
        share_memory_with != nullptr ? static_cast<const CudaGraph*>(share_memory_with)->pool : c10::MempoolId_t{0, 0};
    const auto current = c10::cuda::getCurrentCUDAStream(device);
    current.synchronize();  // the side stream must see what the caller queued (recording is rare)
    auto recorded = std::make_unique<CudaGraph>();
    {
      const c10::cuda::CUDAStreamGuard on_side(side);
      work();  // warm-up: lazy initialisation (cuBLAS handles and workspaces) happens outside the recording
      side.synchronize();
      // Thread-local: other threads (an HTTP server's, a layer stream's) may use the device meanwhile.
      recorded->graph.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
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
    recorded->pool = recorded->graph.pool();
    return recorded;
  }

 private:
  // One side stream per device: its cuBLAS workspace is made once, by the first warm-up.
  c10::cuda::CUDAStream side_stream(c10::DeviceIndex device) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = sides_.find(device);
    if (it == sides_.end()) it = sides_.emplace(device, c10::cuda::getStreamFromPool(false, device)).first;
    return it->second;
  }
  std::mutex mutex_;
  std::map<c10::DeviceIndex, c10::cuda::CUDAStream> sides_;
};

const bool kRegistered = [] {
  register_graph_recorder(std::make_unique<CudaGraphRecorder>());
  return true;
}();

}  // namespace
}  // namespace tandem
