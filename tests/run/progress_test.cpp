// Progress output (run/progress.h): durations as m:ss or h:mm:ss, the redrawn bar line with its
// fill, a log line every log_every steps and at the last one, messages ending an open bar line,
// and nothing at all when off.
#include "tandem/run/progress.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace tandem {
namespace {

ProgressSample sample(int64_t step, int64_t total) {
  ProgressSample s;
  s.step = step;
  s.total = total;
  s.loss = 2.5;
  s.lr = 1e-3;
  s.tokens_per_s = 1500;
  s.step_time_s = 0.25;
  s.eta_s = 75;
  return s;
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

TEST(FormatDuration, MinutesAndSecondsUnderAnHourHoursAbove) {
  EXPECT_EQ(format_duration(0), "0:00");
  EXPECT_EQ(format_duration(59.4), "0:59");
  EXPECT_EQ(format_duration(59.5), "1:00") << "rounded to the nearest second";
  EXPECT_EQ(format_duration(75), "1:15");
  EXPECT_EQ(format_duration(3599.4), "59:59");
  EXPECT_EQ(format_duration(3600), "1:00:00");
  EXPECT_EQ(format_duration(3661), "1:01:01");
  EXPECT_EQ(format_duration(100 * 3600 + 5), "100:00:05");
}

TEST(FormatDuration, UnknownDurationsAreDashes) {
  EXPECT_EQ(format_duration(-1), "--:--");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::quiet_NaN()), "--:--");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::infinity()), "--:--");
  EXPECT_EQ(format_duration(1e8 + 1), "--:--");
  EXPECT_EQ(format_duration(1e8), "27777:46:40") << "the largest shown";
}

TEST(Progress, LinesModeLogsEveryLogEveryStepsAndTheLast) {
  testing::internal::CaptureStderr();
  {
    Progress p(ProgressMode::kLines, 3);
    for (int64_t step = 1; step <= 7; ++step) p.update(sample(step, 7));
    p.finish();
  }
  const std::string out = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(out, "| loss "), 3) << out;  // steps 3, 6 and 7 (the last)
  EXPECT_NE(out.find("step 3/7 | loss 2.5000 | lr 1.00e-03 | 1.5 K tok/s | 250 ms/step | ETA 1:15"), std::string::npos)
      << out;
  EXPECT_NE(out.find("step 6/7"), std::string::npos) << out;
  EXPECT_NE(out.find("step 7/7"), std::string::npos) << out;
  EXPECT_EQ(out.find("step 1/7"), std::string::npos) << out;
  EXPECT_EQ(out.find('\r'), std::string::npos) << "no bar in lines mode: " << out;
}

TEST(Progress, ExtraTextFollowsTheFigures) {
  testing::internal::CaptureStderr();
  {
    Progress p(ProgressMode::kLines, 1);
    ProgressSample s = sample(2, 4);
    s.extra = "scale 65536";
    p.update(s);
  }
  const std::string out = testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("ETA 1:15 | scale 65536"), std::string::npos) << out;
}

TEST(Progress, TheBarFillsInProportionToTheSteps) {
  testing::internal::CaptureStderr();
  Progress p(ProgressMode::kBar, 10);
  p.update(sample(6, 24));  // a quarter of 24 columns
  const std::string quarter = testing::internal::GetCapturedStderr();
  EXPECT_EQ(quarter,
            "\r\033[K6/24 [======>" + std::string(17, ' ') + "] loss 2.5000 | lr 1.00e-03 | 1.5 K tok/s | ETA 1:15")
      << quarter;

  testing::internal::CaptureStderr();
  p.update(sample(24, 24));
  ProgressSample unknown = sample(0, 0);
  unknown.eta_s = -1;
  p.update(unknown);
  p.finish();
  const std::string rest = testing::internal::GetCapturedStderr();
  EXPECT_NE(rest.find("24/24 [" + std::string(24, '=') + "]"), std::string::npos) << "full, no arrow: " << rest;
  EXPECT_NE(rest.find("0/0 [>" + std::string(23, ' ') + "]"), std::string::npos) << "no total: empty bar" << rest;
  EXPECT_NE(rest.find("ETA --:--"), std::string::npos) << rest;
  EXPECT_EQ(rest.back(), '\n') << "finish ends the bar's line";
}

TEST(Progress, AMessageEndsAnOpenBarLineOnce) {
  testing::internal::CaptureStderr();
  Progress p(ProgressMode::kBar, 10);
  p.update(sample(1, 4));
  p.message("checkpoint written");
  p.message("second message");
  p.finish();
  const std::string out = testing::internal::GetCapturedStderr();
  const size_t bar = out.find("1/4 ["), msg = out.find("checkpoint written");
  ASSERT_NE(bar, std::string::npos) << out;
  ASSERT_NE(msg, std::string::npos) << out;
  EXPECT_NE(out.substr(bar, msg - bar).find('\n'), std::string::npos) << "the bar's line ended first: " << out;
  EXPECT_NE(out.find("second message"), std::string::npos) << out;
  // One newline closes the bar; each message is its own log line; finish adds none (the bar is closed).
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 3) << out;
}

TEST(Progress, OffPrintsNothingButMessages) {
  testing::internal::CaptureStderr();
  {
    Progress p(ProgressMode::kOff, 1);
    for (int64_t step = 1; step <= 3; ++step) p.update(sample(step, 3));
    p.finish();
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  testing::internal::CaptureStderr();
  {
    Progress p(ProgressMode::kOff, 1);
    p.message("resumed from step 3");
  }
  EXPECT_NE(testing::internal::GetCapturedStderr().find("resumed from step 3"), std::string::npos);
}

TEST(Progress, AutoWritesLinesWhenStderrIsNoTerminal) {
  testing::internal::CaptureStderr();  // stderr is a file now
  {
    Progress p(ProgressMode::kAuto, 2);
    p.update(sample(2, 4));
    p.finish();
  }
  const std::string out = testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("step 2/4 | loss"), std::string::npos) << out;
  EXPECT_EQ(out.find('\r'), std::string::npos) << out;
}

}  // namespace
}  // namespace tandem
