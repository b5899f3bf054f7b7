#include "nncomm/config.hpp"

#include <cerrno>
#include <cstdlib>
#include <string>

namespace nncomm {
namespace config {

namespace {

// A variable's value, and whether it parsed. Unset or empty: the default.
template <typename T> struct Setting {
  T value;
  bool ok = true;
};

const char *env(const char *name) {
  const char *value = std::getenv(name);
  return value == nullptr || *value == '\0' ? nullptr : value;
}

// A positive byte count.
Setting<size_t> bytes(const char *name, size_t fallback) {
  const char *v = env(name);
  if (v == nullptr)
    return {fallback};
  char *end = nullptr;
  errno = 0;
  const unsigned long long parsed = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0' || parsed == 0 || errno != 0 || *v == '-')
    return {fallback, false};
  return {static_cast<size_t>(parsed)};
}

// A number of seconds, 0 or more.
Setting<double> seconds(const char *name, double fallback) {
  const char *v = env(name);
  if (v == nullptr)
    return {fallback};
  char *end = nullptr;
  const double parsed = std::strtod(v, &end);
  if (end == v || *end != '\0' || !(parsed >= 0) || parsed > 1e9)
    return {fallback, false};
  return {parsed};
}

Setting<CallChecks> call_checks(const char *name) {
  const char *v = env(name);
  if (v == nullptr)
    return {CallChecks::kNew};
  const std::string s = v;
  if (s == "0")
    return {CallChecks::kOff};
  if (s == "1")
    return {CallChecks::kEvery};
  return {CallChecks::kNew, false};
}

Setting<int> microseconds(const char *name, int fallback) {
  const char *v = env(name);
  if (v == nullptr)
    return {fallback};
  char *end = nullptr;
  const long parsed = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || parsed < 0 || parsed > 1000000)
    return {fallback, false};
  return {static_cast<int>(parsed)};
}

Setting<std::optional<Launch>> launch(const char *name) {
  const char *v = env(name);
  const std::string s = v == nullptr ? "auto" : v;
  if (s == "eager")
    return {Launch::kEager};
  if (s == "deferred")
    return {Launch::kDeferred};
  return {std::nullopt, s == "auto"};
}

const Setting<size_t> &chunk() {
  static const auto s = bytes("NNCOMM_CHUNK_BYTES", 4u << 20);
  return s;
}
const Setting<size_t> &direct() {
  static const auto s = bytes("NNCOMM_DIRECT_BYTES", 1u << 20);
  return s;
}
const Setting<size_t> &huge_page() {
  static const auto s = bytes("NNCOMM_HUGE_PAGE_BYTES", 4u << 20);
  return s;
}
const Setting<CallChecks> &check() {
  static const auto s = call_checks("NNCOMM_CHECK_CALLS");
  return s;
}
const Setting<std::optional<Launch>> &launch_setting() {
  static const auto s = launch("NNCOMM_LAUNCH");
  return s;
}
const Setting<int> &poll() {
  static const auto s = microseconds("NNCOMM_ENGINE_POLL_US", 50);
  return s;
}
const Setting<double> &timeout() {
  static const auto s = seconds("NNCOMM_TIMEOUT", 1800);
  return s;
}
const Setting<size_t> &fail_allocation() {
  static const auto s = bytes("NNCOMM_TEST_FAIL_ALLOCATION", 0);
  return s;
}
const Setting<double> &stall() {
  static const auto s = seconds("NNCOMM_STALL_WARNING", 60);
  return s;
}

} // namespace

Status validate() {
  std::string bad;
  const auto note = [&](bool ok, const char *name, const char *expected) {
    if (ok)
      return;
    bad += std::string(bad.empty() ? "" : "; ") + name + "=" +
           std::getenv(name) + " (expected " + expected + ")";
  };
  note(chunk().ok, "NNCOMM_CHUNK_BYTES", "a positive number of bytes");
  note(direct().ok, "NNCOMM_DIRECT_BYTES", "a positive number of bytes");
  note(huge_page().ok, "NNCOMM_HUGE_PAGE_BYTES", "a positive number of bytes");
  note(check().ok, "NNCOMM_CHECK_CALLS", "0 (no check) or 1 (every call)");
  note(launch_setting().ok, "NNCOMM_LAUNCH", "eager, deferred or auto");
  note(poll().ok, "NNCOMM_ENGINE_POLL_US", "0 to 1000000 microseconds");
  note(timeout().ok, "NNCOMM_TIMEOUT", "seconds, 0 for none");
  note(stall().ok, "NNCOMM_STALL_WARNING", "seconds, 0 for none");
  note(fail_allocation().ok, "NNCOMM_TEST_FAIL_ALLOCATION",
       "a positive number of bytes");
  if (bad.empty())
    return Status::Ok();
  return Status::InvalidArgument("invalid nncomm settings: " + bad);
}

size_t chunk_bytes() { return chunk().value; }
size_t direct_bytes() { return direct().value; }
size_t huge_page_bytes() { return huge_page().value; }
CallChecks check_calls() { return check().value; }
std::optional<Launch> engine_launch() { return launch_setting().value; }
int engine_poll_us() { return poll().value; }
double timeout_seconds() { return timeout().value; }
double stall_warning_seconds() { return stall().value; }
size_t test_fail_allocation_bytes() { return fail_allocation().value; }

} // namespace config
} // namespace nncomm
