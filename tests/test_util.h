#pragma once
// Shared test helpers: temporary directories and element-wise tensor comparison that reports
// the worst element and where it is.

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>

#include "error_of.h"
#include "tandem/core/config.h"
#include "tandem/core/error.h"
#include "tandem/models/recipe.h"

namespace tandem::test {

/// A fresh directory removed at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tandem-test-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }

 private:
  std::string path_;
};

/// |a - b| <= atol + rtol * |b| element-wise; on failure names the worst element.
inline ::testing::AssertionResult AllClose(const torch::Tensor& actual, const torch::Tensor& expected, double rtol,
                                           double atol) {
  if (actual.sizes() != expected.sizes())
    return ::testing::AssertionFailure() << "shape " << actual.sizes() << " != " << expected.sizes();
  auto a = actual.detach().to(torch::kCPU, torch::kFloat64).flatten();
  auto b = expected.detach().to(torch::kCPU, torch::kFloat64).flatten();
  if (!torch::isfinite(a).all().item<bool>()) return ::testing::AssertionFailure() << "non-finite values in actual";
  auto excess = (a - b).abs() - (atol + rtol * b.abs());
  const int64_t worst = excess.argmax().item<int64_t>();
  if (excess[worst].item<double>() > 0) {
    return ::testing::AssertionFailure() << "worst element at flat index " << worst << ": actual "
                                         << a[worst].item<double>() << ", expected " << b[worst].item<double>()
                                         << " (rtol " << rtol << ", atol " << atol << ")";
  }
  return ::testing::AssertionSuccess();
}

/// A short CPU run of the tiny preset on a small generated corpus, writing to `dir`.
inline Config tiny_cpu_config(const std::string& dir, int64_t steps) {
  Config c;
  c.model.preset = "tiny";
  c.train.steps = steps;
  c.train.micro_batch = 8;
  c.train.seq_len = 64;
  c.train.device.kind = DeviceSpec::Kind::kCpu;
  c.train.eval_every = 0;
  c.train.progress = ProgressMode::kOff;
  c.train.run_dir = dir;
  c.data.synthetic_bytes = 200000;
  apply_preset_recipe(c);  // as `tandem train` lays it: 3e-3 for tiny on the generated corpus
  c.optim.warmup_steps = 10;
  return c;
}

/// A whole file as text ("" when it cannot be read).
inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// Where tests leave files for people to look at (screenshots): test-artifacts/ beside the binary.
inline std::string artifact_dir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  buf[n > 0 ? n : 0] = 0;
  const auto dir = std::filesystem::path(buf).parent_path() / "test-artifacts";
  std::filesystem::create_directories(dir);
  return dir.string();
}

/// Path of the tandem CLI next to the test binary.
inline std::string cli_path() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  buf[n > 0 ? n : 0] = 0;
  return (std::filesystem::path(buf).parent_path() / "tandem").string();
}

}  // namespace tandem::test
