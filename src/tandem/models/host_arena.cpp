#include "tandem/models/host_arena.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/Event.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tandem/core/error.h"

namespace tandem {

// Note [Activation host arena]
// LibTorch's pinned allocator rounds every block up to a power of two: a 13B layer's saved tensors
// (84 MB and 226 MB at B=4, T=2048) take 128 and 256 MiB, about 1.35 times their bytes over a
// layer, and the blocks it caches stay pinned after the step has freed them. The tensors activation
// offload saves have a plain life: made in a step's forward, in order, gone by the end of its
// backward. So they are cut from one slab front to back (each rounded to kAlign), and the next step
// starts over at the front once none of them is alive. The first step, with no slab yet, takes its
// tensors from LibTorch's allocator and counts their bytes; when the next step starts, the slab is
// made that size (made again, larger, whenever a step outgrew it) and LibTorch's cached blocks go
// back to the system. A run reserves the plan's estimate before its first step (reserve), so that
// step too is cut from the slab (a first step short of the estimate by a sixteenth or more remakes
// the slab at its size: the plan's host row is the estimate, the slab the step).
// Reuse waits for the device: a tensor is written by an asynchronous copy from the device in the
// forward and read by one in the backward (used_on records each on its stream). The first take() of
// a step makes the writer's stream wait for the previous step's copies before its own copies write
// the slab again; dropping a slab waits for them on the host, once. A tensor outside the slab keeps
// its block until its copies have ended (retired, checked at each take()), so it returns to
// LibTorch's cache unused. A pipeline that always holds some micro-batch's saved tensors never starts
// over: once the slab is full, the rest go outside it, correct and rounded as before.

namespace {

constexpr int64_t kAlign = 512;
constexpr int64_t kSlabRound = int64_t{2} << 20;
int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

bool done(const std::vector<c10::Event>& events) {
  return std::all_of(events.begin(), events.end(), [](const c10::Event& e) { return e.query(); });
}

void wait_on_host(std::vector<c10::Event>& events) {
  for (auto& e : events) e.synchronize();
  events.clear();
}

}  // namespace

struct HostArena::State {
  struct Outside {  // a tensor's block from LibTorch's allocator, with the copies that used it
    at::Tensor block;
    std::vector<c10::Event> uses;
  };

  std::mutex mu;
  Allocator make_slab;
  bool pinned = false;
  at::Tensor slab;
  int64_t capacity = 0, offset = 0;
  int64_t step_bytes = 0;  // asked for since the last start-over, in the slab and outside it
  int64_t live = 0;        // tensors taken and alive
  int64_t fallback_total = 0;
  bool measured = false;  // a step has ended since the arena was made
  std::vector<c10::Event> slab_uses;              // copies in and out of the slab since the last start-over
  std::unordered_map<void*, Outside> outside;     // alive, by data pointer
  std::vector<Outside> retired;                   // freed, their copies perhaps still running

  void drop_finished_retired() {
    retired.erase(std::remove_if(retired.begin(), retired.end(), [](const Outside& o) { return done(o.uses); }),
                  retired.end());
  }

  // With mu held and nothing of the slab in use: a slab of `bytes` in place of the old one.
  void remake(int64_t bytes) {
    wait_on_host(slab_uses);
    for (auto& o : retired) wait_on_host(o.uses);
    retired.clear();
    slab = at::Tensor();
    if (pinned) at::getHostAllocator(at::kCUDA)->empty_cache();
    capacity = round_up(bytes, kSlabRound);
    slab = make_slab(capacity);
    TANDEM_ASSERT(slab.numel() * slab.element_size() >= capacity, "a host slab of ", capacity, " bytes came back with ",
                  slab.numel() * slab.element_size());
  }

  // With mu held and no tensor alive: the slab from its front, made to the step's size first if the
  // step outgrew it or was the first and well short of a reserved slab.
  void start_over(const std::optional<c10::Stream>& writer) {
    const bool short_first = !measured && capacity - step_bytes > capacity / 16;
    if (step_bytes > capacity || short_first) remake(step_bytes);
    measured = true;
    if (writer)
      for (auto& e : slab_uses) writer->wait(e);
    slab_uses.clear();
    offset = 0;
    step_bytes = 0;
  }
};

HostArena::HostArena(Allocator slab, bool pinned) : state_(std::make_shared<State>()) {
  state_->make_slab = std::move(slab);
  state_->pinned = pinned;
}

at::Tensor HostArena::take(at::IntArrayRef sizes, at::IntArrayRef strides, at::ScalarType dtype,
                           const std::optional<c10::Stream>& writer) {
  State& s = *state_;
  const std::lock_guard<std::mutex> lock(s.mu);
  s.drop_finished_retired();
  if (s.live == 0 && s.step_bytes > 0) s.start_over(writer);
  const auto bytes = static_cast<int64_t>(at::detail::computeStorageNbytes(sizes, strides, c10::elementSize(dtype)));
  const int64_t aligned = round_up(std::max<int64_t>(bytes, 1), kAlign);
  s.step_bytes += aligned;
  ++s.live;
  const auto options = at::TensorOptions().dtype(dtype).device(at::kCPU);
  std::shared_ptr<State> state = state_;
  if (s.offset + aligned <= s.capacity) {
    void* p = static_cast<uint8_t*>(s.slab.data_ptr()) + s.offset;
    s.offset += aligned;
    return torch::from_blob(
        p, sizes, strides,
        [state](void*) {
          const std::lock_guard<std::mutex> l(state->mu);
          --state->live;
        },
        options);
  }
  at::Tensor block = at::empty_strided(sizes, strides, options.pinned_memory(s.pinned));
  void* p = block.data_ptr();
  s.outside.emplace(p, State::Outside{std::move(block), {}});
  s.fallback_total += bytes;
  return torch::from_blob(
      p, sizes, strides,
      [state](void* q) {
        const std::lock_guard<std::mutex> l(state->mu);
        --state->live;
        auto it = state->outside.find(q);
        if (it == state->outside.end()) return;
        state->retired.push_back(std::move(it->second));
        state->outside.erase(it);
      },
      options);
}

void HostArena::reserve(int64_t bytes) {
  const std::lock_guard<std::mutex> lock(state_->mu);
  if (bytes <= state_->capacity) return;
  TANDEM_ASSERT(state_->offset == 0 && state_->live == 0, "reserve() after tensors were taken");
  state_->remake(bytes);
}

void HostArena::used_on(const at::Tensor& t, const c10::Stream& stream) {
  c10::Event e(stream.device_type());
  e.record(stream);
  const std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->outside.find(t.data_ptr());
  if (it != state_->outside.end())
    it->second.uses.push_back(std::move(e));
  else
    state_->slab_uses.push_back(std::move(e));
}

int64_t HostArena::capacity() const {
  const std::lock_guard<std::mutex> lock(state_->mu);
  return state_->capacity;
}

int64_t HostArena::fallback_bytes() const {
  const std::lock_guard<std::mutex> lock(state_->mu);
  return state_->fallback_total;
}

int64_t HostArena::live() const {
  const std::lock_guard<std::mutex> lock(state_->mu);
  return state_->live;
}

}  // namespace tandem
