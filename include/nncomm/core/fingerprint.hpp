// Fingerprint: values folded FNV-1a style into 64 bits, the same on every
// rank for the same values: what ranks compare to tell whether they make
// the same call.
#pragma once

#include <cstdint>

namespace nncomm {

class Fingerprint {
public:
  Fingerprint &add(uint64_t v) {
    hash_ ^= v;
    hash_ *= 1099511628211ull;
    return *this;
  }
  Fingerprint &add(const char *text) {
    for (; *text != '\0'; ++text)
      add(static_cast<uint64_t>(*text));
    return *this;
  }
  uint64_t value() const { return hash_; }

private:
  uint64_t hash_ = 14695981039346656037ull;
};

} // namespace nncomm
