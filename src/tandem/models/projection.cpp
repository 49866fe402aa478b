#include "tandem/models/projection.h"

#include "tandem/models/init.h"

namespace tandem {

ProjectionImpl::ProjectionImpl(int64_t in, int64_t out, double std, bool bias_, bool input_major)
    : input_major_(input_major) {
  auto w = input_major ? torch::empty({in, out}) : torch::empty({out, in});
  init_normal(w, std);
  weight = register_parameter("weight", w);
  if (bias_) bias = register_parameter("bias", torch::zeros({out}));
}

void ProjectionImpl::zero_outputs_from(int64_t from) {
  torch::NoGradGuard g;
  const int64_t dim = input_major_ ? 1 : 0;
  const int64_t n = weight.size(dim) - from;
  if (n <= 0) return;
  weight.narrow(dim, from, n).zero_();
  if (bias.defined()) bias.narrow(0, from, n).zero_();
}

void ProjectionImpl::zero_inputs_from(int64_t from) {
  torch::NoGradGuard g;
  const int64_t dim = input_major_ ? 0 : 1;
  const int64_t n = weight.size(dim) - from;
  if (n > 0) weight.narrow(dim, from, n).zero_();
}

std::vector<int64_t> ProjectionImpl::weight_shape(int64_t in, int64_t out) const {
  return input_major_ ? std::vector<int64_t>{in, out} : std::vector<int64_t>{out, in};
}

}  // namespace tandem
