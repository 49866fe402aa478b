#include "tandem/core/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace tandem {
namespace {

std::atomic<int> g_requests{0};    // signals received
std::atomic<bool> g_asked{false};  // a stop asked from inside the process (request_stop)
std::atomic<const char*> g_first_notice{""};

void on_signal(int sig) {
  // Only a second signal ends the process at once: a stop asked in-process leaves the user's first
  // Ctrl-C its clean stop.
  if (g_requests.fetch_add(1) >= 1) {
    static const char msg[] = "\ntandem: second signal, stopping now\n";
    [[maybe_unused]] const auto n = ::write(2, msg, sizeof msg - 1);
    ::_exit(128 + sig);
  }
  const char* msg = g_first_notice.load();
  [[maybe_unused]] const auto n = ::write(2, msg, std::strlen(msg));  // strlen is async-signal-safe
}

}  // namespace

bool stop_requested() { return g_requests.load() > 0 || g_asked.load(); }
void request_stop() { g_asked.store(true); }
void clear_stop_request() {
  g_requests.store(0);
  g_asked.store(false);
}

void install_stop_handlers(const char* first_notice) {
  g_first_notice.store(first_notice);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

}  // namespace tandem
