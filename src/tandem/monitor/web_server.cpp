#include "tandem/monitor/web_server.h"

#include "tandem/core/error.h"
#include "tandem/core/fs.h"
#include "tandem/core/http_listener.h"
#include "tandem/core/strings.h"
#include "tandem/monitor/prometheus.h"
#include "tandem/monitor/run_feed.h"
#include "tandem/monitor/series.h"

#ifdef TANDEM_WITH_HTTP
#include <httplib.h>

#include <filesystem>
#endif

namespace tandem {

const char* const kDefaultChartJs = "/usr/share/javascript/chart.js/chart.min.js";

#ifdef TANDEM_WITH_HTTP

struct WebServer::Impl {
  RunFeed& feed;
  WebServerOptions options;
  httplib::Server server;
  std::string chartjs, page, warning;
  std::unique_ptr<HttpListener> listener;  // last: stopped and joined before the routes' state goes
  Impl(RunFeed& f, WebServerOptions o) : feed(f), options(std::move(o)) {}

  // `tandem dashboard`: the followed metrics.jsonl's new rows, and a run that wrote its summary
  // has finished (the page stops polling; /metrics says tandem_up 0).
  void follow() {
    if (options.follow_metrics.empty()) return;
    feed.follow(options.follow_metrics);
    if (std::filesystem::exists(std::filesystem::path(options.follow_metrics).parent_path() / "summary.json"))
      feed.finish();
  }
};

namespace {

int64_t query_int(const httplib::Request& req, const char* key) {
  if (!req.has_param(key)) return 0;
  try {
    return std::stoll(req.get_param_value(key));
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

WebServer::WebServer(RunFeed& feed, WebServerOptions options)
    : impl_(std::make_unique<Impl>(feed, std::move(options))) {
  auto& im = *impl_;
  const auto& o = im.options;
  if (o.dashboard) {
    const std::string path = o.chartjs_path.empty() ? kDefaultChartJs : o.chartjs_path;
    if (std::filesystem::is_regular_file(path)) {
      im.chartjs = read_file(path, "Chart.js");
    } else {
      im.warning = "dashboard: Chart.js not found at " + path +
                   "; the page shows figures without charts (install Debian's libjs-chart.js or set monitor.chartjs)";
      im.chartjs = "window.tandemChartJsMissing = " + nlohmann::json(path).dump() + ";\n";
    }
    im.page = dashboard_page();
    const std::string marker = "/*CHARTS*/null";
    im.page.replace(im.page.find(marker), marker.size(), chart_specs_json().dump());
    im.server.Get("/", [&im](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-store");
      res.set_content(im.page, "text/html; charset=utf-8");
    });
    im.server.Get("/chart.js", [&im](const httplib::Request&, httplib::Response& res) {
      res.set_content(im.chartjs, "application/javascript");
    });
    im.server.Get("/api/series", [&im](const httplib::Request& req, httplib::Response& res) {
      im.follow();
      res.set_header("Cache-Control", "no-store");
      res.set_content(im.feed.since(query_int(req, "row"), query_int(req, "sample")).dump(), "application/json");
    });
  }
  if (o.metrics) {
    im.server.Get("/metrics", [&im](const httplib::Request&, httplib::Response& res) {
      im.follow();
      res.set_content(prometheus_text(im.feed, im.options.run_label), "text/plain; version=0.0.4; charset=utf-8");
    });
  }
  im.server.Get("/healthz",
                [](const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", "text/plain"); });
  im.listener = std::make_unique<HttpListener>(im.server, o.host, o.port, "pick another port or check monitor.bind");
}

WebServer::~WebServer() = default;

int WebServer::port() const { return impl_->listener->port(); }
std::string WebServer::url() const {
  const std::string& h = impl_->options.host;
  return "http://" + (h == "0.0.0.0" ? std::string("127.0.0.1") : h) + ":" + std::to_string(port()) + "/";
}
const std::string& WebServer::warning() const { return impl_->warning; }

#else  // no cpp-httplib at build time

struct WebServer::Impl {
  std::string warning;
};

WebServer::WebServer(RunFeed&, WebServerOptions) {
  TANDEM_FAIL(
      "this tandem was built without cpp-httplib, so it has no dashboard or /metrics endpoint; install "
      "Debian's libcpp-httplib-dev and rebuild (scripts/setup.sh)");
}
WebServer::~WebServer() = default;
int WebServer::port() const { return 0; }
std::string WebServer::url() const { return ""; }
const std::string& WebServer::warning() const { return impl_->warning; }

#endif

}  // namespace tandem
