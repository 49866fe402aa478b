#include "tandem/models/activation_offload.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <memory>

namespace tandem {

// Note [Activation offload]
// With checkpointing a decoder layer keeps only its input and runs its forward again in backward;
// without it, everything the layer's ops save stays on the GPU until its backward. Offloading
// trades that recompute (or that memory) for PCIe traffic: the chosen layers run their forward
// normally, and each tensor autograd saves inside them (ActivationOffload::takes) is copied to
// pinned host memory on a copy stream of its own as soon as the compute stream has made it, its
// device memory then free for the allocator once the copy ends (the storage is recorded on the copy
// stream); its backward copies it back on the compute stream, after that copy's event. The values
// are the same bytes, so gradients are bit for bit those of keeping the tensors
// (ActivationOffload.GradientsEqualKeepingTheActivations). A layer's saved tensors are several times
// its input (about 1.35 GB a layer at 13B, B=4, T=2048 against 84 MB), so it pays only for the layers
// whose copies fit beside the forward's compute on the link: the first layers, whose tensors
// come back last in the backward.
//
// LibTorch calls saved-tensor hooks only through its autograd engine's
// get_default_saved_variable_hooks, which the base engine answers with none and torch's Python
// engine with the Python hooks. tandem's engine (install_autograd_engine) is the base engine with
// that one method answering the ActivationOffloadScope active on the calling thread; a saved tensor
// outside every scope costs one thread-local read. Inside Python torch's engine stays the default,
// so the feature is refused there (activation_offload_available).

namespace {

thread_local const ActivationOffload* t_scope = nullptr;

// A parameter's autocast copy: made by a cast whose input is a leaf's gradient accumulator.
bool is_parameter_cast(const at::Tensor& t) {
  const auto& fn = t.grad_fn();
  if (!fn || fn->num_inputs() != 1 || fn->next_edges().size() != 1) return false;
  const auto& e = fn->next_edge(0);
  return e.function && dynamic_cast<torch::autograd::AccumulateGrad*>(e.function.get()) != nullptr &&
         fn->name().find("ToCopyBackward") != std::string::npos;
}

class HostSavedTensor final : public torch::autograd::SavedVariableHooks {
 public:
  explicit HostSavedTensor(const ActivationOffload& offload) : offload_(offload) {}

  void call_pack_hook(const at::Tensor& t) override {
    if (!offload_.takes(t)) {
      kept_ = t;
      return;
    }
    device_ = t.device();
    // The saved tensor's own layout where it is dense (a transposed view stays transposed), so its
    // backward runs the kernels it would have run; otherwise contiguous.
    const auto host_options = t.options().device(at::kCPU).pinned_memory(t.is_cuda());
    host_ = t.is_non_overlapping_and_dense() ? at::empty_strided(t.sizes(), t.strides(), host_options)
                                             : at::empty(t.sizes(), host_options);
    if (t.is_cuda()) {
      const c10::impl::VirtualGuardImpl guard(device_.type());
      const c10::Stream copy = offload_.copy_stream(device_);
      c10::Event made(device_.type());
      made.record(guard.getStream(device_));
      copy.wait(made);
      {
        const c10::StreamGuard on_copy(copy);
        host_.copy_(t, /*non_blocking=*/true);
      }
      guard.recordDataPtrOnStream(t.storage().data_ptr(), copy);
      copied_.emplace(device_.type());
      copied_->record(copy);
    } else {
      host_.copy_(t);
    }
    offload_.count(static_cast<int64_t>(t.numel() * t.element_size()));
  }

  at::Tensor call_unpack_hook() override {
    if (kept_.defined()) return kept_;
    if (!device_.is_cuda()) return host_;
    const c10::impl::VirtualGuardImpl guard(device_.type());
    guard.getStream(device_).wait(*copied_);
    return host_.to(device_, /*non_blocking=*/true);
  }

 private:
  const ActivationOffload& offload_;
  at::Tensor kept_;  // not taken: saved as autograd would
  at::Tensor host_;  // taken: its copy on the host
  c10::Device device_{at::kCPU};
  std::optional<c10::Event> copied_;
};

struct TandemEngine final : torch::autograd::Engine {
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    if (t_scope == nullptr) return nullptr;
    return std::make_unique<HostSavedTensor>(*t_scope);
  }
};

torch::autograd::Engine& tandem_engine() {
  // Never destroyed: its device threads may still wait on their queues when the process exits.
  static auto* engine = new TandemEngine();
  return *engine;
}

}  // namespace

void install_autograd_engine() { torch::autograd::set_default_engine_stub(&tandem_engine); }

bool activation_offload_available() { return &torch::autograd::Engine::get_default_engine() == &tandem_engine(); }

bool ActivationOffload::takes(const at::Tensor& t) const {
  if (!t.defined() || !t.is_floating_point()) return false;
  if (!(t.is_cuda() || (options_.host_tensors && t.is_cpu()))) return false;
  if (static_cast<int64_t>(t.numel() * t.element_size()) < options_.min_bytes) return false;
  if (t.is_leaf() && t.requires_grad()) return false;  // a parameter
  return !is_parameter_cast(t);
}

c10::Stream ActivationOffload::copy_stream(const c10::Device& device) const {
  const std::lock_guard<std::mutex> lock(mu_);
  if (!stream_ || stream_->device() != device)
    stream_ = c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device, /*isHighPriority=*/false);
  return *stream_;
}

ActivationOffloadScope::ActivationOffloadScope(const ActivationOffload& offload) : outer_(t_scope) {
  t_scope = &offload;
}

ActivationOffloadScope::~ActivationOffloadScope() { t_scope = outer_; }

}  // namespace tandem
