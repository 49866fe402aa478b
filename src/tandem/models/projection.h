#pragma once
// The linear maps of the models: y = x W^T (+ b), W stored (out, in), or (in, out) for families
// whose checkpoints store it input-major (GPT-2's Conv1D).

#include <torch/torch.h>

namespace tandem {

/// A linear map whose weight is drawn from N(0, std^2) in parallel (Note [Parallel initialisation]);
/// torch::nn::Linear would first draw its own initialisation on one core. The bias starts at zero.
class ProjectionImpl : public torch::nn::Module {
 public:
  ProjectionImpl(int64_t in, int64_t out, double std, bool bias = false, bool input_major = false);
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::nn::functional::linear(x, input_major_ ? weight.t() : weight, bias);
  }
  /// Zeroes output units [from, out) (weight rows or columns, bias entries) or input units [from,
  /// in): the feed-forward's padding (Note [Zero padding keeps the function]).
  void zero_outputs_from(int64_t from);
  void zero_inputs_from(int64_t from);
  /// The weight's shape with `out` output units and `in` input units, in its stored layout.
  std::vector<int64_t> weight_shape(int64_t in, int64_t out) const;
  bool input_major() const { return input_major_; }

  torch::Tensor weight;  // (out, in), or (in, out) when input-major
  torch::Tensor bias;    // (out), or undefined

 private:
  bool input_major_;
};
TORCH_MODULE(Projection);

}  // namespace tandem
