#include "nncomm/host/huge_pages.hpp"

#include <sys/mman.h>

#include <cstdint>
#include <mutex>
#include <unordered_set>

namespace nncomm {

namespace {
constexpr uintptr_t kHugePage = uintptr_t(2) << 20;
// MADV_COLLAPSE (Linux 6.1) is missing from older headers.
constexpr int kMadvCollapse = 25;
// Bounds the memory of the set below; past it, ranges may be advised again,
// which is harmless.
constexpr size_t kMaxRemembered = 4096;
} // namespace

void prefer_huge_pages(void *p, size_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t lo = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t hi = (begin + bytes) & ~(kHugePage - 1);
  if (hi <= lo)
    return;

  static std::mutex mutex;
  static std::unordered_set<uintptr_t> advised;
  const uintptr_t key = lo ^ (hi << 1);
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!advised.insert(key).second)
      return;
    if (advised.size() > kMaxRemembered)
      advised.clear();
  }
  void *start = reinterpret_cast<void *>(lo);
  if (madvise(start, hi - lo, MADV_HUGEPAGE) == 0) {
    madvise(start, hi - lo, kMadvCollapse);
  }
}

} // namespace nncomm
