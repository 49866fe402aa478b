// Stop requests (core/interrupt.h): the flag, and the handlers: the first SIGINT or SIGTERM requests
// a stop and prints the notice, the second ends the process with status 128 + signal. Handlers are
// installed only in forked children (death tests), never in the test process.

#include "tandem/core/interrupt.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <thread>

namespace tandem {
namespace {

TEST(Interrupt, ARequestHoldsUntilCleared) {
  clear_stop_request();
  EXPECT_FALSE(stop_requested());
  request_stop();
  EXPECT_TRUE(stop_requested());
  request_stop();
  EXPECT_TRUE(stop_requested());
  clear_stop_request();
  EXPECT_FALSE(stop_requested()) << "two requests need one clear, not two";
}

TEST(Interrupt, ARequestFromAnotherThreadIsSeen) {
  clear_stop_request();
  std::thread([] { request_stop(); }).join();
  EXPECT_TRUE(stop_requested());
  clear_stop_request();
}

// In the child: the first signal must leave the process running with a stop requested; the second
// must end it. Exit codes 10 and 11 say which expectation failed instead.
void first_signal_then_second(int first, int second, const char* notice) {
  clear_stop_request();
  if (notice != nullptr)
    install_stop_handlers(notice);
  else
    install_stop_handlers();
  if (stop_requested()) _exit(10);
  raise(first);
  if (!stop_requested()) _exit(11);
  raise(second);
  _exit(0);  // not reached when the second signal ends the process
}

TEST(Interrupt, TheFirstSignalRequestsAStopAndTheSecondEndsTheProcess) {
  EXPECT_EXIT(first_signal_then_second(SIGINT, SIGINT, "first notice\n"), ::testing::ExitedWithCode(128 + SIGINT),
              "first notice\n.*second signal, stopping now");
  EXPECT_EXIT(first_signal_then_second(SIGTERM, SIGTERM, "first notice\n"), ::testing::ExitedWithCode(128 + SIGTERM),
              "first notice\n.*second signal, stopping now");
  // Either signal counts towards the second: the status names the one that ended it.
  EXPECT_EXIT(first_signal_then_second(SIGINT, SIGTERM, "first notice\n"), ::testing::ExitedWithCode(128 + SIGTERM),
              "second signal");
}

TEST(Interrupt, AStopAskedInProcessLeavesTheFirstSignalItsCleanStop) {
  EXPECT_EXIT(
      {
        clear_stop_request();
        install_stop_handlers("first notice\n");
        request_stop();
        raise(SIGINT);  // the user's first Ctrl-C: a notice, not an exit
        _exit(stop_requested() ? 0 : 11);
      },
      ::testing::ExitedWithCode(0), "first notice");
}

TEST(Interrupt, TheDefaultNoticeSaysHowToStopAtOnce) {
  EXPECT_EXIT(
      {
        clear_stop_request();
        install_stop_handlers();
        raise(SIGINT);
        _exit(stop_requested() ? 0 : 11);
      },
      ::testing::ExitedWithCode(0), "stopping after this step \\(a second Ctrl-C stops at once\\)");
  EXPECT_EXIT(first_signal_then_second(SIGTERM, SIGINT, nullptr), ::testing::ExitedWithCode(128 + SIGINT),
              "stopping after this step");
}

}  // namespace
}  // namespace tandem
