#include "tandem/core/fault.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"

namespace tandem {
namespace {

// The armed faults: read from TANDEM_FAULTS once, replaced by a FaultScope.
std::atomic<Faults*> g_armed{nullptr};
std::once_flag g_from_env;

int64_t to_int(const std::string& entry, const std::string& text) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  TANDEM_CHECK(!text.empty() && *end == '\0' && v >= 0, "TANDEM_FAULTS: '", entry, "' needs a number >= 0");
  return v;
}

void rank_step(const std::string& entry, const std::string& value, int* rank, int64_t* step) {
  const auto parts = split(value, ':');
  TANDEM_CHECK(parts.size() == 2, "TANDEM_FAULTS: '", entry, "' takes RANK:STEP");
  *rank = static_cast<int>(to_int(entry, parts[0]));
  *step = to_int(entry, parts[1]);
}

const Faults* current() {
  std::call_once(g_from_env, [] {
    const char* env = std::getenv("TANDEM_FAULTS");
    if (env != nullptr && *env != '\0') g_armed.store(new Faults(parse_faults(env)));  // lives for the process
  });
  return g_armed.load();
}

}  // namespace

Faults parse_faults(const std::string& spec) {
  Faults f;
  for (const auto& raw : split(spec, ',')) {
    const std::string entry = trim(raw);
    if (entry.empty()) continue;
    const auto eq = entry.find('=');
    TANDEM_CHECK(eq != std::string::npos, "TANDEM_FAULTS: '", entry, "' is not NAME=VALUE");
    const std::string name = entry.substr(0, eq), value = entry.substr(eq + 1);
    if (name == "kill_after_step")
      rank_step(entry, value, &f.kill_rank, &f.kill_step);
    else if (name == "stop_after_step")
      rank_step(entry, value, &f.stop_rank, &f.stop_step);
    else if (name == "stall_after_step")
      rank_step(entry, value, &f.stall_rank, &f.stall_step);
    else if (name == "every_attempt")
      f.every_attempt = to_int(entry, value) != 0;
    else if (name == "kill_in_checkpoint")
      f.kill_in_checkpoint = to_int(entry, value);
    else if (name == "oom_above_tokens")
      f.oom_above_tokens = to_int(entry, value);
    else
      TANDEM_FAIL("TANDEM_FAULTS: unknown fault '", name,
                  "'; known: kill_after_step, stop_after_step, stall_after_step, every_attempt, kill_in_checkpoint, "
                  "oom_above_tokens");
  }
  return f;
}

const Faults* armed_faults() { return current(); }

void fault_after_step(int rank, int64_t step, int restart_count) {
  const Faults* f = current();
  if (f == nullptr || (restart_count > 0 && !f->every_attempt)) return;
  if (rank == f->kill_rank && step == f->kill_step) ::raise(SIGKILL);
  if (rank == f->stop_rank && step == f->stop_step) ::raise(SIGSTOP);
  while (rank == f->stall_rank && step == f->stall_step) std::this_thread::sleep_for(std::chrono::hours(1));
}

void fault_in_checkpoint(int64_t step) {
  const Faults* f = current();
  if (f != nullptr && f->kill_in_checkpoint == step) ::raise(SIGKILL);
}

bool fault_oom(int64_t tokens) {
  const Faults* f = current();
  return f != nullptr && f->oom_above_tokens > 0 && tokens > f->oom_above_tokens;
}

FaultScope::FaultScope(const std::string& spec) {
  const Faults* before = current();
  if (before != nullptr) previous_ = std::make_unique<Faults>(*before);
  g_armed.store(new Faults(parse_faults(spec)));  // kept: a reader may still hold the previous pointer
}

FaultScope::~FaultScope() { g_armed.store(previous_ ? new Faults(*previous_) : nullptr); }

}  // namespace tandem
