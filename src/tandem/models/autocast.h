#pragma once
// The autocast region the trainer and the step benchmark run forward passes in.

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <optional>

#include "tandem/core/config.h"

namespace tandem {

/// The dtype autocast computes in for `p`; nullopt for fp32 (no autocast).
inline std::optional<at::ScalarType> autocast_dtype(Precision p) {
  if (p == Precision::kFp32) return std::nullopt;
  return p == Precision::kBf16 ? at::kBFloat16 : at::kHalf;
}

/// The dtype a run computes in for `p`: autocast's, or fp32.
inline at::ScalarType compute_dtype(Precision p) { return autocast_dtype(p).value_or(at::kFloat); }

/// Mixed-precision region for the forward pass; restores the previous state on exit.
class AutocastGuard {
 public:
  AutocastGuard(torch::DeviceType device, Precision p) : device_(device), on_(p != Precision::kFp32) {
    if (!on_) return;
    prev_enabled_ = at::autocast::is_autocast_enabled(device_);
    prev_dtype_ = at::autocast::get_autocast_dtype(device_);
    at::autocast::set_autocast_enabled(device_, true);
    at::autocast::set_autocast_dtype(device_, *autocast_dtype(p));
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_, prev_enabled_);
    at::autocast::set_autocast_dtype(device_, prev_dtype_);
  }

 private:
  torch::DeviceType device_;
  bool on_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kFloat;
};

}  // namespace tandem
