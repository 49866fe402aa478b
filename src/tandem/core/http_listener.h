#pragma once
// The socket side of tandem's two HTTP servers (the dashboard and /metrics of a run, and `tandem
// serve`): a cpp-httplib server whose routes are set, bound to host:port and served from a thread.
// Only built with cpp-httplib (TANDEM_WITH_HTTP).

#include <memory>
#include <string>

namespace httplib {
class Server;
}

namespace tandem {

class HttpListener {
 public:
  /// Binds `server` to host:port (0: any free port) with SO_REUSEADDR only (cpp-httplib's default
  /// adds SO_REUSEPORT, which would let a second process share a taken port silently) and a listen
  /// backlog of 4096 (cpp-httplib's 5 resets connections under a burst), then serves on a thread
  /// and returns once it accepts. UserError naming the address and `fix` when it cannot bind.
  HttpListener(httplib::Server& server, const std::string& host, int port, const std::string& fix);
  /// Stops accepting and joins the thread.
  ~HttpListener();
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  int port() const { return port_; }
  /// Stops accepting; wait() then returns.
  void stop();
  /// Blocks until the server has stopped.
  void wait();

 private:
  struct Thread;
  httplib::Server& server_;
  int port_ = 0;
  std::unique_ptr<Thread> thread_;
};

}  // namespace tandem
