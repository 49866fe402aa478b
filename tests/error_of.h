#pragma once
// The message of a UserError, for tests of bad input. Torch-free: tests of torch-free code include
// it alone; tests/test_util.h includes it for the rest.

#include <functional>
#include <string>

#include "tandem/core/error.h"

namespace tandem::test {

/// The message of the UserError that f throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace tandem::test
