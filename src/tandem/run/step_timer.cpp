#include "tandem/run/step_timer.h"

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <chrono>

namespace tandem {

struct StepTimer::Mark {
  std::unique_ptr<c10::Event> ev;  // GPU
  double host = 0;                 // CPU device
  Phase ended = Phase::kForward;
};

StepTimer::StepTimer(c10::Device device) : device_(device) {}
StepTimer::~StepTimer() = default;

void StepTimer::record(Mark& m) {
  if (device_.is_cuda()) {
    if (!m.ev) m.ev = std::make_unique<c10::Event>(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    const c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    m.ev->record(impl.getStream(device_));
  } else {
    m.host = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
}

void StepTimer::begin() {
  used_ = 0;
  mark(Phase::kForward);  // the origin; its phase is not counted
}

void StepTimer::mark(Phase ended) {
  if (used_ == marks_.size()) marks_.push_back(std::make_unique<Mark>());
  Mark& m = *marks_[used_++];
  m.ended = ended;
  record(m);
}

StepPhases StepTimer::read(double wall_s) {
  StepPhases p;
  for (size_t i = 1; i < used_; ++i) {
    const Mark &a = *marks_[i - 1], &b = *marks_[i];
    const double dt = device_.is_cuda() ? a.ev->elapsedTime(*b.ev) / 1e3 : b.host - a.host;
    (b.ended == Phase::kForward ? p.forward_s : b.ended == Phase::kBackward ? p.backward_s : p.update_s) += dt;
  }
  p.idle_s = std::max(0.0, wall_s - p.forward_s - p.backward_s - p.update_s);
  return p;
}

}  // namespace tandem
