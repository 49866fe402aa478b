// The Chrome trace writer: the exact JSON it writes, spans that end before they start left out,
// names escaped, counters, and the file written durably.

#include "tandem/monitor/chrome_trace.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "tandem/core/fs.h"

namespace tandem {
namespace {

TEST(ChromeTrace, WritesThreadNamesThenTheProcessThenEveryEventInOrder) {
  ChromeTrace t("demo");
  t.name_thread(1, "compute");
  t.name_thread(4, "updater");
  t.span(1, "forward embed", 3, 10.0, 12.5);
  t.counter("GPU power (W)", 11.25, 123.5);
  t.span(4, "CPU update layer.0", 3, 20.0, 20.0);  // zero length: kept
  EXPECT_EQ(t.events(), 3u);
  // R"j(...)j": the names hold ")" followed by a quote.
  const std::string want =
      "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
      R"j({"name":"thread_name","ph":"M","pid":1,"tid":1,"args":{"name":"compute"}},)j"
      "\n"
      R"j({"name":"thread_name","ph":"M","pid":1,"tid":4,"args":{"name":"updater"}},)j"
      "\n"
      R"j({"name":"process_name","ph":"M","pid":1,"args":{"name":"demo"}})j"
      ",\n"
      R"j({"name":"forward embed","cat":"step 3","ph":"X","pid":1,"tid":1,"ts":10.000,"dur":2.500,"args":{"step":3}})j"
      ",\n"
      R"j({"name":"GPU power (W)","ph":"C","pid":1,"tid":0,"ts":11.250,"args":{"value":123.5}})j"
      ",\n"
      R"j({"name":"CPU update layer.0","cat":"step 3","ph":"X","pid":1,"tid":4,"ts":20.000,"dur":0.000,"args":{"step":3}})j"
      "\n]}\n";
  EXPECT_EQ(t.json(), want);
}

TEST(ChromeTrace, ASpanEndingBeforeItStartsIsLeftOut) {
  ChromeTrace t("p");
  t.span(1, "backwards", 1, 5.0, 4.999);
  EXPECT_EQ(t.events(), 0u);
  const auto j = nlohmann::json::parse(t.json());
  ASSERT_EQ(j["traceEvents"].size(), 1u);  // the process name alone
  EXPECT_EQ(j["traceEvents"][0]["ph"], "M");
}

TEST(ChromeTrace, NamesAreEscapedAndTheTraceParses) {
  ChromeTrace t("say \"hi\"");
  t.name_thread(2, "a\\b");
  t.span(2, "block \"x\"\n", 12, 1.0, 3.0);
  t.counter("mem \"GiB\"", 2.0, 0.000123456789);
  const auto j = nlohmann::json::parse(t.json());
  const auto& ev = j["traceEvents"];
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0]["args"]["name"], "a\\b");
  EXPECT_EQ(ev[1]["args"]["name"], "say \"hi\"");
  EXPECT_EQ(ev[2]["name"], "block \"x\"\n");
  EXPECT_EQ(ev[2]["cat"], "step 12");
  EXPECT_EQ(ev[2]["args"]["step"], 12);
  EXPECT_DOUBLE_EQ(ev[2]["ts"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(ev[2]["dur"].get<double>(), 2.0);
  EXPECT_EQ(ev[3]["name"], "mem \"GiB\"");
  EXPECT_DOUBLE_EQ(ev[3]["args"]["value"].get<double>(), 0.000123457);  // %.6g
}

TEST(ChromeTrace, WriteStoresExactlyTheJson) {
  test::TempDir dir;
  ChromeTrace t("p");
  t.name_thread(1, "compute");
  t.span(1, "s", 1, 0.0, 1.0);
  t.write(dir.file("trace.json"));
  EXPECT_EQ(read_file(dir.file("trace.json"), "trace"), t.json());
}

}  // namespace
}  // namespace tandem
