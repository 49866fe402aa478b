#pragma once
// Two kinds of failure, two macros (see STYLE.md):
//   TANDEM_CHECK(cond, ...)  bad input from a user; the CLI prints the message on one line and
//                            exits with code 2. The message names the value and what to do.
//   TANDEM_ASSERT(cond, ...) a broken invariant inside tandem: a bug.

#include <sstream>
#include <stdexcept>
#include <string>

namespace tandem {

/// A failure caused by the user's input, files or environment; the message says what to change.
class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A broken internal invariant: a bug in tandem, reported with file and line.
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

namespace detail {

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] void throw_user_error(const std::string& message);
[[noreturn]] void throw_internal_error(const char* file, int line, const char* expr, const std::string& message);

}  // namespace detail
}  // namespace tandem

#define TANDEM_CHECK(cond, ...)                                                             \
  do {                                                                                      \
    if (!(cond)) ::tandem::detail::throw_user_error(::tandem::detail::concat(__VA_ARGS__)); \
  } while (0)

#define TANDEM_FAIL(...) ::tandem::detail::throw_user_error(::tandem::detail::concat(__VA_ARGS__))

#define TANDEM_ASSERT(cond, ...)                                                                                      \
  do {                                                                                                                \
    if (!(cond))                                                                                                      \
      ::tandem::detail::throw_internal_error(__FILE__, __LINE__, #cond, ::tandem::detail::concat("", ##__VA_ARGS__)); \
  } while (0)
