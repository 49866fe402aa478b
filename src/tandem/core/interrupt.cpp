#include "tandem/core/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace tandem {
namespace {

std::atomic<int> g_requests{0};
std::atomic<const char*> g_first_notice{""};

void on_signal(int sig) {
  if (g_requests.fetch_add(1) >= 1) {
    static const char msg[] = "\ntandem: second signal, stopping now\n";
    [[maybe_unused]] const auto n = ::write(2, msg, sizeof msg - 1);
    ::_exit(128 + sig);
  }
  const char* msg = g_first_notice.load();
  [[maybe_unused]] const auto n = ::write(2, msg, std::strlen(msg));  // strlen is async-signal-safe
}

}  // namespace

bool stop_requested() { return g_requests.load() > 0; }
void request_stop() { g_requests.fetch_add(1); }
void clear_stop_request() { g_requests.store(0); }

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
