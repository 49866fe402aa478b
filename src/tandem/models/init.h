#pragma once
// Initial weights drawn in parallel, the same for a seed whatever the thread count
// (Note [Parallel initialisation]).

#include <torch/torch.h>

namespace tandem {

/// Fills `t` (contiguous, CPU) with N(0, std^2): one draw of the default CPU generator seeds the
/// tensor, and each chunk of it has its own generator, so the chunks fill on every core.
void init_normal(torch::Tensor& t, double std);

/// While one made with `skip` lives on this thread, init_normal draws its seed as always but
/// leaves the tensor unfilled, its memory untouched (Note [Stage build]).
class SkipInitialFill {
 public:
  explicit SkipInitialFill(bool skip);
  ~SkipInitialFill();
  SkipInitialFill(const SkipInitialFill&) = delete;
  SkipInitialFill& operator=(const SkipInitialFill&) = delete;

 private:
  bool skip_;
};

}  // namespace tandem
