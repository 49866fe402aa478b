#include "tandem/core/http_listener.h"

#ifdef TANDEM_WITH_HTTP
#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <thread>

#include "tandem/core/error.h"

namespace tandem {

struct HttpListener::Thread {
  std::thread t;
};

HttpListener::HttpListener(httplib::Server& server, const std::string& host, int port, const std::string& fix)
    : server_(server), thread_(std::make_unique<Thread>()) {
  socket_t listening = -1;
  server.set_socket_options([&listening](socket_t sock) {  // called for the listening socket alone
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof yes);
    listening = sock;
  });
  if (port == 0) {
    port_ = server.bind_to_any_port(host);
    TANDEM_CHECK(port_ > 0, "cannot listen on ", host, ": no free port; ", fix);
  } else {
    TANDEM_CHECK(port > 0 && port < 65536, "port ", port, " is not a TCP port; give one in 1..65535");
    TANDEM_CHECK(server.bind_to_port(host, port), "cannot listen on ", host, ":", port,
                 " (in use, or not an address of this machine); ", fix);
    port_ = port;
  }
  server.set_socket_options([](socket_t sock) {  // the callback above must not outlive `listening`
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof yes);
  });
  // Listening again on the bound socket raises cpp-httplib's backlog (to the kernel's somaxconn at most).
  if (listening >= 0) ::listen(listening, 4096);
  thread_->t = std::thread([&server] { server.listen_after_bind(); });
  // stop() is a no-op until the accept loop runs: wait for it, so a destructor never waits forever.
  for (int i = 0; i < 5000 && !server.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  TANDEM_CHECK(server.is_running(), "the HTTP server on ", host, ":", port_, " did not start within 5 s; ", fix);
}

HttpListener::~HttpListener() {
  stop();
  wait();
}

void HttpListener::stop() { server_.stop(); }

void HttpListener::wait() {
  if (thread_->t.joinable()) thread_->t.join();
}

}  // namespace tandem
#endif
