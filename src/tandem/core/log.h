#pragma once
// Logging facade. The implementation (log.cpp) uses spdlog in a translation unit of its own:
// LibTorch ships its own fmt headers, which must not meet spdlog's fmt in one translation unit.

#include <string>

namespace tandem::log {

void debug(const std::string& message);
void info(const std::string& message);
void warn(const std::string& message);
void error(const std::string& message);
/// Enables debug messages.
void set_verbose(bool verbose);

}  // namespace tandem::log
