// `tandem dashboard RUN_DIR` in-process (cli/dashboard_command.h): its options, the directories it
// refuses, and a served run directory (its rows, run label and follow of a metrics.jsonl written
// later) until SIGTERM or SIGINT reaches the command's thread. HTTP over a plain socket.

#include "tandem/cli/dashboard_command.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "../error_of.h"
#include "../test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::error_of;

void parse(CLI::App& app, const std::vector<std::string>& argv) {
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());  // CLI11 takes them last first
  app.parse(reversed);
}

void expect_parse_error(const std::vector<std::string>& argv) {
  CLI::App app{"dashboard test"};
  DashboardCommand command(app);
  EXPECT_THROW(parse(app, argv), CLI::ParseError) << argv.back();
}

TEST(DashboardCommand, NeedsARunDirectoryAndATcpPort) {
  expect_parse_error({"dashboard"});
  expect_parse_error({"dashboard", "runs/x", "--port", "0"});
  expect_parse_error({"dashboard", "runs/x", "--port", "65536"});
  expect_parse_error({"dashboard", "runs/x", "--port", "http"});
  CLI::App app{"dashboard test"};
  app.add_subcommand("other", "another command");
  DashboardCommand command(app);
  parse(app, {"other"});
  EXPECT_FALSE(command.chosen());
}

// Refused before the command blocks any signal or binds a port.
TEST(DashboardCommand, RefusesWhatIsNotARunDirectory) {
  test::TempDir dir;
  std::ofstream(dir.file("metrics.jsonl")) << "";
  const auto error = [](const std::string& path) {
    CLI::App app{"dashboard test"};
    DashboardCommand command(app);
    parse(app, {"dashboard", path, "--port", "1"});
    return error_of([&] { command.run(); });
  };
  EXPECT_NE(error(dir.file("missing")).find("'" + dir.file("missing") + "' is not a directory; give a run directory"),
            std::string::npos);
  EXPECT_NE(error(dir.file("metrics.jsonl")).find("is not a directory"), std::string::npos) << "a file is no run";
  fs::create_directories(dir.file("empty"));
  EXPECT_NE(error(dir.file("empty"))
                .find("holds no metrics.jsonl or config.yaml; give the directory a `tandem train` "
                      "run writes"),
            std::string::npos);
}

#ifdef TANDEM_WITH_HTTP

struct Reply {
  int status = -1;  ///< -1: no answer
  std::string body;
};

// GET over a fresh connection to 127.0.0.1:port.
Reply get(int port, const std::string& path) {
  Reply r;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return r;
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return r;
  }
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) text.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t end = text.find("\r\n\r\n");
  if (text.rfind("HTTP/1.1 ", 0) != 0 || end == std::string::npos) return r;
  r.status = std::stoi(text.substr(9, 3));
  r.body = text.substr(end + 4);
  return r;
}

// A port nothing listens on now (the kernel's choice for a socket bound to port 0).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// The command run on a thread of its own (it blocks SIGINT and SIGTERM there and waits for one).
class Serving {
 public:
  Serving(const std::string& run_dir, std::vector<std::string> more = {}) : port_(free_port()) {
    std::vector<std::string> argv = {"dashboard",           run_dir,     "--port",
                                     std::to_string(port_), "--chartjs", "/nonexistent/chart.js"};
    argv.insert(argv.end(), more.begin(), more.end());
    parse(app_, argv);
    testing::internal::CaptureStderr();
    thread_ = std::thread([this] {
      // Blocked before run() blocks them itself: a signal sent early waits for its sigwait.
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, SIGINT);
      sigaddset(&set, SIGTERM);
      pthread_sigmask(SIG_BLOCK, &set, nullptr);
      error_ = error_of([this] { code_ = command_.run(); });
    });
  }
  ~Serving() {
    if (thread_.joinable()) stop(SIGTERM);
  }
  /// True once /healthz answers (false after 10 s, or when the command ended first).
  bool up() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (get(port_, "/healthz").status == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  /// Sends `sig` to the command's thread and waits for run() to return; its log in log_.
  void stop(int sig) {
    pthread_kill(thread_.native_handle(), sig);
    thread_.join();
    log_ = testing::internal::GetCapturedStderr();
  }
  int port() const { return port_; }
  int code() const { return code_; }
  const std::string& error() const { return error_; }
  const std::string& log() const { return log_; }

 private:
  int port_;
  CLI::App app_{"dashboard test"};
  DashboardCommand command_{app_};
  std::thread thread_;
  int code_ = -1;
  std::string error_, log_;
};

void append(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::app) << text; }

TEST(DashboardCommand, ServesAFinishedRunUntilSigterm) {
  test::TempDir dir;
  const std::string run = dir.file("exp-7");
  fs::create_directories(run);
  append(run + "/metrics.jsonl", "{\"step\": 1, \"loss\": 3.5}\n{\"step\": 2, \"loss\": 2.25}\n");
  std::ofstream(run + "/summary.json") << "{}";
  Serving s(run);
  ASSERT_TRUE(s.up()) << "no answer on port " << s.port();
  const Reply series = get(s.port(), "/api/series");
  ASSERT_EQ(series.status, 200);
  const json j = json::parse(series.body);
  ASSERT_EQ(j["rows"].size(), 2u);
  EXPECT_EQ(j["rows"][1]["loss"], 2.25);
  EXPECT_EQ(j["info"]["run_dir"], run);
  EXPECT_EQ(j["info"]["mode"], "viewing metrics.jsonl");
  EXPECT_TRUE(j["done"].get<bool>()) << "a run with its summary has finished";
  const Reply metrics = get(s.port(), "/metrics");
  EXPECT_NE(metrics.body.find("tandem_up{run=\"exp-7\"} 0\n"), std::string::npos) << metrics.body;
  EXPECT_NE(metrics.body.find("tandem_steps_total{run=\"exp-7\"} 2\n"), std::string::npos) << metrics.body;
  EXPECT_EQ(get(s.port(), "/chart.js").body, "window.tandemChartJsMissing = \"/nonexistent/chart.js\";\n");
  EXPECT_EQ(get(s.port(), "/").status, 200);

  s.stop(SIGTERM);
  EXPECT_EQ(s.error(), "");
  EXPECT_EQ(s.code(), 0);
  EXPECT_NE(
      s.log().find("dashboard for " + run + " at http://127.0.0.1:" + std::to_string(s.port()) + "/ (Ctrl-C to stop)"),
      std::string::npos)
      << s.log();
  EXPECT_NE(s.log().find("Chart.js not found at /nonexistent/chart.js"), std::string::npos) << s.log();
  EXPECT_EQ(get(s.port(), "/healthz").status, -1) << "the server stops with the command";
}

// A run that has written its config and not yet a row: the page follows metrics.jsonl as it grows.
TEST(DashboardCommand, FollowsARunThatIsStillBeingWrittenUntilSigint) {
  test::TempDir dir;
  const std::string run = dir.file("live");
  fs::create_directories(run);
  std::ofstream(run + "/config.yaml") << "train:\n  steps: 3\n";
  Serving s(run + "/", {"--bind", "127.0.0.1"});  // a trailing slash names the run as without one
  ASSERT_TRUE(s.up());
  json j = json::parse(get(s.port(), "/api/series").body);
  EXPECT_TRUE(j["rows"].empty());
  EXPECT_FALSE(j["done"].get<bool>());
  append(run + "/metrics.jsonl", "{\"step\": 1, \"loss\": 4.0}\n{\"step\": 2, \"lo");  // a line half written
  j = json::parse(get(s.port(), "/api/series").body);
  EXPECT_EQ(j["rows"].size(), 1u) << "an incomplete line waits";
  append(run + "/metrics.jsonl", "ss\": 3.0}\n");
  j = json::parse(get(s.port(), "/api/series?row=1").body);
  ASSERT_EQ(j["rows"].size(), 1u);
  EXPECT_EQ(j["rows"][0]["step"], 2);
  EXPECT_NE(get(s.port(), "/metrics").body.find("tandem_up{run=\"live\"} 1\n"), std::string::npos);
  s.stop(SIGINT);
  EXPECT_EQ(s.error(), "");
  EXPECT_EQ(s.code(), 0);
}

TEST(DashboardCommand, ATakenPortIsAUserErrorNamingTheFix) {
  test::TempDir dir;
  std::ofstream(dir.file("config.yaml")) << "";
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  CLI::App app{"dashboard test"};
  DashboardCommand command(app);
  parse(app, {"dashboard", dir.path(), "--port", std::to_string(ntohs(a.sin_port))});
  std::string err;
  std::thread t([&] { err = error_of([&] { command.run(); }); });  // it blocks signals on its thread
  t.join();
  close(fd);
  EXPECT_NE(err.find("pick another port"), std::string::npos) << err;
}

#endif  // TANDEM_WITH_HTTP

}  // namespace
}  // namespace tandem
