#pragma once
// tandem's HTTP endpoints (cpp-httplib), on loopback unless told otherwise: the live dashboard
// (/, /chart.js, /api/series) and the Prometheus exposition (/metrics), both read from a RunFeed.
// A build without cpp-httplib has the class but refuses to start it, with the reason.

#include <memory>
#include <string>

namespace tandem {

class RunFeed;

struct WebServerOptions {
  std::string host = "127.0.0.1";  ///< monitor.bind; 0.0.0.0 exposes the run to the network
  int port = 0;                    ///< 0 = any free port (tests)
  bool dashboard = true;           ///< serve the dashboard page and its data
  bool metrics = true;             ///< serve /metrics
  std::string chartjs_path;        ///< Chart.js (UMD build) served as /chart.js; "" = Debian's
  std::string follow_metrics;      ///< a metrics.jsonl to follow on each request (`tandem dashboard`)
  std::string run_label;           ///< the run="..." label of every Prometheus series
};

/// Debian's libjs-chart.js UMD build.
extern const char* const kDefaultChartJs;

class WebServer {
 public:
  /// Binds and starts serving on a thread; UserError when the port is taken or the build has no
  /// HTTP support.
  WebServer(RunFeed& feed, WebServerOptions options);
  ~WebServer();
  WebServer(const WebServer&) = delete;
  WebServer& operator=(const WebServer&) = delete;
  int port() const;
  /// http://host:port/
  std::string url() const;
  /// Empty, or why the dashboard has no charts (Chart.js missing), said once at start.
  const std::string& warning() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The dashboard page (HTML and script; the chart list is filled in by the server).
const std::string& dashboard_page();

}  // namespace tandem
