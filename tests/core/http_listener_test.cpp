// core/http_listener: the socket side of both HTTP servers. A route answers on the port it chose, a
// taken port is refused with the fix (SO_REUSEADDR only: never shared silently), a burst of
// connections beyond cpp-httplib's default backlog of 5 is answered, and stop() ends wait().
#include "tandem/core/http_listener.h"

#include <gtest/gtest.h>

#ifdef TANDEM_WITH_HTTP
#include <httplib.h>

#include <atomic>
#include <thread>
#include <vector>

#include "../error_of.h"

namespace tandem {
namespace {

void route(httplib::Server& s) {
  s.Get("/ping", [](const httplib::Request&, httplib::Response& res) { res.set_content("pong", "text/plain"); });
}

TEST(HttpListener, ServesOnTheChosenPortAndRefusesATakenOne) {
  httplib::Server a;
  route(a);
  HttpListener first(a, "127.0.0.1", 0, "pick another port");
  ASSERT_GT(first.port(), 0);
  httplib::Client c("127.0.0.1", first.port());
  const auto r = c.Get("/ping");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "pong");

  httplib::Server b;
  route(b);
  const std::string why = test::error_of([&] { HttpListener second(b, "127.0.0.1", first.port(), "pick another port"); });
  EXPECT_NE(why.find("cannot listen on 127.0.0.1:" + std::to_string(first.port())), std::string::npos) << why;
  EXPECT_NE(why.find("pick another port"), std::string::npos) << why;
  httplib::Server d;
  EXPECT_NE(test::error_of([&] { HttpListener bad(d, "127.0.0.1", 70000, "x"); }).find("is not a TCP port"),
            std::string::npos);
}

// 200 clients connect at once while the handler is slow: every one gets its answer (a backlog of 5
// overflows the accept queue and the kernel resets the rest).
TEST(HttpListener, ABurstOfConnectionsIsAnswered) {
  httplib::Server s;
  s.new_task_queue = [] { return new httplib::ThreadPool(4); };
  s.Get("/slow", [](const httplib::Request&, httplib::Response& res) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    res.set_content("ok", "text/plain");
  });
  HttpListener l(s, "127.0.0.1", 0, "pick another port");
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 200; ++i)
    clients.emplace_back([&] {
      httplib::Client c("127.0.0.1", l.port());
      c.set_read_timeout(60, 0);
      const auto r = c.Get("/slow");
      if (r && r->status == 200) ++ok;
    });
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), 200);
}

TEST(HttpListener, StopEndsWait) {
  httplib::Server s;
  route(s);
  HttpListener l(s, "127.0.0.1", 0, "x");
  std::thread waiter([&] { l.wait(); });
  l.stop();
  waiter.join();
  httplib::Client c("127.0.0.1", l.port());
  EXPECT_FALSE(c.Get("/ping"));
}

}  // namespace
}  // namespace tandem
#endif
