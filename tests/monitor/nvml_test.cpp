// NVML loaded at run time (monitor/nvml.h): libraries that are absent, lack NVML's calls or fail to
// initialise, the readings' units and gaps from a stand-in libnvidia-ml built by the test (skipped
// without a C compiler), and, on a machine with NVIDIA's driver only, the driver's own library.

#include "tandem/monitor/nvml.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "../test_util.h"

namespace tandem {
namespace {

// A stand-in for libnvidia-ml.so.1 with NVML's C signatures. Its behaviour is set through
// fake_nvml_set(key, value); fake_nvml_get(key) reads it back, with the calls it counted.
// Device i reports: utilisation 37 + i %, memory-controller 12 + i %, 80 GiB total, 3 GiB + i bytes
// used, 61 + i degrees, 250500 + 1000 i mW, 1234567 + i mJ, 1410 + i MHz; PCI bus 0000:3B:00.0 is device 1.
constexpr const char* kFakeNvml = R"C(
#include <stdio.h>
#include <string.h>
typedef struct { unsigned gpu, memory; } util_t;
typedef struct { unsigned long long total, free, used; } mem_t;
typedef struct { int index; } dev_t_;
static dev_t_ devices[4] = {{0}, {1}, {2}, {3}};
static long long init_rc, count_rc, count = 2, bad_handle = -1, fail, index_rc, long_name;
static long long inits, shutdowns, sensor = -1, clock_type = -1;
static long long* knob(const char* k) {
  if (!strcmp(k, "init_rc")) return &init_rc;
  if (!strcmp(k, "count_rc")) return &count_rc;
  if (!strcmp(k, "count")) return &count;
  if (!strcmp(k, "bad_handle")) return &bad_handle;
  if (!strcmp(k, "fail")) return &fail;
  if (!strcmp(k, "index_rc")) return &index_rc;
  if (!strcmp(k, "long_name")) return &long_name;
  if (!strcmp(k, "inits")) return &inits;
  if (!strcmp(k, "shutdowns")) return &shutdowns;
  if (!strcmp(k, "sensor")) return &sensor;
  if (!strcmp(k, "clock_type")) return &clock_type;
  return 0;
}
void fake_nvml_set(const char* k, long long v) { *knob(k) = v; }
long long fake_nvml_get(const char* k) { return *knob(k); }
int nvmlInit_v2(void) { ++inits; return (int)init_rc; }
int nvmlShutdown(void) { ++shutdowns; return 0; }
int nvmlDeviceGetCount_v2(unsigned* n) { *n = (unsigned)count; return (int)count_rc; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, dev_t_** d) {
  if ((long long)i == bad_handle || i >= 4) return 2;
  *d = &devices[i];
  return 0;
}
int nvmlDeviceGetHandleByPciBusId_v2(const char* id, dev_t_** d) {
  if (strcmp(id, "0000:3B:00.0")) return 6;
  *d = &devices[1];
  return 0;
}
int nvmlDeviceGetIndex(dev_t_* d, unsigned* i) { *i = (unsigned)d->index; return (int)index_rc; }
int nvmlDeviceGetName(dev_t_* d, char* buf, unsigned len) {
  if (long_name) {
    char s[200];
    memset(s, 'x', sizeof s - 1);
    s[sizeof s - 1] = 0;
    snprintf(buf, len, "%s", s);
  } else {
    snprintf(buf, len, "Fake GPU %d", d->index);
  }
  return 0;
}
int nvmlDeviceGetUtilizationRates(dev_t_* d, util_t* u) {
  if (fail & 1) return 3;
  u->gpu = 37 + d->index, u->memory = 12 + d->index;
  return 0;
}
int nvmlDeviceGetMemoryInfo(dev_t_* d, mem_t* m) {
  if (fail & 2) return 3;
  m->total = 80ull << 30, m->used = (3ull << 30) + d->index, m->free = m->total - m->used;
  return 0;
}
int nvmlDeviceGetTemperature(dev_t_* d, int s, unsigned* t) {
  sensor = s;
  if (fail & 4) return 3;
  *t = 61 + d->index;
  return 0;
}
int nvmlDeviceGetPowerUsage(dev_t_* d, unsigned* mw) {
  if (fail & 8) return 3;
  *mw = 250500 + 1000 * d->index;
  return 0;
}
#ifndef WITHOUT_ENERGY
int nvmlDeviceGetTotalEnergyConsumption(dev_t_* d, unsigned long long* mj) {
  if (fail & 16) return 3;
  *mj = 1234567ull + d->index;
  return 0;
}
#endif
int nvmlDeviceGetClockInfo(dev_t_* d, int type, unsigned* mhz) {
  clock_type = type;
  if (fail & 32) return 3;
  *mhz = 1410 + d->index;
  return 0;
}
const char* nvmlErrorString(int rc) {
  static char s[64];
  snprintf(s, sizeof s, "Fake error %d", rc);
  return s;
}
)C";

// The stand-in libraries, built once per process: the whole API, and one without
// nvmlDeviceGetTotalEnergyConsumption. Empty paths (and the reason) where no C compiler runs.
struct FakeLibraries {
  test::TempDir dir;
  std::string full, without_energy, why_not;
  FakeLibraries() {
    std::ofstream(dir.file("fake_nvml.c")) << kFakeNvml;
    if (std::system("command -v cc >/dev/null 2>&1") != 0) {
      why_not = "no C compiler (cc) to build the stand-in libnvidia-ml";
      return;
    }
    const std::string src = dir.file("fake_nvml.c"), log = dir.file("cc.log");
    const std::string a = dir.file("libfake-nvml.so"), b = dir.file("libfake-nvml-old.so");
    if (std::system(("cc -shared -fPIC -O1 -o " + a + " " + src + " 2>" + log).c_str()) != 0 ||
        std::system(("cc -shared -fPIC -O1 -DWITHOUT_ENERGY -o " + b + " " + src + " 2>>" + log).c_str()) != 0) {
      why_not = "cc could not build the stand-in libnvidia-ml: " + test::read_text(log);
      return;
    }
    full = a;
    without_energy = b;
  }
};

const FakeLibraries& fakes() {
  static const FakeLibraries libs;
  return libs;
}

// The stand-in's knobs, through a handle of the test's own (the library stays loaded, and its
// state shared with Nvml's handle, while this one is open).
class FakeNvml {
 public:
  explicit FakeNvml(const std::string& path) : lib_(dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
    if (lib_ == nullptr) return;
    set_ = reinterpret_cast<void (*)(const char*, long long)>(dlsym(lib_, "fake_nvml_set"));
    get_ = reinterpret_cast<long long (*)(const char*)>(dlsym(lib_, "fake_nvml_get"));
    if (!loaded()) return;
    for (const char* k : {"init_rc", "count_rc", "fail", "index_rc", "long_name", "inits", "shutdowns"}) set(k, 0);
    set("count", 2);
    set("bad_handle", -1);
    set("sensor", -1);
    set("clock_type", -1);
  }
  ~FakeNvml() {
    if (lib_ != nullptr) dlclose(lib_);
  }
  bool loaded() const { return set_ != nullptr && get_ != nullptr; }
  void set(const char* key, long long value) { set_(key, value); }
  long long get(const char* key) const { return get_(key); }

 private:
  void* lib_;
  void (*set_)(const char*, long long) = nullptr;
  long long (*get_)(const char*) = nullptr;
};

#define FAKE_NVML_OR_SKIP(fake, path)                        \
  if (fakes().full.empty()) GTEST_SKIP() << fakes().why_not; \
  FakeNvml fake(path);                                       \
  ASSERT_TRUE(fake.loaded()) << "the stand-in did not load: " << dlerror()

TEST(Nvml, AnAbsentLibraryIsNamedAndTheReasonIsOptional) {
  std::string why;
  EXPECT_EQ(Nvml::open(&why, "/nonexistent/libnvidia-ml.so.1"), nullptr);
  EXPECT_EQ(why, "/nonexistent/libnvidia-ml.so.1 not loadable (no NVIDIA driver): no GPU telemetry");
  EXPECT_EQ(Nvml::open(nullptr, "/nonexistent/libnvidia-ml.so.1"), nullptr) << "no reason asked for: no crash";
}

TEST(Nvml, ALibraryWithoutNvmlsCallsIsADriverTooOld) {
  std::string why;
  EXPECT_EQ(Nvml::open(&why, "libc.so.6"), nullptr);
  EXPECT_EQ(why, "libc.so.6 lacks an NVML call tandem uses (driver too old): no GPU telemetry");
  EXPECT_EQ(Nvml::open(nullptr, "libc.so.6"), nullptr);
}

TEST(Nvml, ALibraryLackingOneCallIsRefusedBeforeNvmlIsInitialised) {
  FAKE_NVML_OR_SKIP(fake, fakes().without_energy);
  std::string why;
  EXPECT_EQ(Nvml::open(&why, fakes().without_energy), nullptr);
  EXPECT_EQ(why, fakes().without_energy + " lacks an NVML call tandem uses (driver too old): no GPU telemetry");
  EXPECT_EQ(fake.get("inits"), 0) << "nvmlInit must not run on a library refused";
  EXPECT_EQ(fake.get("shutdowns"), 0);
}

TEST(Nvml, AFailedInitIsNamedWithNvmlsOwnErrorAndNotShutDown) {
  FAKE_NVML_OR_SKIP(fake, fakes().full);
  fake.set("init_rc", 9);
  std::string why;
  EXPECT_EQ(Nvml::open(&why, fakes().full), nullptr);
  EXPECT_EQ(why, "nvmlInit failed (Fake error 9): no GPU telemetry");
  EXPECT_EQ(fake.get("inits"), 1);
  EXPECT_EQ(fake.get("shutdowns"), 0) << "shutdown belongs to a successful init only";
}

TEST(Nvml, InitIsPairedWithOneShutdownWhenTheHandleGoes) {
  FAKE_NVML_OR_SKIP(fake, fakes().full);
  {
    std::string why;
    const auto nvml = Nvml::open(&why, fakes().full);
    ASSERT_NE(nvml, nullptr) << why;
    EXPECT_EQ(why, "") << "success leaves the reason alone";
    EXPECT_EQ(fake.get("inits"), 1);
    EXPECT_EQ(fake.get("shutdowns"), 0);
  }
  EXPECT_EQ(fake.get("shutdowns"), 1);
}

TEST(Nvml, ReadingsAreInPercentBytesDegreesWattsJoulesAndMegahertz) {
  FAKE_NVML_OR_SKIP(fake, fakes().full);
  const auto nvml = Nvml::open(nullptr, fakes().full);
  ASSERT_NE(nvml, nullptr);
  ASSERT_EQ(nvml->device_count(), 2);
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(::testing::Message() << "device " << i);
    EXPECT_EQ(nvml->device_name(i), "Fake GPU " + std::to_string(i));
    const GpuReading r = nvml->read(i);
    ASSERT_TRUE(r.util_pct && r.mem_util_pct && r.mem_used_bytes && r.mem_total_bytes && r.temp_c && r.power_w &&
                r.energy_j && r.sm_clock_mhz);
    EXPECT_EQ(*r.util_pct, 37.0 + i);
    EXPECT_EQ(*r.mem_util_pct, 12.0 + i);
    EXPECT_EQ(*r.mem_total_bytes, int64_t{80} << 30) << "past 2^32: 64-bit all the way";
    EXPECT_EQ(*r.mem_used_bytes, (int64_t{3} << 30) + i);
    EXPECT_EQ(*r.temp_c, 61.0 + i);
    EXPECT_DOUBLE_EQ(*r.power_w, 250.5 + i) << "milliwatts to watts";
    EXPECT_DOUBLE_EQ(*r.energy_j, 1234.567 + i / 1000.0) << "millijoules to joules";
    EXPECT_EQ(*r.sm_clock_mhz, 1410.0 + i);
    ASSERT_TRUE(nvml->energy_j(i).has_value());
    EXPECT_DOUBLE_EQ(*nvml->energy_j(i), *r.energy_j);
  }
  EXPECT_EQ(fake.get("sensor"), 0) << "NVML_TEMPERATURE_GPU";
  EXPECT_EQ(fake.get("clock_type"), 1) << "NVML_CLOCK_SM";
}

TEST(Nvml, AFieldTheDriverDoesNotReportStaysEmptyAndTheRestAreRead) {
  FAKE_NVML_OR_SKIP(fake, fakes().full);
  const auto nvml = Nvml::open(nullptr, fakes().full);
  ASSERT_NE(nvml, nullptr);
  const char* names[] = {"utilisation", "memory", "temperature", "power", "energy", "clock"};
  for (int bit = 0; bit < 6; ++bit) {
    fake.set("fail", 1 << bit);
    const GpuReading r = nvml->read(1);
    const bool present[] = {r.util_pct.has_value() && r.mem_util_pct.has_value(),
                            r.mem_used_bytes.has_value() && r.mem_total_bytes.has_value(),
                            r.temp_c.has_value(),
                            r.power_w.has_value(),
                            r.energy_j.has_value(),
                            r.sm_clock_mhz.has_value()};
    for (int k = 0; k < 6; ++k)
      EXPECT_EQ(present[k], k != bit) << names[bit] << " failing: " << names[k]
                                      << (k == bit ? " should be empty" : " should still be read");
    EXPECT_EQ(nvml->energy_j(1).has_value(), bit != 4) << names[bit] << " failing";
  }
}

TEST(Nvml, IndicesOutsideTheDevicesAndDevicesWithoutAHandleReadNothing) {
  FAKE_NVML_OR_SKIP(fake, fakes().full);
  fake.set("count", 3);
  fake.set("bad_handle", 1);
  const auto nvml = Nvml::open(nullptr, fakes().full);
  ASSERT_NE(nvml, nullptr);
  EXPECT_EQ(nvml->device_count(), 3) << "NVML's count, handles or not";
  const auto empty = [](const GpuReading& r) {
    return !r.util_pct && !r.mem_util_pct && !r.mem_used_bytes && !r.mem_total_bytes && !r.temp_c && !r.power_w &&
           !r.energy_j && !r.sm_clock_mhz;
  };
  for (const int i : {-1, 1, 3, 1000}) {
    EXPECT_TRUE(empty(nvml->read(i))) << "device " << i;
    EXPECT_EQ(nvml->device_name(i), "") << "device " << i;
    EXPECT_FALSE(nvml->energy_j(i).has_value()) << "device " << i;
  }
  EXPECT_FALSE(empty(nvml->read(0)));
  EXPECT_EQ(nvml->device_name(2), "Fake GPU 2");
}

TEST(Nvml, ACountNvmlCannotGiveMeansNoDevices) {
  FAKE_NVML_OR_SKIP(fake, fakes().full);
  fake.set("count_rc", 3);
  const auto nvml = Nvml::open(nullptr, fakes().full);
  ASSERT_NE(nvml, nullptr) << "NVML itself is up";
  EXPECT_EQ(nvml->device_count(), 0);
  EXPECT_EQ(nvml->device_name(0), "");
}

TEST(Nvml, APciBusIdIsMappedToItsNvmlIndexOrMinusOne) {
  FAKE_NVML_OR_SKIP(fake, fakes().full);
  const auto nvml = Nvml::open(nullptr, fakes().full);
  ASSERT_NE(nvml, nullptr);
  EXPECT_EQ(nvml->index_of_pci_bus_id("0000:3B:00.0"), 1);
  EXPECT_EQ(nvml->index_of_pci_bus_id("0000:AF:00.0"), -1) << "no such bus";
  EXPECT_EQ(nvml->index_of_pci_bus_id(""), -1);
  fake.set("index_rc", 2);
  EXPECT_EQ(nvml->index_of_pci_bus_id("0000:3B:00.0"), -1) << "a handle without an index";
}

TEST(Nvml, ALongDeviceNameIsCutToTheBufferNvmlIsGiven) {
  FAKE_NVML_OR_SKIP(fake, fakes().full);
  fake.set("long_name", 1);
  const auto nvml = Nvml::open(nullptr, fakes().full);
  ASSERT_NE(nvml, nullptr);
  EXPECT_EQ(nvml->device_name(0), std::string(95, 'x')) << "96 bytes with the terminating zero";
}

// The stand-in shares tandem's idea of NVML's structs; the driver's library checks it. A wrong layout
// or unit puts a reading far outside these bounds.
TEST(Nvml, TheDriversOwnLibraryReportsItsDevicesInPlausibleUnits) {
  std::string why;
  const auto nvml = Nvml::open(&why);
  if (nvml == nullptr) GTEST_SKIP() << why;
  if (nvml->device_count() == 0) GTEST_SKIP() << "NVML is up but sees no GPU";
  for (int i = 0; i < nvml->device_count(); ++i) {
    SCOPED_TRACE(::testing::Message() << "device " << i << " (" << nvml->device_name(i) << ")");
    EXPECT_FALSE(nvml->device_name(i).empty());
    const GpuReading r = nvml->read(i);
    ASSERT_TRUE(r.mem_total_bytes.has_value() && r.mem_used_bytes.has_value());
    EXPECT_GT(*r.mem_total_bytes, int64_t{1} << 30);
    EXPECT_LT(*r.mem_total_bytes, int64_t{1} << 40);
    EXPECT_LE(*r.mem_used_bytes, *r.mem_total_bytes);
    const auto within = [](const std::optional<double>& x, double lo, double hi) {
      return !x || (*x >= lo && *x <= hi);
    };
    EXPECT_TRUE(within(r.util_pct, 0, 100)) << *r.util_pct;
    EXPECT_TRUE(within(r.mem_util_pct, 0, 100)) << *r.mem_util_pct;
    EXPECT_TRUE(within(r.temp_c, 1, 120)) << *r.temp_c << " degrees";
    EXPECT_TRUE(within(r.power_w, 1, 2000)) << *r.power_w << " W";
    EXPECT_TRUE(within(r.sm_clock_mhz, 50, 5000)) << *r.sm_clock_mhz << " MHz";
    if (r.energy_j) {
      const auto later = nvml->energy_j(i);
      ASSERT_TRUE(later.has_value());
      EXPECT_GE(*later, *r.energy_j) << "a cumulative counter";
    }
  }
  EXPECT_FALSE(nvml->read(nvml->device_count()).mem_total_bytes.has_value());
}

}  // namespace
}  // namespace tandem
