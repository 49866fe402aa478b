#include "tandem/core/error.h"

namespace tandem::detail {

void throw_user_error(const std::string& message) { throw UserError(message); }

void throw_internal_error(const char* file, int line, const char* expr, const std::string& message) {
  throw InternalError(concat("internal error (a bug in tandem) at ", file, ":", line, ": ", expr,
                             message.empty() ? "" : ": ", message));
}

}  // namespace tandem::detail
