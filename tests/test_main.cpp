// gtest's main, except that a run whose --gtest_filter selects no test fails: ctest runs each test
// by name, so a name that no longer exists (a renamed fixture row on a stale test list) must not
// pass as zero tests run.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  if (GTEST_FLAG_GET(list_tests)) return rc;
  const std::string filter = GTEST_FLAG_GET(filter);
  if (rc == 0 && ::testing::UnitTest::GetInstance()->test_to_run_count() == 0) {
    std::fprintf(stderr,
                 "[test_main] --gtest_filter=%s selects no test, expected at least 1, got 0 "
                 "(a stale test list? re-run ctest after regenerating the fixtures)\n",
                 filter.c_str());
    return 1;
  }
  return rc;
}
