#pragma once
// Runs of the CLI for the multi-process tests: one process, or several under `tandem launch` on
// loopback, and the losses they wrote (tests/parallel/dist_test.cpp, tests/parallel/pipeline_test.cpp).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include "../test_util.h"

namespace tandem::test {

struct Result {
  int code = -1;
  std::string out;
};

inline Result sh(const std::string& cmd, const std::string& log) {
  const int status = std::system((cmd + " >" + log + " 2>&1").c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(log)};
}

// A port per test and process, so tests running side by side do not meet; all below Linux's
// ephemeral range (32768 and up), where the outgoing connections of other tests (Gloo's pairs, HTTP
// clients) take their ports and made a rendezvous port taken now and then (EADDRINUSE).
inline int port(int k) { return 20000 + (getpid() % 600) * 20 + k; }

inline std::string train_args(const std::string& dir, int steps, const std::string& extra) {
  return "--preset tiny --device cpu --steps " + std::to_string(steps) +
         " --set train.seq_len=64 --set train.eval_every=0 --set train.progress=off --set data.synthetic_bytes=200000"
         " --set monitor.enabled=false --set optim.warmup_steps=5 --set optim.lr=1e-3 --run-dir " +
         dir + " " + extra;
}

inline Result train_one(const std::string& dir, int steps, const std::string& extra) {
  return sh("OMP_NUM_THREADS=1 " + cli_path() + " train " + train_args(dir, steps, extra), dir + ".log");
}

inline Result launch(int n, int p, const std::string& dir, int steps, const std::string& extra,
                     const std::string& launcher = "", const std::string& env = "") {
  return sh("env OMP_NUM_THREADS=1 " + env + " " + cli_path() + " launch --nproc-per-node " + std::to_string(n) +
                " --master-port " + std::to_string(p) + " " + launcher + " -- " + cli_path() + " train " +
                train_args(dir, steps, extra),
            dir + ".log");
}

// `key`'s value in every metrics row that has it, by step, in file order (a restarted run repeats
// steps: the later row wins).
inline std::map<int64_t, double> metric(const std::string& dir, const std::string& key) {
  std::map<int64_t, double> out;
  std::ifstream in(dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains(key) && j[key].is_number()) out[j["step"].get<int64_t>()] = j[key].get<double>();
  }
  return out;
}

// The loss of every step row.
inline std::map<int64_t, double> losses(const std::string& dir) { return metric(dir, "loss"); }

inline void expect_same_losses(const std::map<int64_t, double>& a, const std::map<int64_t, double>& b, double rtol) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (const auto& [step, loss] : a) {
    ASSERT_TRUE(b.count(step)) << "step " << step;
    EXPECT_NEAR(loss, b.at(step), rtol * std::abs(loss)) << "step " << step;
  }
}

}  // namespace tandem::test
