#include "tandem/core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace tandem::log {
namespace {

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> l = [] {
    auto lg = spdlog::stderr_color_mt("tandem");
    lg->set_pattern("[%H:%M:%S] %^%l%$ %v");
    return lg;
  }();
  return *l;
}

}  // namespace

void debug(const std::string& m) { logger().debug(m); }
void info(const std::string& m) { logger().info(m); }
void warn(const std::string& m) { logger().warn(m); }
void error(const std::string& m) { logger().error(m); }
void set_verbose(bool v) { logger().set_level(v ? spdlog::level::debug : spdlog::level::info); }

}  // namespace tandem::log
