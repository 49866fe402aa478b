#include "tandem/engine/transfer_streams.h"

namespace tandem {

TransferStreams::TransferStreams(c10::Device d, size_t blocks)
    : device(d), d2h(impl.getStreamFromGlobalPool(d, false)), h2d(impl.getStreamFromGlobalPool(d, false)) {
  const auto timed = [] {
    return std::make_unique<c10::Event>(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
  };
  for (size_t i = 0; i < blocks; ++i) {
    grad_ready.push_back(timed());
    landed.push_back(timed());
    uploaded.push_back(timed());
  }
}

void TransferStreams::synchronize() const {
  impl.synchronizeStream(compute());
  impl.synchronizeStream(d2h);
  impl.synchronizeStream(h2d);
}

}  // namespace tandem
