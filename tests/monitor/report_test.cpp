// `tandem report` (monitor/report.h) on hand-written run directories: the plots' coordinates, stacked
// time splits, telemetry from step rows, long series thinned, the summary and config escaped, torn
// lines skipped, and refusals that name what is wrong.
#include "tandem/monitor/report.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "../test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

void write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

std::string rows(std::initializer_list<nlohmann::json> list) {
  std::string out;
  for (const auto& j : list) out += j.dump() + "\n";
  return out;
}

/// The <section> of chart `id` ("" when it was not drawn).
std::string chart(const std::string& html, const std::string& id) {
  const size_t at = html.find("data-chart=\"" + id + "\"");
  if (at == std::string::npos) return "";
  return html.substr(at, html.find("</section>", at) - at);
}

std::string attr(const std::string& html, const std::string& name) {
  const std::string key = name + "=\"";
  const size_t at = html.find(key);
  if (at == std::string::npos) return "<absent>";
  const size_t from = at + key.size();
  return html.substr(from, html.find('"', from) - from);
}

bool has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

TEST(Report, ASeriesIsPlottedOverTheStepsWithRoundTicks) {
  test::TempDir dir;
  write(dir.file("metrics.jsonl"), rows({{{"step", 1}, {"loss", 4.0}}, {{"step", 2}, {"loss", 2.0}}}));
  const std::string html = test::read_text(write_report(dir.path()));
  EXPECT_EQ(attr(html, "data-charts"), "1") << "only the loss has points";
  EXPECT_TRUE(has(html, "2 metric rows, 0 telemetry points")) << html;
  const std::string loss = chart(html, "loss");
  ASSERT_NE(loss, "");
  // x 1 .. 2 over the plot's 490 px from x = 58; y 2 .. 4 padded by 5 % of the range, 204 px from y = 10.
  EXPECT_TRUE(has(loss, R"(points="58.0,19.3 548.0,204.7 ")")) << loss;
  EXPECT_TRUE(has(loss, R"(<circle cx="58.0" cy="19.3" r="3")")) << "two points are marked: " << loss;
  for (const char* tick : {">2</text>", ">2.5</text>", ">3</text>", ">3.5</text>", ">4</text>", ">1.2</text>"})
    EXPECT_TRUE(has(loss, tick)) << tick << " in " << loss;
  EXPECT_TRUE(has(loss, "training")) << "the legend names the series";
  EXPECT_FALSE(has(loss, "held-out")) << "a series without points has no legend entry";
}

TEST(Report, TheStepTimeSplitStacksItsPartsAndDrawsOverlappedTimesAsLines) {
  test::TempDir dir;
  const auto row = [](int step) {
    return nlohmann::json{{"step", step}, {"time_forward_s", 1.0}, {"time_backward_s", 2.0}, {"time_transfer_s", 0.5}};
  };
  write(dir.file("metrics.jsonl"), rows({row(1), row(2)}));
  const std::string split = chart(test::read_text(write_report(dir.path())), "time_split");
  ASSERT_NE(split, "");
  // The axis starts at 0 (a stack), the top is 3 s plus 5 %: forward fills 0 .. 1, backward 1 .. 3.
  EXPECT_TRUE(has(split, R"(points="58.0,149.2 548.0,149.2 548.0,214.0 58.0,214.0 ")")) << split;
  EXPECT_TRUE(has(split, R"(points="58.0,19.7 548.0,19.7 548.0,149.2 58.0,149.2 ")")) << split;
  EXPECT_TRUE(has(split, R"(stroke-dasharray="5 3" points="58.0,181.6 548.0,181.6 ")"))
      << "the overlapped transfers are a dashed line at their own value: " << split;
}

TEST(Report, TheSplitKAxisStartsAtZero) {
  test::TempDir dir;
  write(dir.file("metrics.jsonl"), rows({{{"step", 1}, {"offload_k", 0.5}}, {{"step", 2}, {"offload_k", 0.75}}}));
  const std::string k = chart(test::read_text(write_report(dir.path())), "split_k");
  EXPECT_TRUE(has(k, R"(points="58.0,84.5 548.0,19.7 ")")) << k;
}

TEST(Report, AFinishedRunsTelemetryComesFromItsStepRows) {
  test::TempDir dir;
  write(dir.file("metrics.jsonl"),
        rows({{{"step", 1}, {"loss", 3.0}, {"t_s", 0.5}, {"cpu_util_pct", 20.0}, {"host_mem_used_bytes", 1 << 30}},
              {{"step", 2}, {"loss", 2.5}, {"t_s", 1.0}, {"cpu_util_pct", 40.0}, {"host_mem_used_bytes", 1LL << 31}},
              {{"step", 2}, {"eval_loss", 2.7}}}));
  const std::string html = test::read_text(write_report(dir.path()));
  EXPECT_TRUE(has(html, "3 metric rows, 2 telemetry points")) << "the evaluation row is no sample";
  EXPECT_EQ(attr(html, "data-charts"), "3");
  EXPECT_NE(chart(html, "util"), "");
  const std::string memory = chart(html, "memory");
  ASSERT_NE(memory, "");
  EXPECT_TRUE(has(memory, "<small>(GiB)</small>")) << memory;
  EXPECT_TRUE(has(memory, ">1.5</text>")) << "bytes shown in GiB (1 .. 2): " << memory;
  EXPECT_TRUE(has(memory, "seconds since start")) << memory;
  EXPECT_TRUE(has(chart(html, "loss"), "held-out")) << "the evaluation is drawn beside the training loss";
}

TEST(Report, OnePointIsDrawnInTheMiddleOfItsChart) {
  test::TempDir dir;
  write(dir.file("metrics.jsonl"), rows({{{"step", 5}, {"loss", 2.0}}}));
  const std::string loss = chart(test::read_text(write_report(dir.path())), "loss");
  EXPECT_TRUE(has(loss, R"(<circle cx="58.0" cy="112.0")")) << loss;
}

// A flat loss whose values differ by one ULP gets the band of equal values (the ticks once looped
// forever: a step below the values' precision never moved).
TEST(Report, ValuesAFewUlpsApartAreDrawnAsAFlatLine) {
  test::TempDir dir;
  write(dir.file("metrics.jsonl"),
        rows({{{"step", 1}, {"loss", 2.0}}, {{"step", 2}, {"loss", std::nextafter(2.0, 3.0)}}}));
  const std::string loss = chart(test::read_text(write_report(dir.path())), "loss");
  ASSERT_NE(loss, "");
  for (const char* tick : {">1.8</text>", ">2</text>", ">2.2</text>"}) EXPECT_TRUE(has(loss, tick)) << tick << loss;
}

TEST(Report, LongSeriesAreThinnedButKeepTheirLastPoint) {
  test::TempDir dir;
  std::string text;
  for (int step = 1; step <= 4500; ++step)
    text += nlohmann::json{{"step", step}, {"loss", 5.0 - step / 1000.0}}.dump() + "\n";
  text += nlohmann::json{{"step", 4500}, {"eval_loss", 1.0}}.dump() + "\n";
  write(dir.file("metrics.jsonl"), text);
  const std::string loss = chart(test::read_text(write_report(dir.path())), "loss");
  const std::string key = R"(stroke="#2f6fde" stroke-width="1.5" points=")";
  const size_t at = loss.find(key);
  ASSERT_NE(at, std::string::npos) << loss.substr(0, 2000);
  const std::string points = loss.substr(at + key.size(), loss.find('"', at + key.size()) - at - key.size());
  // Every third of 4500 points (stride ceil(4500 / 2000)), then the last.
  EXPECT_EQ(std::count(points.begin(), points.end(), ' '), 1501);
  EXPECT_TRUE(has(points, "548.0,")) << "the last step is at the right edge";
  EXPECT_FALSE(has(loss, R"(<circle cx="58.0")")) << "a long line needs no markers";
  EXPECT_TRUE(has(loss, R"(<circle cx="548.0")")) << "the single evaluation is marked";
}

TEST(Report, TheSummaryTableFlattensNestedKeysAndEverythingIsEscaped) {
  test::TempDir root;
  const std::string dir = root.file("run<1>&");
  write(dir + "/metrics.jsonl", rows({{{"step", 1}, {"loss", 2.0}}}));
  write(dir + "/summary.json",
        R"({"median_tokens_per_s": 1234.56789, "run": {"name": "a<b", "steps": 3}, "ok": true, "k": [1, 2]})");
  write(dir + "/config.yaml", "model:\n  preset: \"<tiny>\" & co\n");
  const std::string html = test::read_text(write_report(dir));
  EXPECT_TRUE(has(html, "<tr><th>median_tokens_per_s</th><td>1234.57</td></tr>")) << "floats to 6 figures";
  EXPECT_TRUE(has(html, "<tr><th>run.name</th><td>a&lt;b</td></tr>")) << html;
  EXPECT_TRUE(has(html, "<tr><th>run.steps</th><td>3</td></tr>"));
  EXPECT_TRUE(has(html, "<tr><th>ok</th><td>true</td></tr>"));
  EXPECT_TRUE(has(html, "<tr><th>k</th><td>[1,2]</td></tr>"));
  EXPECT_TRUE(has(html, "preset: &quot;&lt;tiny&gt;&quot; &amp; co")) << "the config as written, escaped";
  EXPECT_TRUE(has(html, "<title>tandem report: run&lt;1&gt;&amp;</title>"));
  EXPECT_FALSE(has(html, "<tiny>"));
  EXPECT_FALSE(has(html, "<script"));
}

TEST(Report, AnUnfinishedRunSaysWhatItLacks) {
  test::TempDir dir;
  write(dir.file("metrics.jsonl"), rows({{{"step", 1}, {"loss", 2.0}}}));
  const std::string html = test::read_text(write_report(dir.path()));
  EXPECT_TRUE(has(html, "(no summary.json: the run did not finish)"));
  EXPECT_TRUE(has(html, "(no config.yaml)"));
}

TEST(Report, TornAndForeignLinesAreSkipped) {
  test::TempDir dir;
  write(dir.file("metrics.jsonl"),
        "not json\n" + rows({{{"step", 1}, {"loss", 2.0}}}) + "[1, 2]\n\n{\"step\": 2, \"loss\"");  // cut mid-write
  const std::string html = test::read_text(write_report(dir.path()));
  EXPECT_TRUE(has(html, "1 metric rows, 0 telemetry points")) << html.substr(0, 3000);
}

TEST(Report, ItIsWrittenWhereAskedAndReplacesAnOlderOne) {
  test::TempDir dir, out;
  write(dir.file("metrics.jsonl"), rows({{{"step", 1}, {"loss", 2.0}}}));
  write(out.file("r.html"), "old");
  EXPECT_EQ(write_report(dir.path(), out.file("r.html")), out.file("r.html"));
  EXPECT_TRUE(has(test::read_text(out.file("r.html")), "<!doctype html>"));
  EXPECT_FALSE(fs::exists(dir.file("report.html"))) << "nothing beside the metrics";
}

TEST(Report, RefusalsNameWhatIsWrong) {
  test::TempDir dir;
  write(dir.file("file"), "x");
  EXPECT_TRUE(has(test::error_of([&] { write_report(dir.file("file")); }), "is not a directory"));
  EXPECT_TRUE(has(test::error_of([&] { write_report(dir.file("missing")); }), "is not a directory"));
  write(dir.file("run/metrics.jsonl"), rows({{{"step", 1}, {"loss", 2.0}}}));
  write(dir.file("run/summary.json"), "{\"cut\": ");
  const std::string err = test::error_of([&] { write_report(dir.file("run")); });
  EXPECT_TRUE(has(err, "summary.json' is not valid JSON")) << err;
  EXPECT_TRUE(has(err, "move it away")) << err;
  EXPECT_FALSE(fs::exists(dir.file("run/report.html")));
}

}  // namespace
}  // namespace tandem
