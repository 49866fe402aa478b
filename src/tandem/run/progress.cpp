#include "tandem/run/progress.h"

#include <unistd.h>

#include <cstdio>

#include "tandem/core/log.h"
#include "tandem/core/strings.h"

namespace tandem {

std::string format_duration(double s) {
  if (!(s >= 0) || s > 1e8) return "--:--";
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

Progress::Progress(ProgressMode mode, int64_t log_every) : log_every_(log_every) {
  off_ = mode == ProgressMode::kOff;
  bar_ = mode == ProgressMode::kBar || (mode == ProgressMode::kAuto && isatty(STDERR_FILENO));
}

void Progress::update(const ProgressSample& s) {
  if (off_) return;
  char rate[32];
  std::snprintf(rate, sizeof rate, "%s tok/s", format_count(s.tokens_per_s).c_str());
  if (bar_) {
    const int width = 24;
    const int filled = s.total > 0 ? static_cast<int>(width * double(s.step) / double(s.total)) : 0;
    std::string bar(filled, '=');
    if (filled < width) bar += '>' + std::string(width - filled - 1, ' ');
    std::fprintf(stderr, "\r\033[K%lld/%lld [%s] loss %.4f | lr %.2e | %s | ETA %s%s%s", static_cast<long long>(s.step),
                 static_cast<long long>(s.total), bar.c_str(), s.loss, s.lr, rate, format_duration(s.eta_s).c_str(),
                 s.extra.empty() ? "" : " | ", s.extra.c_str());
    std::fflush(stderr);
    bar_open_ = true;
    return;
  }
  if (s.step % log_every_ != 0 && s.step != s.total) return;
  log::info(strprintf("step %lld/%lld | loss %.4f | lr %.2e | %s | %.0f ms/step | ETA %s%s%s",
                      static_cast<long long>(s.step), static_cast<long long>(s.total), s.loss, s.lr, rate,
                      s.step_time_s * 1e3, format_duration(s.eta_s).c_str(), s.extra.empty() ? "" : " | ",
                      s.extra.c_str()));
}

void Progress::message(const std::string& line) {
  if (bar_open_) {
    std::fprintf(stderr, "\n");
    bar_open_ = false;
  }
  log::info(line);
}

void Progress::finish() {
  if (bar_open_) std::fprintf(stderr, "\n");
  bar_open_ = false;
}

}  // namespace tandem
