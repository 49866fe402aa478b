// The persistent decode step's dispatch (Note [Persistent decode step]).

#include "tandem/kernels/decode_step.h"

namespace tandem {
namespace detail {

MakeDecodeStepFn& decode_step_cuda() {
  static MakeDecodeStepFn fn = nullptr;
  return fn;
}

}  // namespace detail

std::unique_ptr<DecodeStep> make_decode_step(const DecodeStepModel& model, std::string* why) {
  if (detail::decode_step_cuda() == nullptr || model.layers.empty() || !model.embed.is_cuda()) {
    *why = detail::decode_step_cuda() == nullptr ? "a build without CUDA kernels" : "a model off the GPU";
    return nullptr;
  }
  return detail::decode_step_cuda()(model, why);
}

}  // namespace tandem
