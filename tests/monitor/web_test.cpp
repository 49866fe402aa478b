// The HTTP endpoints and the pages people look at: /metrics through promtool, the live feed of a
// training run, the dashboard and the report opened in headless Chromium (no console errors,
// charts holding points, screenshots left in test-artifacts/).

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "tandem/monitor/report.h"
#include "tandem/monitor/run_feed.h"
#include "tandem/monitor/web_server.h"
#include "tandem/run/trainer.h"
#include "../test_util.h"

#ifdef TANDEM_WITH_HTTP
#include <httplib.h>
#endif

namespace fs = std::filesystem;

namespace tandem {
namespace {

/// Runs a shell command; its stdout and stderr together, the exit status in *rc.
std::string run_cmd(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return "popen failed";
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

bool have(const std::string& tool) {
  int rc = 0;
  run_cmd("command -v " + tool, &rc);
  return rc == 0;
}

std::string chromium(const std::string& args) {
  int rc = 0;
  const std::string out = run_cmd(
      "timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run "
      "--enable-logging=stderr --v=0 " + args,
      &rc);
  EXPECT_EQ(rc, 0) << out;
  return out;
}

std::string body_attr(const std::string& dom, const std::string& name) {
  std::smatch m;
  if (std::regex_search(dom, m, std::regex("<body[^>]*\\s" + name + "=\"([^\"]*)\""))) return m[1];
  return "<absent>";
}

/// A finished tiny run on the CPU through the offload engine (so k and the overlapped times exist).
std::string tiny_run(const std::string& dir, int64_t steps) {
  Config c = test::tiny_cpu_config(dir, steps);
  c.offload.optimizer = OffloadTarget::kCpu;
  c.train.eval_every = 10;
  c.monitor.period_s = 0.05;
  train(c, {});
  return dir;
}

void fill_sample_feed(RunFeed& feed) {
  feed.add_row({{"step", 7}, {"loss", 2.5}, {"lr", 1e-3}, {"grad_norm", 0.7}, {"step_time_s", 0.2},
                {"tokens_per_s", 1000.0}, {"tokens", 1400}, {"offload_k", 0.25}, {"offload_gpu_blocks", 2},
                {"offload_rollbacks", 1}, {"time_forward_s", 0.05}, {"time_backward_s", 0.1},
                {"time_update_s", 0.01}, {"time_idle_s", 0.04}, {"time_transfer_s", 0.03},
                {"time_cpu_update_s", 0.08}, {"energy_gpu_j", 40.0}, {"energy_gpu_j_per_token", 0.02},
                {"mem_device_bytes", 1 << 30}, {"mem_host_peak_bytes", 1 << 29}});
  feed.add_row({{"step", 7}, {"eval_loss", 2.6}});
  feed.add_sample({{"t_s", 1.0}, {"gpu_util_pct", 97.0}, {"gpu_mem_util_pct", 40.0}, {"gpu_mem_used_bytes", 70LL << 30},
                   {"gpu_mem_total_bytes", 80LL << 30}, {"gpu_temp_c", 61.0}, {"gpu_power_w", 640.5},
                   {"gpu_sm_clock_mhz", 1980.0}, {"cpu_util_pct", 35.0}, {"cpu_core_pct", {10.0, 60.0}},
                   {"cpu_process_pct", 150.0}, {"host_mem_used_bytes", 90LL << 30},
                   {"host_mem_total_bytes", 128LL << 30}, {"host_rss_bytes", 40LL << 30}});
}

#ifdef TANDEM_WITH_HTTP

std::string get(int port, const std::string& path, int* status = nullptr) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(10, 0);
  auto res = cli.Get(path.c_str());
  if (status) *status = res ? res->status : -1;
  return res ? res->body : std::string();
}

TEST(WebServer, MetricsAreTheExpositionFormatAndPassPromtool) {
  RunFeed feed;
  fill_sample_feed(feed);
  WebServerOptions o;
  o.dashboard = false;
  o.run_label = "run \"a\"";
  WebServer server(feed, o);
  int status = 0;
  const std::string text = get(server.port(), "/metrics", &status);
  ASSERT_EQ(status, 200);
  for (const char* line : {"# TYPE tandem_steps_total counter", "tandem_steps_total{run=\"run \\\"a\\\"\"} 7",
                           "tandem_gpu_power_watts{run=\"run \\\"a\\\"\",gpu=\"0\"} 640.5",
                           "tandem_cpu_core_utilization_ratio{run=\"run \\\"a\\\"\",core=\"1\"} 0.6",
                           "tandem_step_phase_seconds{run=\"run \\\"a\\\"\",phase=\"cpu_update\"} 0.08",
                           "# TYPE tandem_gpu_energy_joules_total counter", "tandem_eval_loss{run=\"run \\\"a\\\"\"} 2.6"})
    EXPECT_NE(text.find(line), std::string::npos) << "missing: " << line << "\n" << text;
  EXPECT_EQ(get(server.port(), "/", &status), "");  // no dashboard on a metrics-only server
  EXPECT_EQ(status, 404);
  if (!have("promtool")) GTEST_SKIP() << "promtool not installed (Debian's prometheus package; scripts/setup.sh)";
  test::TempDir dir;
  std::ofstream(dir.file("metrics.txt")) << text;
  int rc = 0;
  const std::string out = run_cmd("promtool check metrics < " + dir.file("metrics.txt"), &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "") << "promtool's lint findings";
}

TEST(WebServer, ATakenPortIsAUserErrorNamingTheFix) {
  RunFeed feed;
  WebServer first(feed, {});
  WebServerOptions o;
  o.port = first.port();
  const std::string err = test::error_of([&] { WebServer second(feed, o); });
  EXPECT_NE(err.find("pick another port"), std::string::npos) << err;
}

TEST(WebServer, ALiveRunServesItsRowsAndSamplesWhileItTrains) {
  int port = 0;
  {
    RunFeed probe;
    port = WebServer(probe, {}).port();  // a free port, released again
  }
  test::TempDir dir;
  Config c = test::tiny_cpu_config(dir.path(), 400);
  c.monitor.dashboard_port = port;
  c.monitor.metrics_port = port;
  c.monitor.period_s = 0.05;
  std::thread run([&] { train(c, {}); });
  nlohmann::json seen;
  std::string metrics;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string body = get(port, "/api/series?row=0&sample=0");
    if (!body.empty()) {
      seen = nlohmann::json::parse(body);
      if (seen["rows"].size() >= 3 && seen["samples"].size() >= 1) {
        metrics = get(port, "/metrics");
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  run.join();
  ASSERT_TRUE(seen.is_object()) << "the dashboard never answered on port " << port;
  ASSERT_GE(seen["rows"].size(), 3u);
  EXPECT_FALSE(seen["done"].get<bool>()) << "rows should arrive while the run is still training";
  EXPECT_LT(seen["rows"].back()["step"].get<int64_t>(), 400);
  EXPECT_TRUE(seen["rows"][0].contains("time_forward_s"));
  EXPECT_TRUE(seen["samples"][0].contains("cpu_util_pct"));
  EXPECT_NE(metrics.find("tandem_up{run="), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("} 1\n"), std::string::npos) << metrics;
  EXPECT_EQ(get(port, "/api/series"), "") << "the server should stop with the run";
}

// `tandem dashboard` on a finished run: /metrics alone (no page polling) reads its rows and says it
// is no longer up.
TEST(WebServer, AFollowedRunThatFinishedIsDownOnMetrics) {
  test::TempDir dir;
  tiny_run(dir.path(), 5);
  ASSERT_TRUE(fs::exists(dir.file("summary.json")));
  RunFeed feed;
  WebServerOptions o;
  o.follow_metrics = dir.file("metrics.jsonl");
  WebServer server(feed, o);
  int status = 0;
  const std::string text = get(server.port(), "/metrics", &status);
  ASSERT_EQ(status, 200);
  EXPECT_NE(text.find("tandem_up 0"), std::string::npos) << text;
  EXPECT_NE(text.find("tandem_steps_total 5"), std::string::npos) << text;
}

TEST(Dashboard, LoadsInHeadlessChromiumWithChartsAndNoErrors) {
  if (!have("chromium")) GTEST_SKIP() << "chromium not installed (Debian's chromium; scripts/setup.sh)";
  if (!fs::exists(kDefaultChartJs)) GTEST_SKIP() << "Chart.js not installed (Debian's libjs-chart.js)";
  test::TempDir dir;
  tiny_run(dir.path(), 40);
  RunFeed feed;
  WebServerOptions o;
  o.follow_metrics = dir.file("metrics.jsonl");
  WebServer server(feed, o);
  const std::string dom = chromium("--virtual-time-budget=5000 --dump-dom " + server.url());
  EXPECT_EQ(body_attr(dom, "data-errors"), "") << dom.substr(0, 2000);
  EXPECT_GE(std::stoi(body_attr(dom, "data-polls")), 1);
  // 40 step rows feed loss, throughput, six time-split series and k; the samples feed the rest.
  EXPECT_GE(std::stoi(body_attr(dom, "data-points")), 40 * 8) << dom.substr(0, 2000);
  EXPECT_EQ(dom.find("Uncaught"), std::string::npos) << dom;
  EXPECT_EQ(body_attr(dom, "data-chartjs"), "1") << "the page did not get Chart.js from the server";
  const std::string shot = (fs::path(test::artifact_dir()) / "dashboard.png").string();
  fs::remove(shot);
  chromium("--window-size=1400,1300 --virtual-time-budget=5000 --screenshot=" + shot + " " + server.url());
  ASSERT_TRUE(fs::exists(shot));
  EXPECT_GT(fs::file_size(shot), 20000u) << "a blank page compresses to a few kB";
}

#endif  // TANDEM_WITH_HTTP

TEST(Report, RendersOfflineInHeadlessChromium) {
  test::TempDir dir;
  tiny_run(dir.path(), 30);
  const std::string path = write_report(dir.path());
  EXPECT_EQ(path, dir.file("report.html"));
  const std::string html = test::read_text(path);
  EXPECT_EQ(html.find("http://"), std::string::npos) << "the report must not reach the network";
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(html.find("median_tokens_per_s"), std::string::npos) << "the summary table";
  EXPECT_NE(html.find("offload:"), std::string::npos) << "the config";
  // Loss, throughput, time split, k, utilisation and memory have data on a CPU run.
  EXPECT_GE(std::stoi(body_attr(html, "data-charts")), 6);
  if (!have("chromium")) GTEST_SKIP() << "chromium not installed (Debian's chromium; scripts/setup.sh)";
  const std::string offline = "--host-resolver-rules='MAP * ~NOTFOUND' ";
  const std::string dom = chromium(offline + "--dump-dom file://" + path);
  EXPECT_NE(dom.find("<polyline"), std::string::npos);
  const std::string shot = (fs::path(test::artifact_dir()) / "report.png").string();
  fs::remove(shot);
  chromium(offline + "--window-size=1300,1800 --screenshot=" + shot + " file://" + path);
  ASSERT_TRUE(fs::exists(shot));
  EXPECT_GT(fs::file_size(shot), 20000u);
}

TEST(Report, ADirectoryWithoutMetricsIsAUserError) {
  test::TempDir dir;
  const std::string err = test::error_of([&] { write_report(dir.path()); });
  EXPECT_NE(err.find("no metrics.jsonl"), std::string::npos) << err;
}

}  // namespace
}  // namespace tandem
