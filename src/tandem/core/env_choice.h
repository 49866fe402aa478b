#pragma once
// A process-wide setting chosen by an environment variable among a few names (TANDEM_DECODE_KERNELS,
// TANDEM_DEPENDENT_LAUNCH), for comparing two ways of running the same thing.

#include <string>
#include <vector>

namespace tandem {

/// The value of environment variable `name`: "" when unset or empty, else one of `choices`; any other
/// value is refused (TANDEM_CHECK) with "NAME=value is not a choice of <what>; use a or b (or leave it
/// unset)".
std::string env_choice(const char* name, const char* what, const std::vector<std::string>& choices);

}  // namespace tandem
