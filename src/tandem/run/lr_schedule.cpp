#include "tandem/run/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace tandem {

double lr_at(const OptimConfig& o, int64_t step, int64_t total_steps) {
  if (step < o.warmup_steps)
    return o.warmup_min_lr + (o.lr - o.warmup_min_lr) * double(step + 1) / double(o.warmup_steps);
  const int64_t end = o.decay_steps > 0 ? o.decay_steps : total_steps;
  const double min_lr = o.lr * o.min_lr_ratio;
  const double span = std::max<int64_t>(1, end - o.warmup_steps);
  const double p = std::clamp(double(step - o.warmup_steps) / span, 0.0, 1.0);
  switch (o.schedule) {
    case LrSchedule::kConstant:
      return o.lr;
    case LrSchedule::kLinear:
      return o.lr - (o.lr - min_lr) * p;
    case LrSchedule::kCosine:
      return min_lr + 0.5 * (1.0 + std::cos(M_PI * p)) * (o.lr - min_lr);
  }
  return o.lr;
}

}  // namespace tandem
