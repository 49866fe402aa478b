// The run's HTTP endpoints (monitor/web_server.h) on loopback: routes on or off, the page, Chart.js or
// its absence, series from sequence numbers, a followed metrics.jsonl, bad ports. Uses httplib::Client:
// listed in TANDEM_HTTP_CLIENT_TESTS (Note [httplib clients]).
#include "tandem/monitor/web_server.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "../test_util.h"
#include "tandem/monitor/run_feed.h"
#include "tandem/monitor/series.h"

#ifdef TANDEM_WITH_HTTP
#include <httplib.h>
#endif

namespace tandem {
namespace {

namespace fs = std::filesystem;

#ifdef TANDEM_WITH_HTTP

struct Reply {
  int status = -1;  ///< -1: no answer
  std::string body, content_type, cache_control;
};

Reply get(int port, const std::string& path) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(5, 0);
  cli.set_read_timeout(10, 0);
  const auto res = cli.Get(path.c_str());
  Reply r;
  if (!res) return r;
  r.status = res->status;
  r.body = res->body;
  r.content_type = res->get_header_value("Content-Type");
  r.cache_control = res->get_header_value("Cache-Control");
  return r;
}

nlohmann::json series(int port, const std::string& query) {
  const Reply r = get(port, "/api/series" + query);
  EXPECT_EQ(r.status, 200) << query;
  return r.status == 200 ? nlohmann::json::parse(r.body) : nlohmann::json();
}

void append(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::app) << text; }

WebServerOptions loopback() {
  WebServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.chartjs_path = "/nonexistent/chart.js";  // no dependence on the machine's Chart.js
  return o;
}

TEST(WebServer, ListensOnLoopbackOnAFreePortAndSaysWhere) {
  RunFeed feed;
  WebServer server(feed, loopback());
  EXPECT_GT(server.port(), 0);
  EXPECT_EQ(server.url(), "http://127.0.0.1:" + std::to_string(server.port()) + "/");
  const Reply health = get(server.port(), "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "ok\n");
}

TEST(WebServer, OnlyTheRoutesAskedForAreServed) {
  RunFeed feed;
  WebServerOptions o = loopback();
  o.dashboard = false;
  o.metrics = false;
  WebServer none(feed, o);
  for (const char* path : {"/", "/chart.js", "/api/series", "/metrics"})
    EXPECT_EQ(get(none.port(), path).status, 404) << path;
  EXPECT_EQ(get(none.port(), "/healthz").status, 200) << "health is always answered";
  EXPECT_EQ(none.warning(), "") << "no dashboard: nothing to warn about";

  o.metrics = true;
  WebServer metrics_only(feed, o);
  EXPECT_EQ(get(metrics_only.port(), "/").status, 404);
  EXPECT_EQ(get(metrics_only.port(), "/metrics").status, 200);

  o.dashboard = true;
  o.metrics = false;
  WebServer dashboard_only(feed, o);
  EXPECT_EQ(get(dashboard_only.port(), "/").status, 200);
  EXPECT_EQ(get(dashboard_only.port(), "/api/series").status, 200);
  EXPECT_EQ(get(dashboard_only.port(), "/metrics").status, 404);
}

TEST(WebServer, ThePageCarriesTheChartListInPlaceOfItsMarker) {
  RunFeed feed;
  WebServer server(feed, loopback());
  const Reply page = get(server.port(), "/");
  ASSERT_EQ(page.status, 200);
  EXPECT_EQ(page.content_type, "text/html; charset=utf-8");
  EXPECT_EQ(page.cache_control, "no-store");
  EXPECT_EQ(page.body.find("/*CHARTS*/null"), std::string::npos);
  EXPECT_NE(page.body.find("const CHARTS = " + chart_specs_json().dump() + ";"), std::string::npos);
  std::string want = dashboard_page();
  want.replace(want.find("/*CHARTS*/null"), 14, chart_specs_json().dump());
  EXPECT_EQ(page.body, want) << "the rest of the page as written";
}

TEST(WebServer, ChartJsIsServedFromTheGivenFile) {
  test::TempDir dir;
  const std::string js = "/* Chart.js stand-in */ window.Chart = function () {};\n";
  std::ofstream(dir.file("chart.umd.js")) << js;
  RunFeed feed;
  WebServerOptions o = loopback();
  o.chartjs_path = dir.file("chart.umd.js");
  WebServer server(feed, o);
  EXPECT_EQ(server.warning(), "");
  const Reply r = get(server.port(), "/chart.js");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "application/javascript");
  EXPECT_EQ(r.body, js);
}

TEST(WebServer, AMissingChartJsIsNamedOnceAndThePageIsToldSo) {
  test::TempDir dir;
  RunFeed feed;
  WebServerOptions o = loopback();
  o.chartjs_path = dir.file("no-chart.js");
  WebServer server(feed, o);
  EXPECT_NE(server.warning().find(dir.file("no-chart.js")), std::string::npos) << server.warning();
  EXPECT_NE(server.warning().find("monitor.chartjs"), std::string::npos) << server.warning();
  const Reply r = get(server.port(), "/chart.js");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "window.tandemChartJsMissing = \"" + dir.file("no-chart.js") + "\";\n");
  // A directory is not a file either.
  o.chartjs_path = dir.path();
  WebServer on_dir(feed, o);
  EXPECT_NE(on_dir.warning(), "");
}

TEST(WebServer, TheSeriesStartAtTheSequenceNumbersAsked) {
  RunFeed feed;
  feed.set_info({{"model", "tiny"}});
  for (int step = 1; step <= 3; ++step) feed.add_row({{"step", step}, {"loss", 4.0 - step}});
  feed.add_sample({{"t_s", 0.5}, {"cpu_util_pct", 10.0}});
  feed.add_sample({{"t_s", 1.0}, {"cpu_util_pct", 20.0}});
  WebServer server(feed, loopback());
  const Reply raw = get(server.port(), "/api/series?row=1&sample=1");
  EXPECT_EQ(raw.content_type, "application/json");
  EXPECT_EQ(raw.cache_control, "no-store");
  const auto j = nlohmann::json::parse(raw.body);
  ASSERT_EQ(j["rows"].size(), 2u);
  EXPECT_EQ(j["rows"][0]["step"], 2);
  ASSERT_EQ(j["samples"].size(), 1u);
  EXPECT_EQ(j["samples"][0]["cpu_util_pct"], 20.0);
  EXPECT_EQ(j["next_row"], 3);
  EXPECT_EQ(j["next_sample"], 2);
  EXPECT_EQ(j["info"]["model"], "tiny");
  EXPECT_FALSE(j["done"].get<bool>());
  EXPECT_TRUE(series(server.port(), "?row=3&sample=2")["rows"].empty()) << "nothing new";
  // Missing or unreadable numbers count from the start.
  EXPECT_EQ(series(server.port(), "")["rows"].size(), 3u);
  EXPECT_EQ(series(server.port(), "?row=abc&sample=")["rows"].size(), 3u);
  feed.add_row({{"step", 4}, {"loss", 0.5}});
  feed.finish();
  const auto after = series(server.port(), "?row=3");
  ASSERT_EQ(after["rows"].size(), 1u);
  EXPECT_EQ(after["rows"][0]["step"], 4);
  EXPECT_TRUE(after["done"].get<bool>());
}

TEST(WebServer, MetricsCarryTheRunLabelAndTheExpositionContentType) {
  RunFeed feed;
  feed.add_row({{"step", 9}, {"loss", 1.25}});
  WebServerOptions o = loopback();
  o.dashboard = false;
  o.run_label = "exp-1";
  WebServer server(feed, o);
  const Reply r = get(server.port(), "/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_NE(r.body.find("tandem_up{run=\"exp-1\"} 1\n"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("tandem_steps_total{run=\"exp-1\"} 9\n"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("tandem_loss{run=\"exp-1\"} 1.25\n"), std::string::npos) << r.body;
}

TEST(WebServer, AFollowedMetricsFileIsReadOnEachRequestUntilItsSummaryAppears) {
  test::TempDir dir;
  const std::string metrics = dir.file("run/metrics.jsonl");
  RunFeed feed;
  WebServerOptions o = loopback();
  o.follow_metrics = metrics;
  WebServer server(feed, o);
  EXPECT_TRUE(series(server.port(), "")["rows"].empty()) << "not written yet";
  fs::create_directories(dir.file("run"));
  append(metrics, "{\"step\": 1, \"loss\": 3.0}\n{\"step\": 2, \"loss\": 2.0}\n");
  auto j = series(server.port(), "");
  EXPECT_EQ(j["rows"].size(), 2u);
  EXPECT_FALSE(j["done"].get<bool>());
  append(metrics, "{\"step\": 3, \"loss\": 1.5}\n");
  const Reply m = get(server.port(), "/metrics");
  EXPECT_NE(m.body.find("tandem_steps_total 3\n"), std::string::npos) << "/metrics follows too: " << m.body;
  EXPECT_NE(m.body.find("tandem_up 1\n"), std::string::npos) << m.body;
  j = series(server.port(), "?row=2");
  ASSERT_EQ(j["rows"].size(), 1u) << "each line once";
  EXPECT_EQ(j["rows"][0]["step"], 3);
  std::ofstream(dir.file("run/summary.json")) << "{}";
  EXPECT_TRUE(series(server.port(), "?row=3")["done"].get<bool>()) << "a run with a summary has finished";
  EXPECT_NE(get(server.port(), "/metrics").body.find("tandem_up 0\n"), std::string::npos);
}

TEST(WebServer, AStoppedServerNoLongerAnswers) {
  RunFeed feed;
  int port = 0;
  {
    WebServer server(feed, loopback());
    port = server.port();
    ASSERT_EQ(get(port, "/healthz").status, 200);
  }
  EXPECT_EQ(get(port, "/healthz").status, -1);
}

TEST(WebServer, APortOutsideTheTcpRangeIsRefused) {
  RunFeed feed;
  for (const int port : {70000, -3}) {
    WebServerOptions o = loopback();
    o.port = port;
    const std::string err = test::error_of([&] { WebServer server(feed, o); });
    EXPECT_NE(err.find("is not a TCP port"), std::string::npos) << port << ": " << err;
  }
}

#else  // a build without cpp-httplib

TEST(WebServer, ABuildWithoutHttpRefusesToStartWithTheFix) {
  RunFeed feed;
  const std::string err = test::error_of([&] { WebServer server(feed, {}); });
  EXPECT_NE(err.find("without cpp-httplib"), std::string::npos) << err;
  EXPECT_NE(err.find("libcpp-httplib-dev"), std::string::npos) << err;
}

#endif  // TANDEM_WITH_HTTP

}  // namespace
}  // namespace tandem
