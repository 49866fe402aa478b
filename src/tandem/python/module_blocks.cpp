#include "tandem/python/module_blocks.h"

#include <map>
#include <set>

#include "tandem/core/error.h"

namespace tandem {

ModuleBlocks::ModuleBlocks(std::vector<BlockGroup> groups) : groups_(std::move(groups)) {
  TANDEM_CHECK(!groups_.empty(), "the model has no Blocks; give blocks=[...] or a model with parameters");
  std::map<const void*, std::string> owner;  // TensorImpl -> "<name> in <block>"
  std::set<std::string> names;
  torch::NoGradGuard no_grad;
  for (auto& g : groups_) {
    TANDEM_CHECK(!g.params.empty(), "Block '", g.name, "' has no parameters; leave it out of blocks=[...]");
    for (auto& [name, p] : g.params) {
      TANDEM_CHECK(p.defined(), "parameter '", name, "' is undefined");
      const std::string here = "'" + name + "' in Block '" + g.name + "'";
      const auto [it, fresh] = owner.emplace(p.unsafeGetTensorImpl(), here);
      TANDEM_CHECK(fresh, "one parameter is in two places: ", it->second, " and ", here,
                   "; a tied weight belongs to one Block only (give each parameter to exactly one Block)");
      TANDEM_CHECK(names.insert(name).second, "two parameters are named '", name, "'; checkpoint names must be unique");
      TANDEM_CHECK(p.is_floating_point(), "parameter '", name, "' is ", p.scalar_type(),
                   "; the engine trains floating-point parameters only (freeze it with requires_grad=False)");
      if (p.scalar_type() != torch::kFloat32) p.set_data(p.to(torch::kFloat32));
    }
  }
}

std::vector<NamedTensor> ModuleBlocks::all_parameters() const {
  std::vector<NamedTensor> out;
  for (const auto& g : groups_) out.insert(out.end(), g.params.begin(), g.params.end());
  return out;
}

int64_t ModuleBlocks::block_numel(size_t i) const {
  int64_t n = 0;
  for (const auto& [name, p] : groups_.at(i).params) n += p.numel();
  return n;
}

int64_t ModuleBlocks::numel() const {
  int64_t n = 0;
  for (size_t i = 0; i < groups_.size(); ++i) n += block_numel(i);
  return n;
}

}  // namespace tandem
