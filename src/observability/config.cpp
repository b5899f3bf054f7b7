#include "nncomm/observability/config.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>

namespace nncomm {
namespace config {

namespace {

// A variable's value, or the default; `error` says why a set value did not
// parse ("" when it did, or was unset or empty).
template <typename T> struct Setting {
  T value;
  std::string error;
};

const char *env(const char *name) {
  const char *value = std::getenv(name);
  return value == nullptr || *value == '\0' ? nullptr : value;
}

template <typename T>
Setting<T> refused(const char *name, T fallback, const char *expected) {
  return {fallback, std::string(name) + "=" + std::getenv(name) +
                        " (expected " + expected + ")"};
}

// A whole number from `least` to `most`, `expected` saying so.
Setting<size_t> count(const char *name, size_t fallback, size_t least,
                      size_t most, const char *expected) {
  const char *v = env(name);
  if (v == nullptr)
    return {fallback};
  char *end = nullptr;
  errno = 0;
  const unsigned long long parsed = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0' || errno != 0 || *v == '-' ||
      parsed < least || parsed > most)
    return refused(name, fallback, expected);
  return {static_cast<size_t>(parsed)};
}

// A positive byte count.
Setting<size_t> bytes(const char *name, size_t fallback) {
  return count(name, fallback, 1, SIZE_MAX, "a positive number of bytes");
}

// A byte count where 0 means something of its own (none, off).
Setting<size_t> bytes_or_zero(const char *name, size_t fallback) {
  return count(name, fallback, 0, SIZE_MAX, "a number of bytes, 0 or more");
}

// A number of seconds, 0 or more.
Setting<double> seconds(const char *name, double fallback) {
  const char *v = env(name);
  if (v == nullptr)
    return {fallback};
  char *end = nullptr;
  const double parsed = std::strtod(v, &end);
  if (end == v || *end != '\0' || !(parsed >= 0) || parsed > 1e9)
    return refused(name, fallback, "seconds, 0 for none");
  return {parsed};
}

// One of the words of `choices`, each standing for its value; unset or
// empty: `fallback`. `expected` lists the words, for the message.
template <typename T>
Setting<T> one_of(const char *name, T fallback,
                  std::initializer_list<std::pair<const char *, T>> choices,
                  const char *expected) {
  const char *v = env(name);
  if (v == nullptr)
    return {fallback};
  for (const auto &choice : choices) {
    if (std::string(v) == choice.first)
      return {choice.second};
  }
  return refused(name, fallback, expected);
}

// 0 or 1.
Setting<bool> switch_of(const char *name, bool fallback) {
  return one_of(name, fallback, {{"0", false}, {"1", true}}, "0 or 1");
}

Setting<int> microseconds(const char *name, int fallback) {
  const char *v = env(name);
  if (v == nullptr)
    return {fallback};
  char *end = nullptr;
  const long parsed = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || parsed < 0 || parsed > 1000000)
    return refused(name, fallback, "0 to 1000000 microseconds");
  return {static_cast<int>(parsed)};
}

Setting<std::string> text(const char *name) {
  const char *v = env(name);
  return {v == nullptr ? "" : v};
}

// Every NNCOMM_* variable, read once, at first use.
struct Settings {
  Setting<size_t> chunk = bytes("NNCOMM_CHUNK_BYTES", 4u << 20);
  Setting<size_t> direct = bytes("NNCOMM_DIRECT_BYTES", 1u << 20);
  Setting<size_t> ipc_chunk = bytes("NNCOMM_IPC_CHUNK_BYTES", 32u << 20);
  Setting<size_t> ipc_min = bytes_or_zero("NNCOMM_IPC_MIN_BYTES", 2u << 20);
  Setting<size_t> ipc_bucket =
      bytes_or_zero("NNCOMM_IPC_BUCKET_BYTES", 32u << 20);
  Setting<size_t> huge_page = bytes("NNCOMM_HUGE_PAGE_BYTES", 4u << 20);
  Setting<CallChecks> check = one_of(
      "NNCOMM_CHECK_CALLS", CallChecks::kNew,
      {{"0", CallChecks::kOff}, {"1", CallChecks::kEvery}},
      "0 (no check) or 1 (every call)");
  Setting<bool> finite = switch_of("NNCOMM_CHECK_FINITE", false);
  Setting<std::optional<Launch>> launch_at = one_of<std::optional<Launch>>(
      "NNCOMM_LAUNCH", std::nullopt,
      {{"eager", Launch::kEager}, {"deferred", Launch::kDeferred},
       {"auto", std::nullopt}},
      "eager, deferred or auto");
  Setting<int> poll = microseconds("NNCOMM_ENGINE_POLL_US", 50);
  Setting<double> timeout = seconds("NNCOMM_TIMEOUT", 1800);
  Setting<double> stall = seconds("NNCOMM_STALL_WARNING", 60);
  Setting<size_t> fail_allocation = bytes("NNCOMM_TEST_FAIL_ALLOCATION", 0);
  Setting<GpuTransport> gpu = one_of(
      "NNCOMM_GPU_TRANSPORT", GpuTransport::kAuto,
      {{"auto", GpuTransport::kAuto}, {"nccl", GpuTransport::kNccl},
       {"ipc", GpuTransport::kIpc}, {"mpi", GpuTransport::kMpi}},
      "auto, nccl, ipc or mpi");
  Setting<Hierarchical> two_level = one_of(
      "NNCOMM_HIERARCHICAL", Hierarchical::kAuto,
      {{"auto", Hierarchical::kAuto}, {"0", Hierarchical::kOff},
       {"1", Hierarchical::kOn}},
      "auto, 0 or 1");
  Setting<std::string> nccl = text("NNCOMM_NCCL_LIBRARY");
  Setting<std::string> timeline = text("NNCOMM_TIMELINE");
  // Bounded, so that a typo cannot ask every transport for gigabytes.
  Setting<size_t> flight = count("NNCOMM_FLIGHT_RECORDER", 2000, 0, 1000000,
                                 "0 (off) to 1000000 operations");
  Setting<std::string> flight_dir = text("NNCOMM_FLIGHT_RECORDER_DIR");
};

const Settings &settings() {
  static const Settings s;
  return s;
}

} // namespace

Status validate() {
  const Settings &s = settings();
  std::string bad;
  for (const std::string *error :
       {&s.chunk.error, &s.direct.error, &s.huge_page.error, &s.check.error,
        &s.finite.error, &s.launch_at.error, &s.poll.error, &s.timeout.error,
        &s.stall.error, &s.fail_allocation.error, &s.gpu.error,
        &s.two_level.error, &s.flight.error, &s.ipc_chunk.error,
        &s.ipc_min.error, &s.ipc_bucket.error}) {
    if (!error->empty())
      bad += (bad.empty() ? "" : "; ") + *error;
  }
  if (bad.empty())
    return Status::Ok();
  return Status::InvalidArgument("invalid nncomm settings: " + bad);
}

size_t chunk_bytes() { return settings().chunk.value; }
size_t direct_bytes() { return settings().direct.value; }
size_t ipc_min_bytes() { return settings().ipc_min.value; }
size_t ipc_bucket_bytes() { return settings().ipc_bucket.value; }
size_t ipc_chunk_bytes() {
  return std::max<size_t>(settings().ipc_chunk.value, 4096);
}
size_t huge_page_bytes() { return settings().huge_page.value; }
CallChecks check_calls() { return settings().check.value; }
bool check_finite() { return settings().finite.value; }
std::optional<Launch> engine_launch() { return settings().launch_at.value; }
int engine_poll_us() { return settings().poll.value; }
double timeout_seconds() { return settings().timeout.value; }
double stall_warning_seconds() { return settings().stall.value; }
size_t test_fail_allocation_bytes() {
  return settings().fail_allocation.value;
}
GpuTransport gpu_transport() { return settings().gpu.value; }
Hierarchical hierarchical() { return settings().two_level.value; }
const std::string &nccl_library() { return settings().nccl.value; }
const std::string &timeline_path() { return settings().timeline.value; }
size_t flight_recorder_entries() { return settings().flight.value; }
const std::string &flight_recorder_dir() {
  return settings().flight_dir.value;
}

} // namespace config
} // namespace nncomm
