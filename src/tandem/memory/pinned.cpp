#include "tandem/memory/pinned.h"

#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/strings.h"

namespace tandem {

torch::Tensor host_tensor(int64_t n, torch::ScalarType dtype, bool pin) {
  auto* acc = pin ? accelerator() : nullptr;
  if (acc == nullptr) return torch::empty({n}, torch::TensorOptions().dtype(dtype));
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * c10::elementSize(dtype);
  void* p = acc->host_alloc_pinned(bytes);
  TANDEM_CHECK(p != nullptr, "could not pin ", strprintf("%.2f GiB", double(bytes) / (1 << 30)),
               " of host memory for the offload engine: the host is short of lockable memory; set "
               "offload.pin_memory=false, or lower the host tier (optim.state_dtype=bf16, offload.host_ring) as "
               "`tandem inspect --plan` shows");
  return torch::from_blob(
      p, {n}, [acc](void* q) { acc->host_free_pinned(q); }, torch::TensorOptions().dtype(dtype));
}

}  // namespace tandem
