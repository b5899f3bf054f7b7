// The unit tests' harness: TEST registers a test, CHECK and CHECK_EQ
// report a failure with its place and values and let the test go on (a
// rank's thread that stopped at its first failed check would leave the
// other ranks waiting for it), SKIP ends a test that cannot run here.
// main.cpp runs the tests.
#pragma once

#include <atomic>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "nncomm/core/dtype.hpp"
#include "nncomm/core/status.hpp"

namespace unit {

struct TestCase {
  const char *name;
  void (*body)();
};

inline std::vector<TestCase> &registry() {
  static std::vector<TestCase> tests;
  return tests;
}

struct Registration {
  Registration(const char *name, void (*body)()) {
    registry().push_back({name, body});
  }
};

// Of the test running in this process (main.cpp gives each its own).
inline std::atomic<int> failures{0};
inline std::string skipped; // why, once skipped

inline void fail(const char *file, int line, const std::string &what) {
  static std::mutex printing; // checks fail on every rank's thread
  std::lock_guard<std::mutex> lock(printing);
  std::printf("%s:%d: %s\n", file, line, what.c_str());
  std::fflush(stdout);
  ++failures;
}

inline std::string show(nncomm::DType dtype) {
  return nncomm::dtype_name(dtype);
}

inline std::string show(const nncomm::Status &status) {
  if (status.ok())
    return "OK";
  return "code " + std::to_string(static_cast<int>(status.code())) + " (" +
         status.message() + ")";
}

template <typename T, typename = void> struct Printable : std::false_type {};
template <typename T>
struct Printable<T, std::void_t<decltype(std::declval<std::ostream &>()
                                         << std::declval<const T &>())>>
    : std::true_type {};

template <typename T> std::string show(const T &value) {
  std::ostringstream out;
  if constexpr (std::is_enum<T>::value)
    out << static_cast<long long>(value);
  else if constexpr (std::is_same<T, std::string>::value)
    out << '"' << value << '"';
  else if constexpr (Printable<T>::value)
    out << value;
  else
    out << "(a value that cannot be printed)";
  return out.str();
}

template <typename T> std::string show(const std::vector<T> &values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i)
    text += (i ? ", " : "") + show(values[i]);
  return text + "]";
}

// What the macros below call: a function each, so that a check costs its
// call site no code of its own.
template <typename A, typename B>
void check_eq(const char *file, int line, const char *text, const A &actual,
              const B &expected) {
  if (!(actual == expected))
    fail(file, line, std::string(text) + ": " + show(actual) + " != " +
                         show(expected));
}

inline void check_ok(const char *file, int line, const char *text,
                     const nncomm::Status &status) {
  if (!status.ok())
    fail(file, line, std::string(text) + ": " + show(status));
}

inline void check_contains(const char *file, int line, const char *text,
                           const std::string &whole, const std::string &part) {
  if (whole.find(part) == std::string::npos) {
    fail(file, line,
         std::string(text) + ": \"" + whole + "\" lacks \"" + part + "\"");
  }
}

} // namespace unit

#define TEST(name)                                                             \
  static void name();                                                          \
  static const ::unit::Registration name##_registration(#name, name);         \
  static void name()

#define CHECK(condition)                                                       \
  do {                                                                         \
    if (!(condition))                                                          \
      ::unit::fail(__FILE__, __LINE__, "CHECK(" #condition ") failed");        \
  } while (0)

#define CHECK_EQ(actual, expected)                                             \
  ::unit::check_eq(__FILE__, __LINE__, "CHECK_EQ(" #actual ", " #expected ")", \
                   (actual), (expected))

#define CHECK_OK(status)                                                       \
  ::unit::check_ok(__FILE__, __LINE__, "CHECK_OK(" #status ")", (status))

// Whether `text` contains `part`, for checks on messages.
#define CHECK_CONTAINS(text, part)                                             \
  ::unit::check_contains(__FILE__, __LINE__,                                   \
                         "CHECK_CONTAINS(" #text ", " #part ")", (text), (part))

#define SKIP(why)                                                              \
  do {                                                                         \
    ::unit::skipped = (why);                                                   \
    return;                                                                    \
  } while (0)
