// The test binary's entry point: GoogleTest's, with one difference. When every test the filter
// selected was skipped (a GPU suite on a machine without one), it exits 77, which CTest reads as
// "skipped" (Note [One CTest per suite] in cmake/suite_tests.cmake); a run that passed a test exits 0,
// one that failed exits 1.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  const testing::UnitTest& run = *testing::UnitTest::GetInstance();
  if (failed == 0 && run.successful_test_count() == 0 && run.skipped_test_count() > 0) return 77;
  return failed;
}
