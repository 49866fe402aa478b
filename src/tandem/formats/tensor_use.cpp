#include "tandem/formats/tensor_use.h"

#include "tandem/core/error.h"
#include "tandem/core/strings.h"

namespace tandem {

TensorUse::TensorUse(std::vector<std::string> names, std::string source)
    : names_(std::move(names)), source_(std::move(source)) {}

TensorLookup TensorUse::recording(TensorLookup lookup) const {
  return [lookup = std::move(lookup), used = used_](const std::string& name) {
    used->insert(name);
    return lookup(name);
  };
}

void TensorUse::check_all_used() const {
  const auto benign = [](const std::string& n) {
    for (const std::string suffix : {"rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias"})
      if (n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0) return true;
    return false;
  };
  std::vector<std::string> unused;
  for (const auto& n : names_)
    if (!used_->count(n) && !benign(n)) unused.push_back(n);
  if (unused.empty()) return;
  const size_t shown = std::min<size_t>(unused.size(), 4);
  TANDEM_FAIL(source_, " holds ", unused.size(), " tensor(s) the model does not use (",
              join(std::vector<std::string>(unused.begin(), unused.begin() + static_cast<std::ptrdiff_t>(shown)), ", "),
              unused.size() > shown ? ", ..." : "",
              "): it is of another architecture than the one configured (more layers, biases, another family); "
              "drop the model.* settings that differ from its config.json, or start from a matching one");
}

}  // namespace tandem
