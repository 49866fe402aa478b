#include "tandem/monitor/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "tandem/core/error.h"
#include "tandem/core/fs.h"
#include "tandem/core/strings.h"
#include "tandem/monitor/run_feed.h"
#include "tandem/monitor/series.h"

namespace fs = std::filesystem;

namespace tandem {
namespace {

const char* const kColors[] = {"#2f6fde", "#e0701b", "#2a9d5b", "#b03aa6", "#c7372f", "#6d5bd0", "#8a8f98"};

std::string html_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

/// Round tick positions covering [lo, hi], about `n` of them.
std::vector<double> nice_ticks(double lo, double hi, int n) {
  std::vector<double> ticks;
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (const double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  // At most a few dozen ticks, and none where the step is below the values' precision (a range of
  // a few ULPs: t + step would equal t).
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9 && ticks.size() < 64 && t + step > t; t += step)
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  if (ticks.empty()) ticks.push_back(lo);
  return ticks;
}

std::string tick_label(double v) {
  const double a = std::abs(v);
  if (a != 0 && (a >= 1e5 || a < 1e-3)) return strprintf("%.2g", v);
  return strprintf("%g", std::round(v * 1e4) / 1e4);
}

struct Line {
  std::string label;
  bool overlay;
  std::vector<std::pair<double, double>> pts;
  std::vector<double> base;  ///< stacked: the cumulative value below this series (filled between)
};

/// One chart as inline SVG; "" when none of its series has a point.
std::string svg_chart(const ChartSpec& spec, const nlohmann::json& items) {
  const char* axis = spec.axis == ChartSpec::Axis::kSteps ? "step" : "t_s";
  std::vector<Line> lines;
  for (const auto& s : spec.series) {
    Line l{s.label, s.overlay, {}, {}};
    for (const auto& it : items)
      if (it.contains(axis) && it[axis].is_number() && it.contains(s.key) && it[s.key].is_number())
        l.pts.emplace_back(it[axis].get<double>(), it[s.key].get<double>() * spec.scale);
    lines.push_back(std::move(l));
  }
  // Stacked: the non-overlay series add up, step by step (every step row carries all of them).
  if (spec.stacked) {
    const Line* prev = nullptr;
    for (auto& l : lines) {
      if (l.overlay || l.pts.empty()) continue;
      l.base.assign(l.pts.size(), 0.0);
      if (prev && prev->pts.size() == l.pts.size())
        for (size_t i = 0; i < l.pts.size(); ++i) {
          l.base[i] = prev->pts[i].second;
          l.pts[i].second += l.base[i];
        }
      prev = &l;
    }
  }
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& l : lines)
    for (const auto& [x, y] : l.pts)
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
  if (!std::isfinite(x0)) return "";
  if (spec.stacked || spec.id == "split_k") y0 = std::min(y0, 0.0);
  if (x1 == x0) x1 = x0 + 1;
  // Equal values, or values a few ULPs apart (a flat loss): a band of 10 % around them.
  if (y1 - y0 <= std::abs(y0) * 1e-12)
    y1 = y0 + (y0 == 0 ? 1 : std::abs(y0) * 0.1), y0 -= (y0 == 0 ? 0 : std::abs(y0) * 0.1);
  const double pad = (y1 - y0) * 0.05;
  if (!(spec.stacked || spec.id == "split_k") || y0 < 0) y0 -= pad;
  y1 += pad;

  const double W = 560, H = 250, L = 58, R = 12, T = 10, B = 36;
  const auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  const auto py = [&](double y) { return T + (1 - (y - y0) / (y1 - y0)) * (H - T - B); };
  std::string svg = strprintf(R"(<svg viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" role="img">)", W, H, W, H);
  svg += strprintf(R"(<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#fff" stroke="#dde2ea"/>)", L, T,
                   W - L - R, H - T - B);
  for (const double t : nice_ticks(y0, y1, 5)) {
    svg += strprintf(R"(<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#eef1f5"/>)", L, W - R, py(t), py(t));
    svg += strprintf(R"(<text x="%.1f" y="%.1f" text-anchor="end" font-size="10" fill="#5d6678">%s</text>)", L - 4,
                     py(t) + 3, tick_label(t).c_str());
  }
  for (const double t : nice_ticks(x0, x1, 6))
    svg += strprintf(R"(<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10" fill="#5d6678">%s</text>)", px(t),
                     H - B + 14, tick_label(t).c_str());
  svg += strprintf(R"(<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10" fill="#5d6678">%s</text>)",
                   L + (W - L - R) / 2, H - 6, spec.axis == ChartSpec::Axis::kSteps ? "step" : "seconds since start");
  constexpr size_t kMaxPoints = 2000;
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto& l = lines[i];
    if (l.pts.empty()) continue;
    const size_t stride = (l.pts.size() + kMaxPoints - 1) / kMaxPoints;
    std::string pts;
    std::vector<size_t> idx;
    for (size_t k = 0; k < l.pts.size(); k += stride) idx.push_back(k);
    if (idx.back() != l.pts.size() - 1) idx.push_back(l.pts.size() - 1);
    for (const size_t k : idx) pts += strprintf("%.1f,%.1f ", px(l.pts[k].first), py(l.pts[k].second));
    if (!l.base.empty()) {  // a stacked part: the band between the series below and this one
      std::string band = pts;
      for (auto it = idx.rbegin(); it != idx.rend(); ++it)
        band += strprintf("%.1f,%.1f ", px(l.pts[*it].first), py(l.base[*it]));
      svg += strprintf(R"(<polygon fill="%s" fill-opacity="0.45" stroke="none" points="%s"/>)", kColors[i % 7],
                       band.c_str());
    }
    if (l.pts.size() <= 3)  // too few points for a visible line (one evaluation): mark them
      for (const auto& [x, y] : l.pts)
        svg += strprintf(R"(<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>)", px(x), py(y), kColors[i % 7]);
    svg += strprintf(R"(<polyline fill="none" stroke="%s" stroke-width="1.5"%s points="%s"/>)", kColors[i % 7],
                     l.overlay ? R"( stroke-dasharray="5 3")" : "", pts.c_str());
  }
  svg += "</svg>";
  std::string legend = R"(<div class="legend">)";
  for (size_t i = 0; i < lines.size(); ++i)
    if (!lines[i].pts.empty())
      legend += strprintf(R"(<span><i style="background:%s"></i>%s</span>)", kColors[i % 7],
                          html_escape(lines[i].label).c_str());
  legend += "</div>";
  return legend + svg;
}

std::string summary_rows(const nlohmann::json& j, const std::string& prefix) {
  std::string out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = prefix + it.key();
    if (it->is_object()) {
      out += summary_rows(*it, key + ".");
      continue;
    }
    std::string v;
    if (it->is_number_float())
      v = strprintf("%.6g", it->get<double>());
    else if (it->is_string())
      v = it->get<std::string>();
    else
      v = it->dump();
    out += "<tr><th>" + html_escape(key) + "</th><td>" + html_escape(v) + "</td></tr>\n";
  }
  return out;
}

}  // namespace

std::string write_report(const std::string& run_dir, const std::string& out_path) {
  const fs::path dir(run_dir), metrics = dir / "metrics.jsonl";
  TANDEM_CHECK(fs::is_directory(dir), "'", run_dir, "' is not a directory; give a run directory (runs/<name>)");
  TANDEM_CHECK(fs::exists(metrics), "'", run_dir,
               "' has no metrics.jsonl; give the directory a `tandem train` run wrote");
  RunFeed feed(1u << 20, 1u << 20);
  feed.follow(metrics.string());
  const nlohmann::json data = feed.since(0, 0);
  nlohmann::json summary = nlohmann::json::object();
  if (fs::exists(dir / "summary.json")) {
    summary = nlohmann::json::parse(read_file((dir / "summary.json").string(), "run summary"), nullptr, false);
    TANDEM_CHECK(
        !summary.is_discarded(), "'", (dir / "summary.json").string(),
        "' is not valid JSON; the run may have been cut off (the report needs only metrics.jsonl: move it away)");
  }
  const std::string config =
      fs::exists(dir / "config.yaml") ? read_file((dir / "config.yaml").string(), "run config") : "(no config.yaml)";

  std::string charts;
  int drawn = 0;
  for (const auto& spec : chart_specs()) {
    const std::string svg = svg_chart(spec, spec.axis == ChartSpec::Axis::kSteps ? data["rows"] : data["samples"]);
    if (svg.empty()) continue;
    ++drawn;
    charts += "<section class=\"card\" data-chart=\"" + spec.id + "\"><h2>" + html_escape(spec.title) +
              (spec.unit.empty() ? "" : " <small>(" + html_escape(spec.unit) + ")</small>") + "</h2>" + svg +
              "</section>\n";
  }
  const std::string name = fs::absolute(dir).lexically_normal().filename().string();
  std::string html = R"(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tandem report: )" +
                     html_escape(name) + R"(</title>
<style>
body { margin:0; padding:18px 24px; font:14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color:#1d2330; background:#f4f6fa; }
h1 { font-size:20px; margin:0 0 4px; } h2 { font-size:14px; margin:0 0 4px; } h2 small { color:#5d6678; font-weight:normal; }
.grid { display:grid; grid-template-columns:repeat(auto-fill, minmax(580px, 1fr)); gap:14px; margin:14px 0; }
.card { background:#fff; border:1px solid #dde2ea; border-radius:8px; padding:10px 12px; }
.legend { font-size:11px; color:#5d6678; margin-bottom:2px; } .legend span { margin-right:12px; white-space:nowrap; }
.legend i { display:inline-block; width:10px; height:10px; margin-right:4px; vertical-align:-1px; border-radius:2px; }
table { border-collapse:collapse; font-size:12px; } th { text-align:left; font-weight:normal; color:#5d6678; padding:2px 14px 2px 0; }
td { font-variant-numeric:tabular-nums; } pre { font-size:12px; background:#fff; border:1px solid #dde2ea; border-radius:8px; padding:10px; overflow:auto; }
.cols { display:grid; grid-template-columns:1fr 1fr; gap:14px; }
</style></head>
<body data-charts=")" +
                     std::to_string(drawn) +
                     R"(">
<h1>tandem run )" + html_escape(name) +
                     "</h1>\n<div>" + std::to_string(data["rows"].size()) + " metric rows, " +
                     std::to_string(data["samples"].size()) + " telemetry points</div>\n<div class=\"grid\">\n" +
                     charts + "</div>\n<div class=\"cols\"><section class=\"card\"><h2>Summary</h2><table>\n" +
                     (summary.empty() ? std::string("<tr><td>(no summary.json: the run did not finish)</td></tr>")
                                      : summary_rows(summary, "")) +
                     "</table></section>\n<section class=\"card\"><h2>Config</h2><pre>" + html_escape(config) +
                     "</pre></section></div>\n</body></html>\n";
  const std::string out = out_path.empty() ? (dir / "report.html").string() : out_path;
  write_file_atomic(out, html);
  return out;
}

}  // namespace tandem
