#include "tandem/optim/optimizer.h"

#include "tandem/core/error.h"

namespace tandem {

void Optimizer::load_state(const std::function<std::optional<torch::Tensor>(const std::string&)>& lookup,
                           const std::string& source) {
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : state()) {
    auto v = lookup(name);
    TANDEM_CHECK(v.has_value(), source, ": optimizer state '", name,
                 "' is missing; the checkpoint does not match this model or optim.type");
    TANDEM_CHECK(v->sizes() == t.sizes(), source, ": optimizer state '", name, "' has shape ", v->sizes(),
                 " but the model needs ", t.sizes(), "; resume with the checkpoint's model settings");
    t.copy_(*v);  // widens, or rounds to nearest even, between fp32 and bf16 states
  }
}

}  // namespace tandem
