#include "nncomm/config.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace nncomm {
namespace config {

namespace {
size_t env_bytes(const char *name, size_t fallback) {
  const char *value = std::getenv(name);
  if (value == nullptr || *value == '\0')
    return fallback;
  char *end = nullptr;
  unsigned long long parsed = std::strtoull(value, &end, 10);
  if (end == value || *end != '\0' || parsed == 0)
    return fallback;
  return static_cast<size_t>(parsed);
}
} // namespace

bool check_calls() {
  static const bool value = [] {
    const char *v = std::getenv("NNCOMM_CHECK_CALLS");
    return v != nullptr && *v != '\0' && std::string(v) != "0";
  }();
  return value;
}

int engine_poll_us() {
  static const int value = [] {
    const char *v = std::getenv("NNCOMM_ENGINE_POLL_US");
    if (v == nullptr || *v == '\0')
      return 50;
    return std::max(0, std::atoi(v));
  }();
  return value;
}

std::optional<Launch> engine_launch() {
  static const std::optional<Launch> value = []() -> std::optional<Launch> {
    const char *v = std::getenv("NNCOMM_LAUNCH");
    const std::string name = v == nullptr ? "" : v;
    if (name == "eager")
      return Launch::kEager;
    if (name == "deferred")
      return Launch::kDeferred;
    return std::nullopt;
  }();
  return value;
}

size_t chunk_bytes() {
  static const size_t value = env_bytes("NNCOMM_CHUNK_BYTES", 4u << 20);
  return value;
}

size_t direct_bytes() {
  static const size_t value = env_bytes("NNCOMM_DIRECT_BYTES", 1u << 20);
  return value;
}

size_t huge_page_bytes() {
  static const size_t value = env_bytes("NNCOMM_HUGE_PAGE_BYTES", 4u << 20);
  return value;
}

} // namespace config
} // namespace nncomm
