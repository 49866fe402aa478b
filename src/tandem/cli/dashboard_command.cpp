#include "tandem/cli/dashboard_command.h"

#include <signal.h>

#include <CLI/CLI.hpp>
#include <filesystem>

#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/monitor/run_feed.h"
#include "tandem/monitor/web_server.h"

namespace tandem {

DashboardCommand::DashboardCommand(CLI::App& app) {
  auto* c = command_ = app.add_subcommand(
      "dashboard", "serve the dashboard for a run directory (finished, or written by another process)");
  c->add_option("run_dir", run_dir_, "run directory")->required();
  c->add_option("--port", port_, "port (default 8080)")->check(CLI::Range(1, 65535));
  c->add_option("--bind", bind_, "address to listen on (default 127.0.0.1: this machine only)");
  c->add_option("--chartjs", chartjs_, "Chart.js file to serve (default Debian's libjs-chart.js)");
}

bool DashboardCommand::chosen() const { return command_->parsed(); }

int DashboardCommand::run() {
  namespace fs = std::filesystem;
  const std::string& dir = run_dir_;
  TANDEM_CHECK(fs::is_directory(dir), "'", dir, "' is not a directory; give a run directory (runs/<name>)");
  TANDEM_CHECK(fs::exists(fs::path(dir) / "metrics.jsonl") || fs::exists(fs::path(dir) / "config.yaml"), "'", dir,
               "' holds no metrics.jsonl or config.yaml; give the directory a `tandem train` run writes");
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before the server's thread starts: it inherits the mask
  RunFeed feed;
  feed.set_info({{"run_dir", dir}, {"mode", "viewing metrics.jsonl"}});
  WebServerOptions o;
  o.host = bind_;
  o.port = port_;
  o.chartjs_path = chartjs_;
  o.follow_metrics = (fs::path(dir) / "metrics.jsonl").string();
  fs::path run = fs::absolute(dir).lexically_normal();
  if (run.filename().empty()) run = run.parent_path();  // runs/x/ names x as runs/x does
  o.run_label = run.filename().string();
  WebServer server(feed, o);
  if (!server.warning().empty()) log::warn(server.warning());
  log::info("dashboard for " + dir + " at " + server.url() + " (Ctrl-C to stop)");
  int sig = 0;
  sigwait(&set, &sig);
  return 0;
}

}  // namespace tandem
