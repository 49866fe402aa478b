// Device facts behind core/device.h: the accelerator slot a backend registers into (exercised in a
// forked child, so the test process keeps its own backend), and the host memory counters read from
// /proc in bytes.

#include "tandem/core/device.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace tandem {
namespace {

class FakeBackend : public AcceleratorBackend {
 public:
  int device_count() const override { return 3; }
  std::string device_name(int index) const override { return "fake" + std::to_string(index); }
  DeviceMemoryStats memory_stats(int index) const override {
    DeviceMemoryStats s;
    s.total = 1000 + index;
    return s;
  }
  void reset_peak_memory(int) override {}
  void empty_cache(int) override {}
  void synchronize(int) override {}
  std::string rng_state(int) const override { return "state"; }
  void set_rng_state(int, const std::string&) override {}
  bool host_register(void*, size_t) override { return false; }
  void host_unregister(void*) override {}
  std::string pci_bus_id(int) const override { return "0000:00:00.0"; }
};

// Exit codes name the first expectation that failed.
void register_and_replace() {
  auto owned = std::make_unique<FakeBackend>();
  AcceleratorBackend* fake = owned.get();
  register_accelerator(std::move(owned));
  if (accelerator() != fake) _exit(10);
  if (accelerator()->device_count() != 3 || accelerator()->device_name(2) != "fake2") _exit(11);
  if (accelerator()->memory_stats(1).total != 1001) _exit(12);
  register_accelerator(std::make_unique<FakeBackend>());
  if (accelerator() == fake || accelerator() == nullptr) _exit(13);
  register_accelerator(nullptr);
  if (accelerator() != nullptr) _exit(14);
  _exit(0);
}

TEST(Device, ARegisteredBackendIsTheAcceleratorUntilReplaced) {
  EXPECT_EXIT(register_and_replace(), ::testing::ExitedWithCode(0), "");
}

// "Field:   123 kB" of a /proc file, in bytes; -1 when absent.
int64_t proc_field_bytes(const char* file, const std::string& field) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(field.size())) * 1024;
  return -1;
}

// Resident bytes now, from /proc/self/statm (pages): a source device.cpp does not read.
int64_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

TEST(Device, PeakResidentSizeIsInBytesAndCoversMemoryJustTouched) {
  const int64_t before = host_peak_rss_bytes();
  ASSERT_GT(before, 0);
  EXPECT_EQ(before % 1024, 0) << "VmHWM is in kB";
  const int64_t bytes = int64_t{64} << 20;
  std::vector<char> block(bytes);
  std::memset(block.data(), 1, block.size());
  const int64_t now = resident_bytes();
  ASSERT_GE(now, bytes) << "the touched block is not resident";
  const int64_t peak = host_peak_rss_bytes();
  EXPECT_GE(peak, now) << "the peak is below the resident size";
  EXPECT_GE(peak, before);
  volatile char sink = block[bytes / 2];
  (void)sink;
}

TEST(Device, AvailableMemoryIsMemAvailableInBytes) {
  const int64_t ours = proc_field_bytes("/proc/meminfo", "MemAvailable:");
  const int64_t total = proc_field_bytes("/proc/meminfo", "MemTotal:");
  if (ours < 0) GTEST_SKIP() << "this kernel reports no MemAvailable";
  const int64_t got = host_available_bytes();
  EXPECT_GT(got, 0);
  EXPECT_LE(got, total);
  EXPECT_EQ(got % 1024, 0);
  // Memory moves between the two reads (other processes run beside the tests); a unit error would
  // be a factor of 1024.
  EXPECT_GT(got, ours / 8);
  EXPECT_LT(got, ours * 8);
}

}  // namespace
}  // namespace tandem
