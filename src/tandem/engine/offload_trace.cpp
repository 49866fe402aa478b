#include "tandem/engine/offload_trace.h"

#include <algorithm>

#include "tandem/core/strings.h"

namespace tandem {

namespace {

enum Track { kCompute = 1, kD2h = 2, kH2d = 3, kUpdater = 4 };

}  // namespace

// Note [Offload trace]
// A traced step starts from idle streams (begin_step waits for the previous step's updates and
// synchronises, which the trace's steps pay once) and a reference stamp taken with the host clock.
// The next begin_step waits again and reads every stamp of the step: per Block the forward and
// backward on the compute stream, the D2H and H2D copies on their streams, the GPU updates, and
// the updater thread's CPU updates by the host clock. Chrome's JSON trace format, one track per
// stream and per updater thread; Perfetto and chrome://tracing load it. With telemetry on, the
// sampler's readings around the traced steps (GPU power, utilisation, memory; CPU utilisation)
// become counter tracks ("ph":"C") on the same clock.
OffloadTrace::OffloadTrace(OffloadTraceOptions options, bool cuda)
    : options_(std::move(options)), trace_("tandem offload engine") {
  trace_.name_thread(kCompute, cuda ? "compute stream" : "compute (CPU device)");
  trace_.name_thread(kD2h, "D2H stream (gradients)");
  trace_.name_thread(kH2d, "H2D stream (weights)");
  trace_.name_thread(kUpdater, "CPU updater thread");
}

bool OffloadTrace::traces(int64_t step) const {
  return std::binary_search(options_.steps.begin(), options_.steps.end(), step);
}

void OffloadTrace::start(int64_t step, StepStamps& st, const TransferStreams* streams) {
  if (streams != nullptr) {
    const auto compute = streams->compute();
    st.mark(st.ref, &compute);
    st.ref.ev->synchronize();
  }
  ref_host_ = st.host_now();
  st.ref.host = ref_host_;
  st.ref.set = true;
  st.clear();
  active_ = true;
  step_ = step;
}

void OffloadTrace::finish(const StepStamps& st, const std::vector<BlockStore>& blocks,
                          const std::vector<CpuUpdateSpan>& cpu) {
  active_ = false;
  draw_blocks(st, blocks);
  for (const auto& c : cpu)
    trace_.span(kUpdater, std::string(c.speculative ? "CPU update (speculative) " : "CPU update ") + blocks[c.block].name,
                step_, c.t0 * 1e6, c.t1 * 1e6);
  draw_counters(st);
  write_if_last();
}

void OffloadTrace::draw_blocks(const StepStamps& st, const std::vector<BlockStore>& blocks) {
  const double base_us = ref_host_ * 1e6;
  const auto at_us = [&](const Stamp& x) { return base_us + between(st.ref, x) * 1e6; };
  const auto span = [&](int track, const std::string& name, const Stamp& a, const Stamp& b) {
    if (a.set && b.set) trace_.span(track, name, step_, at_us(a), at_us(b));
  };
  const size_t n = blocks.size();
  for (size_t i = 0; i < n; ++i) {
    const auto& name = blocks[i].name;
    // Note [Step stamps]: a forward ends where the next Block's wait for its weights begins.
    if (st.arrive[i].set && st.fwd[i].set && between(st.arrive[i], st.fwd[i]) > 1e-6)
      span(kCompute, "wait for weights " + name, st.arrive[i], st.fwd[i]);
    if (i + 1 < n)
      span(kCompute, "forward " + name, st.fwd[i], st.arrive[i + 1].set ? st.arrive[i + 1] : st.fwd[i + 1]);
    if (i + 1 == n) span(kCompute, "forward+loss+backward " + name, st.fwd[i], st.bwd[i]);
    if (i + 1 < n) span(kCompute, "backward " + name, st.bwd[i + 1], st.bwd[i]);
    span(kD2h, "grad " + name, st.d2h0[i], st.d2h1[i]);
    span(kH2d, "weights " + name, st.h2d0[i], st.h2d1[i]);
  }
  span(kCompute, "GPU update (fused AdamW)", st.gpu0, st.gpu1);
}

// The sampler's readings from just before the traced step to now, on the stamps' clock.
void OffloadTrace::draw_counters(const StepStamps& st) {
  if (!options_.counters) return;
  const auto to_tp = [&](double host_s) {
    return st.epoch +
           std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(host_s));
  };
  for (const auto& c : options_.counters(to_tp(ref_host_ - 1.0), std::chrono::steady_clock::now())) {
    const double us = std::max(0.0, std::chrono::duration<double>(c.t - st.epoch).count() * 1e6);
    trace_.counter(c.track, us, c.value);
  }
}

void OffloadTrace::write_if_last() {
  const bool last = options_.steps.empty() || step_ >= options_.steps.back();
  if (!last || options_.path.empty()) return;
  trace_.write(options_.path);
  if (options_.log)
    options_.log(strprintf("trace of %zu step(s), %zu spans: %s", options_.steps.size(), trace_.events(),
                           options_.path.c_str()));
}

}  // namespace tandem
