// The dashboard page (monitor/dashboard_page.cpp): what it asks of the server and of the chart list,
// and its script run under Node with a stand-in DOM, fetch and Chart.js against RunFeed's answers:
// tiles, points, thinning, status, and the page without Chart.js. Skipped without node.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "../test_util.h"
#include "tandem/monitor/run_feed.h"
#include "tandem/monitor/series.h"
#include "tandem/monitor/web_server.h"

namespace tandem {
namespace {

using nlohmann::json;

const std::string kMarker = "/*CHARTS*/null";

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The names a script reads after `prefix` (e.g. "spec." gives title, unit, ...), where `prefix`
// starts a name (not "respec.") and is not preceded by `skip_before` (e.g. "document.").
std::set<std::string> fields_after(const std::string& text, const std::string& prefix,
                                   const std::string& skip_before = "") {
  const auto name_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  std::set<std::string> out;
  for (size_t at = text.find(prefix); at != std::string::npos; at = text.find(prefix, at + 1)) {
    if (at > 0 && name_char(text[at - 1])) continue;
    if (!skip_before.empty() && at >= skip_before.size() &&
        text.compare(at - skip_before.size(), skip_before.size(), skip_before) == 0)
      continue;
    size_t end = at + prefix.size();
    while (end < text.size() && name_char(text[end])) ++end;
    if (end > at + prefix.size()) out.insert(text.substr(at + prefix.size(), end - at - prefix.size()));
  }
  return out;
}

TEST(DashboardPage, HoldsOneChartListMarkerWhereTheScriptDeclaresTheCharts) {
  const std::string& page = dashboard_page();
  EXPECT_EQ(count_of(page, kMarker), 1u) << "the server replaces the first marker only";
  EXPECT_NE(page.find("const CHARTS = " + kMarker + ";"), std::string::npos);
  EXPECT_EQ(page.rfind("<!doctype html>", 0), 0u);
  EXPECT_EQ(page.substr(page.size() - 8), "</html>\n");
  EXPECT_EQ(count_of(page, "<script"), count_of(page, "</script>"));
}

TEST(DashboardPage, ReachesNothingButTheServerThatServedIt) {
  const std::string& page = dashboard_page();
  EXPECT_EQ(page.find("http://"), std::string::npos) << "no CDN, no network";
  EXPECT_EQ(page.find("https://"), std::string::npos);
  EXPECT_EQ(page.find("src=\"//"), std::string::npos);
  EXPECT_NE(page.find("<script src=\"/chart.js\"></script>"), std::string::npos);
  EXPECT_EQ(count_of(page, "fetch("), 1u);
  EXPECT_NE(page.find("fetch(\"/api/series?row=\" + nextRow + \"&sample=\" + nextSample"), std::string::npos);
}

// Headless tests read these before the first poll has run.
TEST(DashboardPage, StartsWithZeroedDataAttributesOnItsBody) {
  EXPECT_NE(dashboard_page().find("<body data-polls=\"0\" data-points=\"0\" data-errors=\"\">"), std::string::npos);
}

TEST(DashboardPage, ReadsOnlyKeysThatTheSeriesAnswerAndTheChartListCarry) {
  const std::string& page = dashboard_page();
  RunFeed feed;
  std::set<std::string> answer;
  const json since = feed.since(0, 0);
  for (const auto& [key, value] : since.items()) answer.insert(key);
  const auto body = fields_after(page, "body.", "document.");
  EXPECT_EQ(body, (std::set<std::string>{"done", "info", "next_row", "next_sample", "rows", "samples"}));
  for (const auto& k : body)
    EXPECT_TRUE(answer.count(k)) << "the page reads body." << k << ", /api/series has no such key";

  const json charts = chart_specs_json();
  ASSERT_FALSE(charts.empty());
  const auto spec_fields = fields_after(page, "spec."), series_fields = fields_after(page, "s.");
  EXPECT_TRUE(spec_fields.count("series") && spec_fields.count("axis") && spec_fields.count("scale"));
  EXPECT_EQ(series_fields, (std::set<std::string>{"key", "label", "overlay"}));
  for (const auto& c : charts) {
    for (const auto& k : spec_fields) EXPECT_TRUE(c.contains(k)) << "the page reads spec." << k << "; " << c.dump();
    for (const auto& s : c["series"])
      for (const auto& k : series_fields) EXPECT_TRUE(s.contains(k)) << "the page reads s." << k << "; " << s.dump();
  }
  // The two axes the page draws: step rows on "step", samples on "t_s".
  for (const auto& c : charts) EXPECT_TRUE(c["axis"] == "step" || c["axis"] == "t_s") << c.dump();
  EXPECT_NE(page.find("addPoints(steps, \"step\")"), std::string::npos);
  EXPECT_NE(page.find("addPoints(body.samples, \"t_s\")"), std::string::npos);
}

// ---- The script under Node ----------------------------------------------------------------------

bool have_node() { return std::system("command -v node >/dev/null 2>&1") == 0; }

// A stand-in browser: elements that record what the script writes into them, fetch answering from
// scenario.json (url -> answers in order; none left: 404), timers fired by hand once the promises
// in flight have settled, and a Chart class that keeps its datasets. Prints what the page holds.
constexpr const char* kHarness = R"JS(
"use strict";
const fs = require("fs"), vm = require("vm"), path = require("path");
const dir = process.argv[2];
const script = fs.readFileSync(path.join(dir, "page.js"), "utf8");
const scenario = JSON.parse(fs.readFileSync(path.join(dir, "scenario.json"), "utf8"));
class El {
  constructor(tag) {
    this.tag = tag; this.children = []; this.style = {}; this.dataset = {}; this.sel = {};
    this.texts = []; this.text = ""; this.className = ""; this.innerHTML = "";
  }
  set textContent(v) { this.text = String(v); this.texts.push(this.text); }
  get textContent() { return this.text; }
  appendChild(c) { this.children.push(c); return c; }
  querySelector(s) { return this.sel[s] || (this.sel[s] = new El(s)); }
}
const byId = {};
const document = {
  body: new El("body"),
  getElementById(id) { return byId[id] || (byId[id] = new El("#" + id)); },
  createElement(tag) { return new El(tag); },
};
Object.assign(document.body.dataset, { polls: "0", points: "0", errors: "" });
const urls = [], timers = [], charts = [], uncaught = [];
const ctx = {
  document,
  setTimeout(fn, ms) { timers.push({ fn, ms }); return timers.length; },
  async fetch(url, opts) {
    urls.push(url);
    const queue = scenario.responses[url] || [];
    const r = queue.length ? queue.shift() : { status: 404, body: "" };
    return { ok: r.status >= 200 && r.status < 300, status: r.status, json: async () => JSON.parse(r.body) };
  },
  addEventListener(type, fn) {},
};
ctx.window = ctx;
if (scenario.missing) ctx.tandemChartJsMissing = scenario.missing;
if (scenario.chartjs)
  ctx.Chart = class {
    constructor(canvas, config) { this.canvas = canvas; this.config = config; this.data = config.data; this.modes = []; charts.push(this); }
    update(mode) { this.modes.push(mode); }
  };
process.on("unhandledRejection", (e) => uncaught.push(String((e && e.stack) || e)));
const settle = async () => { for (let i = 0; i < 50; ++i) await new Promise((r) => setImmediate(r)); };
(async () => {
  try { vm.runInContext(script, vm.createContext(ctx)); } catch (e) { uncaught.push(String(e.stack || e)); }
  await settle();
  const fired = [];
  while (timers.length && fired.length < scenario.max_timers) {
    const t = timers.shift();
    fired.push(t.ms);
    t.fn();
    await settle();
  }
  const tiles = {};
  for (const d of byId.tiles.children) tiles[d.sel[".k"].text] = d.sel[".v"].texts;
  const cards = byId.grid.children.map((card) => {
    const chart = charts.find((c) => c.canvas === card.sel["canvas"]);
    return {
      title: card.sel["h2"].innerHTML,
      empty: card.sel[".empty"].style.display,
      modes: chart ? chart.modes : null,
      x_title: chart ? chart.config.options.scales.x.title.text : null,
      y_stacked: chart ? chart.config.options.scales.y.stacked : null,
      datasets: chart ? chart.data.datasets.map((d) => ({ label: d.label, data: d.data, fill: d.fill, stack: d.stack,
                                                         dash: d.borderDash, radius: d.pointRadius })) : null,
    };
  });
  const status = byId.status || new El("#status");
  process.stdout.write(JSON.stringify({
    urls, fired, pending: timers.map((t) => t.ms), uncaught, dataset: document.body.dataset, tiles, cards,
    status: { texts: status.texts, className: status.className }, info: byId.info ? byId.info.text : null,
    notice: { display: byId.notice ? byId.notice.style.display : null, text: byId.notice ? byId.notice.text : null },
  }));
})();
)JS";

// The page's inline script with the chart list in place of its marker, as WebServer serves it.
std::string page_script() {
  std::string page = dashboard_page();
  page.replace(page.find(kMarker), kMarker.size(), chart_specs_json().dump());
  const std::string open = "<script>\n";
  const size_t begin = page.find(open) + open.size();
  return page.substr(begin, page.find("</script>", begin) - begin);
}

struct Scenario {
  bool chartjs = true;
  std::string missing;  ///< window.tandemChartJsMissing
  int max_timers = 10;
  json responses = json::object();  ///< url -> [{status, body}]
  void answer(const std::string& url, int status, const std::string& body = "") {
    responses[url].push_back({{"status", status}, {"body", body}});
  }
};

// What the page held after the scenario ran, or a failure with node's output.
::testing::AssertionResult run_page(const Scenario& s, json* out) {
  test::TempDir dir;
  std::ofstream(dir.file("harness.js")) << kHarness;
  std::ofstream(dir.file("page.js")) << page_script();
  std::ofstream(dir.file("scenario.json")) << json{
      {"chartjs", s.chartjs},
      {"missing", s.missing},
      {"max_timers", s.max_timers},
      {"responses", s.responses}}.dump();
  const std::string cmd =
      "timeout 60 node " + dir.file("harness.js") + " " + dir.path() + " >" + dir.file("out") + " 2>" + dir.file("err");
  const int status = std::system(cmd.c_str());
  const std::string text = test::read_text(dir.file("out"));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return ::testing::AssertionFailure() << "node failed (" << status << "): " << test::read_text(dir.file("err"));
  try {
    *out = json::parse(text);
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "unreadable output: " << text.substr(0, 500);
  }
  return ::testing::AssertionSuccess();
}

// The chart card titled `title` (its unit follows in <small>).
const json& card(const json& page, const std::string& title) {
  for (const auto& c : page["cards"]) {
    const std::string t = c["title"];
    if (t == title || t.rfind(title + " <small>", 0) == 0) return c;
  }
  // A card with nothing, so that the checks that follow fail instead of reading past the end.
  static const json none = {{"title", ""},          {"empty", ""},
                            {"modes", nullptr},     {"x_title", nullptr},
                            {"y_stacked", nullptr}, {"datasets", json(8, json{{"data", json::array()}})}};
  ADD_FAILURE() << "no chart titled " << title;
  return none;
}

json points(const json& dataset) {
  json out = json::array();
  for (const auto& p : dataset["data"]) out.push_back({p["x"], p["y"]});
  return out;
}

#define NODE_OR_SKIP() \
  if (!have_node()) GTEST_SKIP() << "node not installed (Debian's nodejs): the page's script is not run"

std::string url(int64_t row, int64_t sample) {
  return "/api/series?row=" + std::to_string(row) + "&sample=" + std::to_string(sample);
}

TEST(DashboardPage, DrawsWhatTheFeedSaysAndStopsPollingWhenTheRunIsDone) {
  NODE_OR_SKIP();
  RunFeed feed;
  feed.set_info({{"run_dir", "runs/x"}, {"model", "tiny"}, {"device", "cpu"}, {"precision", "fp32"}, {"mode", ""}});
  feed.add_row({{"step", 1},
                {"loss", 2.5},
                {"tokens_per_s", 12345.0},
                {"step_time_s", 0.25},
                {"time_forward_s", 0.1},
                {"time_backward_s", 0.15},
                {"time_transfer_s", 0.05}});
  feed.add_row({{"step", 1}, {"eval_loss", 2.75}});
  feed.add_row({{"step", 1}, {"checkpoint_blocking_s", 0.5}});  // neither loss: no point anywhere
  feed.add_sample({{"t_s", 0.5}, {"cpu_util_pct", 40.0}, {"host_mem_used_bytes", 2.0 * (1 << 30)}});
  Scenario s;
  s.answer(url(0, 0), 200, feed.since(0, 0).dump());
  feed.add_row({{"step", 2}, {"loss", 1.5}, {"tokens_per_s", 500.0}, {"step_time_s", 2.5}});
  feed.add_row({{"step", 3}, {"loss", std::numeric_limits<double>::quiet_NaN()}});  // null in JSON
  feed.add_sample({{"t_s", 1.5}, {"cpu_util_pct", 60.0}, {"gpu_power_w", 250.4}});
  feed.finish();
  s.answer(url(3, 1), 200, feed.since(3, 1).dump());
  json page;
  ASSERT_TRUE(run_page(s, &page));
  EXPECT_EQ(page["uncaught"], json::array());
  EXPECT_EQ(page["dataset"]["errors"], "");
  EXPECT_EQ(page["urls"], json({url(0, 0), url(3, 1)})) << "each poll asks from the sequence numbers it was given";
  EXPECT_EQ(page["fired"], json({1000})) << "one poll a second while live";
  EXPECT_EQ(page["pending"], json::array()) << "a finished run is not polled again";
  EXPECT_EQ(page["dataset"]["polls"], "2");
  EXPECT_EQ(page["status"]["texts"], json({"live", "finished"}));
  EXPECT_EQ(page["status"]["className"], "done");
  EXPECT_EQ(page["info"], "runs/x · tiny · cpu · fp32") << "empty fields left out";
  EXPECT_EQ(page["dataset"]["chartjs"], "1");

  const json& tiles = page["tiles"];
  EXPECT_EQ(tiles["step"], json({"1", "2"}));
  EXPECT_EQ(tiles["loss"], json({"2.5000", "1.5000"})) << "the NaN step changes nothing";
  EXPECT_EQ(tiles["tokens/s"], json({"12.3 k", "500"}));
  EXPECT_EQ(tiles["step time"], json({"250.0 ms", "2.50 s"}));
  EXPECT_EQ(tiles["CPU util"], json({"40 %", "60 %"}));
  EXPECT_EQ(tiles["GPU power"], json({"250 W"}));
  EXPECT_EQ(tiles["GPU util"], json::array()) << "never reported: left as it was";

  const json& loss = card(page, "Loss");
  EXPECT_EQ(loss["modes"], json({"none", "none"})) << "redrawn once per poll, without animation";
  EXPECT_EQ(loss["x_title"], "step");
  ASSERT_EQ(loss["datasets"].size(), 2u);
  EXPECT_EQ(points(loss["datasets"][0]), json({{1, 2.5}, {2, 1.5}}));
  EXPECT_EQ(points(loss["datasets"][1]), json({{1, 2.75}}));
  EXPECT_EQ(loss["datasets"][1]["radius"], 3) << "evaluations are drawn as dots";
  EXPECT_EQ(loss["datasets"][0]["radius"], 0);
  EXPECT_EQ(points(card(page, "Throughput")["datasets"][0]), json({{1, 12345.0}, {2, 500.0}}));

  const json& split = card(page, "Step time split");
  EXPECT_EQ(split["y_stacked"], true);
  EXPECT_EQ(points(split["datasets"][0]), json({{1, 0.1}}));
  EXPECT_EQ(split["datasets"][0]["fill"], "origin") << "the stack starts at zero";
  EXPECT_EQ(split["datasets"][1]["fill"], "-1") << "and each phase sits on the one before";
  const json& transfers = split["datasets"][4];
  EXPECT_EQ(transfers["label"], "transfers D2H+H2D (overlapped)");
  EXPECT_EQ(points(transfers), json({{1, 0.05}}));
  EXPECT_EQ(transfers["fill"], false) << "an overlapped phase is a line over the stack";
  EXPECT_EQ(transfers["dash"], json({5, 3}));

  const json& util = card(page, "Utilisation");
  EXPECT_EQ(util["x_title"], "seconds since start");
  EXPECT_EQ(points(util["datasets"][2]), json({{0.5, 40.0}, {1.5, 60.0}}));
  EXPECT_EQ(points(card(page, "Memory")["datasets"][1]), json({{0.5, 2.0}})) << "bytes shown in GiB";
  const json& power = card(page, "GPU power");
  EXPECT_EQ(power["title"], "GPU power <small>(W)</small>");
  EXPECT_EQ(points(power["datasets"][0]), json({{1.5, 250.4}}));

  // loss 3, throughput 2, step time split 3, utilisation 2, memory 1, power 1.
  EXPECT_EQ(page["dataset"]["points"], "12");
  for (const auto& c : page["cards"]) {
    size_t n = 0;
    for (const auto& d : c["datasets"]) n += d["data"].size();
    EXPECT_EQ(c["empty"], n > 0 ? "none" : "block") << c["title"];
  }
}

TEST(DashboardPage, AServerThatStopsAnsweringIsShownAsGoneAndAskedAgain) {
  NODE_OR_SKIP();
  RunFeed feed;
  feed.add_row({{"step", 1}, {"loss", 3.0}});
  Scenario s;
  s.max_timers = 2;
  s.answer(url(0, 0), 503);
  s.answer(url(0, 0), 200, feed.since(0, 0).dump());
  // url(1, 0): no answer left, 404.
  json page;
  ASSERT_TRUE(run_page(s, &page));
  EXPECT_EQ(page["uncaught"], json::array());
  EXPECT_EQ(page["urls"], json({url(0, 0), url(0, 0), url(1, 0)})) << "a failed poll asks for the same rows again";
  EXPECT_EQ(page["status"]["texts"], json({"server gone", "live", "server gone"}));
  EXPECT_EQ(page["status"]["className"], "lost");
  EXPECT_EQ(page["dataset"]["polls"], "1") << "only answered polls count";
  EXPECT_EQ(page["pending"], json({1000})) << "a run not known to be done is polled on";
  EXPECT_EQ(page["tiles"]["loss"], json({"3.0000"}));
}

// Past kMaxPoints (4000) the older half of a series is thinned to every other point as points
// arrive; the count of points received is not.
TEST(DashboardPage, ALongSeriesKeepsItsNewestHalfWholeAndEveryOtherOlderPoint) {
  NODE_OR_SKIP();
  RunFeed feed;
  for (int step = 1; step <= 5000; ++step) feed.add_row({{"step", step}, {"loss", 1.0 + 1.0 / step}});
  feed.finish();
  Scenario s;
  s.answer(url(0, 0), 200, feed.since(0, 0).dump());
  json page;
  ASSERT_TRUE(run_page(s, &page));
  EXPECT_EQ(page["uncaught"], json::array());
  const json& data = card(page, "Loss")["datasets"][0]["data"];
  // 4001 points thin to 1000 + 2001; 999 more arrive: 4000.
  std::vector<int> want;
  for (int x = 1; x < 2000; x += 2) want.push_back(x);
  for (int x = 2001; x <= 5000; ++x) want.push_back(x);
  ASSERT_EQ(data.size(), want.size());
  int64_t worst = -1;
  for (size_t i = 0; i < want.size(); ++i)
    if (data[i]["x"] != want[i] || data[i]["y"] != 1.0 + 1.0 / want[i]) {
      worst = static_cast<int64_t>(i);
      break;
    }
  EXPECT_EQ(worst, -1) << "first wrong point at " << worst << ": " << (worst >= 0 ? data[worst].dump() : "")
                       << ", want step " << (worst >= 0 ? want[worst] : 0);
  EXPECT_EQ(page["dataset"]["points"], "5000");
}

TEST(DashboardPage, WithoutChartJsItShowsTheFiguresAndNamesWhatIsMissing) {
  NODE_OR_SKIP();
  RunFeed feed;
  feed.add_row({{"step", 4}, {"loss", 2.0}, {"offload_k", 0.25}});
  feed.add_sample({{"t_s", 3.0}, {"gpu_util_pct", 97.4}});
  feed.finish();
  Scenario s;
  s.chartjs = false;
  s.missing = "/usr/share/javascript/chart.js/chart.min.js";
  s.answer(url(0, 0), 200, feed.since(0, 0).dump());
  json page;
  ASSERT_TRUE(run_page(s, &page));
  EXPECT_EQ(page["uncaught"], json::array());
  EXPECT_EQ(page["dataset"]["chartjs"], "0");
  EXPECT_EQ(page["notice"]["display"], "block");
  const std::string notice = page["notice"]["text"];
  EXPECT_NE(notice.find("(/usr/share/javascript/chart.js/chart.min.js)"), std::string::npos) << notice;
  EXPECT_NE(notice.find("monitor.chartjs"), std::string::npos) << notice;
  EXPECT_EQ(page["tiles"]["update split k"], json({"0.25"}));
  EXPECT_EQ(page["tiles"]["GPU util"], json({"97 %"}));
  EXPECT_EQ(page["dataset"]["points"], "3") << "loss, k and GPU utilisation, counted without charts";
  EXPECT_EQ(card(page, "Loss")["empty"], "none");
  EXPECT_EQ(card(page, "Throughput")["empty"], "block");
  EXPECT_EQ(page["status"]["texts"], json({"finished"}));
}

}  // namespace
}  // namespace tandem
