// Runs the unit tests named on the command line, or all of them, each in a
// process of its own: the state a failed wait leaves (wait.hpp) and the
// settings read once per process (config.hpp) are per process, so no test
// sees another's. Prints "unit: N tests passed" and exits 0, or names the
// tests that failed and exits 1. `--list` prints the names.
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "check.hpp"

namespace {

// A test still running after this long is stopped (SIGALRM): a hang shows
// up as a failure instead of stalling the suite.
constexpr unsigned kTestSeconds = 60;

// Exit codes of a test's process.
constexpr int kPassed = 0;
constexpr int kFailed = 1;
constexpr int kSkipped = 77;

int run_alone(const unit::TestCase &test) {
  std::fflush(stdout);
  const pid_t child = fork();
  if (child < 0) {
    std::perror("unit: fork");
    return kFailed;
  }
  if (child == 0) {
    alarm(kTestSeconds);
    test.body();
    int code = unit::failures > 0 ? kFailed : kPassed;
    if (code == kPassed && !unit::skipped.empty()) {
      std::printf("unit: %s skipped: %s\n", test.name, unit::skipped.c_str());
      code = kSkipped;
    }
    std::fflush(stdout);
    // Not exit(): threads a test left behind (a pending abort) may still
    // use what static destructors would free.
    _exit(code);
  }
  int status = 0;
  waitpid(child, &status, 0);
  if (WIFEXITED(status))
    return WEXITSTATUS(status);
  std::printf("unit: %s was killed by signal %d (%s)\n", test.name,
              WTERMSIG(status), strsignal(WTERMSIG(status)));
  return kFailed;
}

} // namespace

int main(int argc, char **argv) {
  const std::vector<unit::TestCase> &all = unit::registry();
  std::vector<unit::TestCase> chosen;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--list") == 0) {
      for (const unit::TestCase &test : all)
        std::printf("%s\n", test.name);
      return 0;
    }
    const unit::TestCase *found = nullptr;
    for (const unit::TestCase &test : all) {
      if (std::strcmp(test.name, argv[i]) == 0)
        found = &test;
    }
    if (found == nullptr) {
      std::printf("unit: no test named %s (--list lists them)\n", argv[i]);
      return 2;
    }
    chosen.push_back(*found);
  }
  if (chosen.empty())
    chosen = all;

  std::vector<std::string> failed;
  int passed = 0, skipped = 0;
  for (const unit::TestCase &test : chosen) {
    const int code = run_alone(test);
    if (code == kPassed)
      ++passed;
    else if (code == kSkipped)
      ++skipped;
    else
      failed.push_back(test.name);
  }
  if (!failed.empty()) {
    std::printf("unit: %zu of %zu tests failed:", failed.size(),
                chosen.size());
    for (const std::string &name : failed)
      std::printf(" %s", name.c_str());
    std::printf("\n");
    return 1;
  }
  if (skipped > 0)
    std::printf("unit: %d tests passed, %d skipped\n", passed, skipped);
  else
    std::printf("unit: %d tests passed\n", passed);
  return 0;
}
