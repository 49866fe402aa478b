#include "tandem/core/env_choice.h"

#include <algorithm>
#include <cstdlib>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"

namespace tandem {

std::string env_choice(const char* name, const char* what, const std::vector<std::string>& choices) {
  const char* env = std::getenv(name);
  const std::string value = env == nullptr ? "" : env;
  TANDEM_CHECK(value.empty() || std::find(choices.begin(), choices.end(), value) != choices.end(), name, "=", value,
               " is not a choice of ", what, "; use ", join(choices, " or "), " (or leave it unset)");
  return value;
}

}  // namespace tandem
