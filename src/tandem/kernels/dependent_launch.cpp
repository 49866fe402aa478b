// The process-wide switch for dependent launches (Note [Dependent launch]).

#include "tandem/kernels/dependent_launch.h"

#include <atomic>

#include "tandem/core/env_choice.h"

namespace tandem::detail {
namespace {

bool allowed_by_environment() {
  return env_choice("TANDEM_DEPENDENT_LAUNCH", "dependent launch settings", {"on", "off"}) != "off";
}

std::atomic<int>& state() {  // -1: not read yet, 0: off, 1: on
  static std::atomic<int> s{-1};
  return s;
}

}  // namespace

bool dependent_launch_allowed() {
  int s = state().load(std::memory_order_relaxed);
  if (s < 0) {
    s = allowed_by_environment() ? 1 : 0;
    state().store(s, std::memory_order_relaxed);
  }
  return s == 1;
}

void check_dependent_launch_setting() { (void)allowed_by_environment(); }

void allow_dependent_launch(bool allowed) { state().store(allowed ? 1 : 0, std::memory_order_relaxed); }

}  // namespace tandem::detail
