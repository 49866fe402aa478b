#include "tandem/models/activation_offload.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <c10/util/strides.h>

#include <memory>
#include <mutex>
#include <sstream>

namespace tandem {

// Note [Activation offload]
// With checkpointing a decoder layer keeps only its input and runs its forward again in backward;
// without it, everything the layer's ops save stays on the GPU until its backward. Offloading
// trades that recompute (or that memory) for PCIe traffic: the chosen layers run their forward
// normally, and each tensor autograd saves inside them (ActivationOffload::takes) is copied to
// pinned host memory (cut from a step's slab, Note [Activation host arena]) on a copy stream of its
// own as soon as the compute stream has made it, its device memory then free for the allocator once
// the copy ends (the storage is recorded on the copy stream); its backward copies it back on the compute stream, after that copy's event. The values
// are the same bytes, so gradients are bit for bit those of keeping the tensors
// (ActivationOffload.GradientsEqualKeepingTheActivations). A layer's saved tensors are several times
// its input (about 2.1 GB a layer at 13B, B=4, T=2048 against 168 MB: 31.02 GiB for 16 layers on an
// H200), so it pays only for the layers whose copies fit beside the forward's compute on the link:
// the first layers, whose tensors come back last in the backward.
//
// LibTorch calls saved-tensor hooks only through its autograd engine's
// get_default_saved_variable_hooks, which the base engine answers with none and torch's Python
// engine with the Python hooks. tandem's engine (use_tandem_autograd_engine) is the base engine with
// that one method answering the ActivationOffloadScope active on the calling thread; a saved tensor
// outside every scope costs one thread-local read. It becomes the default only when a model asks
// for offload and only where the base engine is the default (a C++ program: a process that has run
// a backward on the base engine keeps its idle threads). Inside Python torch's engine stays the
// default, so the feature is refused there (use_tandem_autograd_engine returns false).

// Note [One copy per saved tensor]
// Ops save the same tensor more than once: a layer's normalised input for each of the q, k and v
// products (and gate and up), an RMSNorm's input for its square and its product, the rope tables
// for q and k. Copied each time, a 13B layer sent a quarter more bytes over the link than it holds.
// So a pack first looks among the last kRecent copies of this forward for one of the same storage
// (still alive, so its address cannot have been reused), offset, shape, strides, dtype and version,
// and shares it; the copy back is kept on the device until every sharer has unpacked it.

// Note [Activation prefetch]
// A backward that copied its saved tensors back when it needed them (unpack) would run each copy on
// the compute stream, the kernels waiting behind it: a 13B layer's 2.1 GB at about 55 GB/s is 38
// ms, over three times the 11 ms recompute it replaces. So the copies back run ahead on a stream of their own
// (fetch_stream): each pack enlists its HostCopy under its Block, and the first unpack of Block b
// issues the copies of b's tensors (if not yet issued) and of the offloaded Block before it, which
// the backward reaches next; an unpack then only makes the compute stream wait for its own copy's
// event. The last offloaded Block, which the backward meets first, starts its copies back when the
// forward ends (Model::forward_blocks calls forward_ended), while the backward runs the Blocks after
// it. The device holds at most two offloaded Blocks' tensors beside what it computes (the plan
// counts them).
// A tensor unpacked a second time (a retained graph) is copied again, on the compute stream.

namespace {

thread_local const ActivationOffload* t_scope = nullptr;
thread_local int64_t t_block = 0;

// A parameter seen through casts and views (its autocast copy, its transpose for a matmul, a view
// of either): the walk from the tensor's grad_fn through one-input cast and view nodes ends at a
// leaf's gradient accumulator. Those are on the device for the whole step anyway.
bool is_parameter_derived(const at::Tensor& t) {
  static constexpr const char* kPassThrough[] = {"ToCopyBackward", "TBackward",      "TransposeBackward",
                                                 "ViewBackward",   "PermuteBackward", "ExpandBackward",
                                                 "AliasBackward",  "UnsafeViewBackward"};
  const torch::autograd::Node* fn = t.grad_fn().get();
  for (int depth = 0; fn != nullptr && depth < 6; ++depth) {
    if (dynamic_cast<const torch::autograd::AccumulateGrad*>(fn) != nullptr) return depth > 0;
    if (fn->next_edges().size() != 1) return false;
    const std::string name = fn->name();
    bool through = false;
    for (const char* p : kPassThrough) through = through || name.find(p) != std::string::npos;
    if (!through) return false;
    fn = fn->next_edge(0).function.get();
  }
  return false;
}

// What a host copy is a copy of (Note [One copy per saved tensor]): a tensor's storage while it
// lives, at this place and version, with this dtype and shape.
struct SavedTensorKey {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage{c10::intrusive_ptr<c10::StorageImpl>()};
  int64_t offset = 0, version = 0;
  c10::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes, strides;

  static SavedTensorKey of(const at::Tensor& t) {
    SavedTensorKey k;
    k.storage = t.storage().getWeakStorageImpl();
    k.offset = t.storage_offset();
    k.version = static_cast<int64_t>(t._version());
    k.dtype = t.scalar_type();
    k.sizes = t.sizes().vec();
    k.strides = t.strides().vec();
    return k;
  }
  bool matches(const at::Tensor& t) const {
    const auto alive = storage.lock();
    return alive && alive.get() == t.storage().unsafeGetStorageImpl() && offset == t.storage_offset() &&
           version == static_cast<int64_t>(t._version()) && dtype == t.scalar_type() && t.sizes() == sizes &&
           t.strides() == strides;
  }
};

}  // namespace

struct HostCopy {
  at::Tensor host;                      // the saved tensor's bytes on the host
  c10::Device device{at::kCPU};         // where it came from
  int64_t block = 0;
  std::optional<c10::Event> copied;     // the copy to the host ended (on copy_stream)
  bool fetch_issued = false;
  at::Tensor fetched;                   // its copy back, made on fetch_stream, until unpacked
  std::optional<c10::Event> fetch_done;
  int64_t unpacks_left = 1;             // saved tensors sharing this copy, not yet unpacked
  SavedTensorKey key;                   // what it is a copy of

  bool copies(const at::Tensor& t) const { return key.matches(t); }
};

namespace {

class HostSavedTensor final : public torch::autograd::SavedVariableHooks {
 public:
  HostSavedTensor(const ActivationOffload& offload, int64_t block) : offload_(offload), block_(block) {}

  void call_pack_hook(const at::Tensor& t) override {
    if (!offload_.takes(t)) {
      kept_ = t;
      return;
    }
    copy_ = offload_.shared_copy(t);  // the same tensor saved again: one copy
    if (copy_) return;
    copy_ = std::make_shared<HostCopy>();
    HostCopy& c = *copy_;
    c.device = t.device();
    c.block = block_;
    c.key = SavedTensorKey::of(t);
    // The saved tensor's own layout where it is dense (a transposed view stays transposed), so its
    // backward runs the kernels it would have run; otherwise contiguous.
    const bool dense = t.is_non_overlapping_and_dense();
    const c10::DimVector strides = dense ? c10::DimVector(t.strides()) : c10::contiguous_strides(t.sizes());
    if (t.is_cuda()) {
      const c10::impl::VirtualGuardImpl guard(c.device.type());
      const c10::Stream copy = offload_.copy_stream(c.device);
      c.host = offload_.arena().take(t.sizes(), strides, t.scalar_type(), copy);
      c10::Event made(c.device.type());
      made.record(guard.getStream(c.device));
      copy.wait(made);
      {
        const c10::StreamGuard on_copy(copy);
        c.host.copy_(t, /*non_blocking=*/true);
      }
      guard.recordDataPtrOnStream(t.storage().data_ptr(), copy);
      offload_.arena().used_on(c.host, copy);
      c.copied.emplace(c.device.type());
      c.copied->record(copy);
      offload_.enlist(block_, copy_);
    } else {
      c.host = offload_.arena().take(t.sizes(), strides, t.scalar_type(), std::nullopt);
      c.host.copy_(t);
    }
    offload_.count(t);
    offload_.remember(copy_);
  }

  at::Tensor call_unpack_hook() override {
    if (kept_.defined()) return kept_;
    if (!copy_->device.is_cuda()) return copy_->host;
    return offload_.fetch(*copy_);
  }

 private:
  const ActivationOffload& offload_;
  int64_t block_;
  at::Tensor kept_;                  // not taken: saved as autograd would
  std::shared_ptr<HostCopy> copy_;   // taken
};

struct TandemEngine final : torch::autograd::Engine {
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    if (t_scope == nullptr) return nullptr;
    return std::make_unique<HostSavedTensor>(*t_scope, t_block);
  }

  // LibTorch starts an engine's device threads under one once-flag for the whole process (a static
  // in initialize_device_threads_pool): after the base engine has run a backward on the GPU, a
  // second engine would get none, and its first backward on the GPU fails ("device_ready_queues_"
  // assert). So tandem's engine claims that flag if no engine has, and otherwise starts its own
  // threads, once, before it becomes the default.
  void ensure_device_threads() {
    std::call_once(threads_once_, [this] {
      initialize_device_threads_pool();
      if (device_ready_queues_.empty()) start_device_threads();
    });
  }

 private:
  std::once_flag threads_once_;
};

TandemEngine& tandem_engine_impl() {
  // Never destroyed: its device threads may still wait on their queues when the process exits.
  static auto* engine = new TandemEngine();
  return *engine;
}

torch::autograd::Engine& tandem_engine() { return tandem_engine_impl(); }

}  // namespace

bool use_tandem_autograd_engine() {
  static std::mutex mu;
  const std::lock_guard<std::mutex> lock(mu);
  if (&torch::autograd::Engine::get_default_engine() == &torch::autograd::Engine::get_base_engine()) {
    tandem_engine_impl().ensure_device_threads();
    torch::autograd::set_default_engine_stub(&tandem_engine);
  }
  return &torch::autograd::Engine::get_default_engine() == &tandem_engine();
}

namespace {
HostArena::Allocator default_slab(bool pinned) {
  return [pinned](int64_t bytes) { return at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(pinned)); };
}
}  // namespace

ActivationOffload::ActivationOffload(Options o)
    : options_(std::move(o)),
      arena_(options_.host_slab ? options_.host_slab : default_slab(!options_.host_tensors), !options_.host_tensors) {}

bool ActivationOffload::takes(const at::Tensor& t) const {
  if (!t.defined() || !t.is_floating_point()) return false;
  if (!(t.is_cuda() || (options_.host_tensors && t.is_cpu()))) return false;
  if (static_cast<int64_t>(t.numel() * t.element_size()) < options_.min_bytes) return false;
  if (t.is_leaf() && t.requires_grad()) return false;  // a parameter
  return !is_parameter_derived(t);
}

namespace {
c10::Stream pool_stream(std::optional<c10::Stream>& kept, const c10::Device& device) {
  if (!kept || kept->device() != device)
    kept = c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device, /*isHighPriority=*/false);
  return *kept;
}
}  // namespace

c10::Stream ActivationOffload::copy_stream(const c10::Device& device) const {
  const std::lock_guard<std::mutex> lock(mu_);
  return pool_stream(stream_, device);
}

c10::Stream ActivationOffload::fetch_stream(const c10::Device& device) const {
  const std::lock_guard<std::mutex> lock(mu_);
  return pool_stream(fetch_stream_, device);
}

void ActivationOffload::count(const at::Tensor& t) const {
  const auto bytes = static_cast<int64_t>(t.numel() * t.element_size());
  tensors_.fetch_add(1);
  bytes_.fetch_add(bytes);
  if (!options_.log) return;
  std::ostringstream line;
  line << (t.grad_fn() ? t.grad_fn()->name() : std::string("leaf")) << " " << t.scalar_type() << " " << t.sizes() << " "
       << bytes;
  const std::lock_guard<std::mutex> lock(mu_);
  log_.push_back(line.str());
}

std::vector<std::string> ActivationOffload::saved_log() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return log_;
}

std::shared_ptr<HostCopy> ActivationOffload::shared_copy(const at::Tensor& t) const {
  const std::lock_guard<std::mutex> lock(mu_);
  for (auto it = recent_.rbegin(); it != recent_.rend(); ++it) {
    auto c = it->lock();
    if (c && c->copies(t)) {
      ++c->unpacks_left;
      shared_.fetch_add(1);
      return c;
    }
  }
  return nullptr;
}

void ActivationOffload::remember(const std::shared_ptr<HostCopy>& copy) const {
  const std::lock_guard<std::mutex> lock(mu_);
  recent_.push_back(copy);
  if (recent_.size() > kRecent) recent_.erase(recent_.begin());
}

void ActivationOffload::enlist(int64_t block, const std::shared_ptr<HostCopy>& copy) const {
  const std::lock_guard<std::mutex> lock(mu_);
  waiting_[block].push_back(copy);
}

void ActivationOffload::prefetch_block(int64_t block, bool ahead) const {
  auto it = waiting_.find(block);
  if (it == waiting_.end()) return;
  for (const auto& weak : it->second) {
    const auto c = weak.lock();
    if (!c || c->fetch_issued) continue;
    const c10::Stream fetch = pool_stream(fetch_stream_, c->device);
    fetch.wait(*c->copied);
    {
      const c10::StreamGuard on_fetch(fetch);
      c->fetched = c->host.to(c->device, /*non_blocking=*/true);
    }
    arena_.used_on(c->host, fetch);
    c->fetch_done.emplace(c->device.type());
    c->fetch_done->record(fetch);
    c->fetch_issued = true;
    if (ahead) ahead_.fetch_add(1);
  }
  waiting_.erase(it);
}

void ActivationOffload::forward_ended() const {
  const std::lock_guard<std::mutex> lock(mu_);
  recent_.clear();
  if (!waiting_.empty()) prefetch_block(waiting_.rbegin()->first, true);
}

at::Tensor ActivationOffload::fetch(HostCopy& c) const {
  const c10::impl::VirtualGuardImpl guard(c.device.type());
  const c10::Stream compute = guard.getStream(c.device);
  {
    const std::lock_guard<std::mutex> lock(mu_);
    prefetch_block(c.block, false);
    // The offloaded Block the backward reaches next: the nearest one before this.
    auto before = waiting_.lower_bound(c.block);
    if (before != waiting_.begin()) prefetch_block(std::prev(before)->first, true);
    if (c.fetched.defined()) {
      compute.wait(*c.fetch_done);
      at::Tensor out = c.fetched;
      if (--c.unpacks_left <= 0) c.fetched = at::Tensor();  // the last sharer's unpack
      guard.recordDataPtrOnStream(out.storage().data_ptr(), compute);
      return out;
    }
  }
  compute.wait(*c.copied);  // unpacked again: copied back on the compute stream
  at::Tensor out = c.host.to(c.device, /*non_blocking=*/true);
  arena_.used_on(c.host, compute);
  return out;
}

ActivationOffloadScope::ActivationOffloadScope(const ActivationOffload& offload, int64_t block)
    : outer_(t_scope), outer_block_(t_block) {
  t_scope = &offload;
  t_block = block;
}

ActivationOffloadScope::~ActivationOffloadScope() {
  t_scope = outer_;
  t_block = outer_block_;
}

}  // namespace tandem
