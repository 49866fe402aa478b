#include "tandem/engine/step_stamps.h"

namespace tandem {

// Note [Step stamps]
// The engine stamps each step as it issues it: in before_block, a Block's forward arrival (before
// it waits for the Block's weights: the host for the CPU update, the compute stream for the upload)
// and its start (after those waits), each micro-batch's forward overwriting them (a forward
// recomputed during backward is not stamped); its backward end when its last gradient of the step
// completes, its D2H and H2D copies around the copy calls, the device side's update around it. On
// a GPU each stamp is a timing event recorded on the stream that runs the work, so it measures the
// stream's time, not the host's; nothing ever waits on one except the trace's reference (taken on
// idle streams). Readers read a step's stamps once its work is complete (the split tuner and the
// trace after synchronising), except the CPU updater's transfer counter, which reads only copies
// whose end has completed (completed_between).
// A Block's forward time runs from its start to the arrival at the next Block: the wait for the
// next Block's upload is not compute. The split solver simulates that wait itself; a forward time
// that included it would hide exactly the waits that more GPU-updated Blocks remove (a 7B Llama on
// an H100 kept 12 of 34 Blocks GPU-updated, where the simulator without those waits predicts 16 to
// be about 6% faster). Where no arrival is stamped, the next Block's start stands in. The same
// stamps serve the split solver's per-Block times (Note [Update split]), the trace (Note [Offload
// trace]) and the placement policy's block seconds (Note [Block placement]).

StepStamps::StepStamps(size_t blocks, bool cuda) {
  const auto timed = [] {
    return std::make_unique<c10::Event>(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
  };
  for (auto* v : {&arrive, &fwd, &bwd, &d2h0, &d2h1, &h2d0, &h2d1}) {
    v->resize(blocks);
    if (cuda)
      for (auto& st : *v) st.ev = timed();
  }
  for (auto* st : {&gpu0, &gpu1, &ref})
    if (cuda) st->ev = timed();
}

void StepStamps::mark(Stamp& st, const c10::Stream* stream) {
  if (st.ev) {
    st.ev->record(*stream);
  } else {
    st.host = host_now();
  }
  st.set = true;
}

double StepStamps::host_now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch).count();
}

void StepStamps::clear() {
  for (auto* v : {&arrive, &fwd, &bwd, &d2h0, &d2h1, &h2d0, &h2d1})
    for (auto& x : *v) x.set = false;
  gpu0.set = gpu1.set = false;
}

std::vector<double> StepStamps::block_seconds() const {
  const size_t n = fwd.size();
  std::vector<double> out(n, 0.0);
  for (size_t i = 1; i + 1 < n; ++i) out[i] = forward_s(i) + backward_s(i);
  return out;
}

double between(const Stamp& a, const Stamp& b) {
  if (!a.set || !b.set) return 0.0;
  if (a.ev) return a.ev->elapsedTime(*b.ev) / 1e3;
  return b.host - a.host;
}

double completed_between(const Stamp& a, const Stamp& b) {
  if (!a.set || !b.set || (b.ev && !b.ev->query())) return 0.0;
  return between(a, b);
}

}  // namespace tandem
