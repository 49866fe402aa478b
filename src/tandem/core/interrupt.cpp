#include "tandem/core/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace tandem {
namespace {

std::atomic<int> g_requests{0};

void on_signal(int sig) {
  if (g_requests.fetch_add(1) >= 1) {
    static const char msg[] = "\ntandem: second signal, stopping now\n";
    [[maybe_unused]] const auto n = ::write(2, msg, sizeof msg - 1);
    ::_exit(128 + sig);
  }
  static const char msg[] = "\ntandem: stopping after this step (a second Ctrl-C stops at once)\n";
  [[maybe_unused]] const auto n = ::write(2, msg, sizeof msg - 1);
}

}  // namespace

bool stop_requested() { return g_requests.load() > 0; }
void request_stop() { g_requests.fetch_add(1); }
void clear_stop_request() { g_requests.store(0); }

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

}  // namespace tandem
