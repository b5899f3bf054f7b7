// Runs the CUDA packing kernel's code (src/cuda/pack_tile.cuh) on the CPU, one
// tile and one thread at a time, and checks it against the host twin
// (src/core/pack.cpp) byte for byte: the kernel's indexing, vector/scalar split,
// dispatch and arithmetic, tested where there is no GPU. Threads of a block
// write disjoint elements, so running them one after another is one of the
// orders a GPU may run them in. With the NaN/infinity check, the kernel's
// per-row flags (a block's vote being the OR of its threads' findings) and
// the check kernel's (buckets reduced in place, float64 rows) must be the
// host's all_finite, row by row, with NaNs, infinities, denormals, -0.0 and
// the largest finite values put among the values.
//
// Built and run by tests/test_packing_kernel_on_cpu.py:
//   nvcc -std=c++17 -Iinclude -Isrc emulate_pack.cu src/core/pack.cpp
//        src/host/elementwise.cpp -o emulate_pack && ./emulate_pack CASES SEED
// Prints "emulate_pack: N cases passed" or the first mismatch (exit 1).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "nncomm/core/pack.hpp"
#include "nncomm/host/elementwise.hpp"
#include "cuda/pack_tile.cuh"
#include "random_values.hpp"

using namespace nncomm;

namespace {

// Threads per block: the kernel's 256, and others, under which a thread
// has more vectors of a tile than one batch, or fewer.
constexpr unsigned kThreads[] = {256, 96, 32, 1};
constexpr DType kDevice[] = {DType::kFloat32, DType::kFloat16,
                             DType::kBFloat16};

// Every tile of the bucket, every thread of each tile, of the kernel the
// packer would launch (the word copy where every row travels as itself);
// with `flags`, the checking one.
void run_kernel(const PackTable &t, void *bucket, DType wire, bool packing,
                float scale, int divisor, unsigned threads,
                unsigned *flags = nullptr) {
  const Scaling s = make_scaling(scale, divisor);
  const bool copy = scale == 1.0f && divisor == 1;
  std::vector<PackEntry> rows = t.entries;
  const uint64_t tiles = assign_tiles(rows.data(), rows.size(), wire);
  const bool words = moves_words(rows.data(), rows.size(), wire, copy);
  char *b = static_cast<char *>(bucket);
  for (uint64_t tile = 0; tile < tiles; ++tile) {
    Finding block;
    for (unsigned thread = 0; thread < threads; ++thread) {
      const Lane lane{thread, threads};
      Finding found;
      if (flags == nullptr && words)
        copy_bucket_tile(rows.data(), rows.size(), b, wire, packing, tile,
                         lane);
      else if (flags == nullptr)
        move_bucket_tile(rows.data(), rows.size(), b, wire, packing, s, copy,
                         tile, lane);
      else if (words)
        copy_bucket_tile<true>(rows.data(), rows.size(), b, wire, packing,
                               tile, lane, &found);
      else
        move_bucket_tile<true>(rows.data(), rows.size(), b, wire, packing, s,
                               copy, tile, lane, &found);
      block.row = found.row;
      block.nonfinite |= found.nonfinite;
    }
    if (block.nonfinite)
      flags[block.row] = 1;
  }
}

// The check kernel over `count` elements of `dt` at `p`: its flag.
bool run_check_kernel(const void *p, size_t count, DType dt,
                      unsigned threads) {
  const uint64_t per_tile = check_tile_elements(dt);
  bool flag = false;
  for (uint64_t tile = 0; tile * per_tile < count; ++tile) {
    for (unsigned thread = 0; thread < threads; ++thread)
      flag |= check_tile(p, count, dt, tile, Lane{thread, threads});
  }
  return flag;
}

// Puts 1 to 3 special values (NaN or infinity with `bad`) at random
// elements of the `count` at `p`.
void put_specials(char *p, size_t count, DType dt, bool bad,
                  std::mt19937_64 &rng) {
  for (int k = 1 + rng() % 3; k > 0; --k)
    put_special(p, rng() % count, dt, bad, rng);
}

struct Tensor {
  DType dtype;
  size_t shift;           // elements before element 0: misaligns it
  std::vector<char> host; // the twin's copy
  std::vector<char> emul; // the emulated kernel's copy
  char *base(std::vector<char> &v) {
    return v.data() + shift * dtype_size(dtype);
  }
};

bool same(const std::vector<char> &a, const std::vector<char> &b,
          const std::string &what, int c) {
  return same_bytes(a.data(), b.data(), a.size(),
                    "case " + std::to_string(c) + ": " + what);
}

bool run_case(int c, std::mt19937_64 &rng) {
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  const DType wire = kDevice[pick(3)];
  const float scales[] = {1.0f, 0.5f, 3.0f, -1.25f, 0.1f};
  const int divisors[] = {1, 2, 3, 7, 8};
  // A quarter of the buckets travel as themselves: the word-copy kernel's.
  const bool as_is = pick(4) == 0;
  const float scale = as_is ? 1.0f : scales[pick(5)];
  const int divisor = as_is ? 1 : divisors[pick(5)];
  const unsigned threads = kThreads[pick(4)];
  // Half the cases pack checked, some of their tensors holding NaNs or
  // infinities; every tensor may hold denormals, -0.0 and the largest
  // finite values, which must not be flagged.
  const bool check = pick(2) == 0;
  bool nan = false; // NaN payloads may convert differently: bytes unchecked
  // Around vector widths and the tiles of rows with a float32 side (t4) and
  // of 16-bit rows in a 16-bit bucket (t2).
  const size_t t4 = kPackTileBytes / 4, t2 = kPackTileBytes / 2;
  const size_t sizes[] = {1,      3,      7,      8,          9,
                          31,     t4 - 1, t4,     t4 + 1,     t2 - 1,
                          t2 + 1, 2 * t2, 3 * t4 + 5};
  constexpr size_t kSizes = sizeof sizes / sizeof sizes[0];

  // Tensors, each cut into a few segments (a split tensor), some of them
  // with address 0.
  std::vector<Tensor> tensors(1 + pick(6));
  std::vector<PackSegment> host_segments, emul_segments;
  for (Tensor &t : tensors) {
    t.dtype = as_is ? wire : kDevice[pick(3)];
    t.shift = pick(9);
    const size_t count =
        pick(4) == 0 ? 1 + pick(3 * t2) : sizes[pick(kSizes)];
    t.host.resize((t.shift + count) * dtype_size(t.dtype));
    fill_random(t.host.data(), t.host.size(), t.dtype, rng);
    if (pick(2) == 0)
      put_specials(t.base(t.host), count, t.dtype, false, rng);
    if (check && pick(2) == 0) {
      put_specials(t.base(t.host), count, t.dtype, true, rng);
      nan = true;
    }
    t.emul = t.host;
    const bool zeros = pick(10) == 0;
    for (size_t done = 0; done < count;) {
      const size_t take = std::min(count - done, 1 + pick(count));
      host_segments.push_back(
          {zeros ? nullptr : t.base(t.host), t.dtype, done, take});
      emul_segments.push_back(
          {zeros ? nullptr : t.base(t.emul), t.dtype, done, take});
      done += take;
    }
  }
  PackTable host_table, emul_table;
  if (!build_pack_table(host_segments.data(), host_segments.size(), wire,
                        &host_table)
           .ok() ||
      !build_pack_table(emul_segments.data(), emul_segments.size(), wire,
                        &emul_table)
           .ok()) {
    std::printf("case %d: build_pack_table failed\n", c);
    return false;
  }
  // The bucket starts `bshift` elements into its buffer, guards after it.
  const size_t w = dtype_size(wire), bshift = pick(9), guard = 5;
  std::vector<char> host_bucket((bshift + host_table.count + guard) * w,
                                char(0xA5));
  std::vector<char> emul_bucket = host_bucket;
  std::vector<size_t> host_rows;
  std::vector<unsigned> flags(emul_table.entries.size(), 0);
  pack_host(host_table, host_bucket.data() + bshift * w, wire, scale,
            check ? &host_rows : nullptr);
  run_kernel(emul_table, emul_bucket.data() + bshift * w, wire, true, scale, 1,
             threads, check ? flags.data() : nullptr);
  if (!nan && !same(host_bucket, emul_bucket, "packed buckets", c))
    return false;
  std::vector<unsigned> host_flags(flags.size(), 0);
  for (size_t r : host_rows)
    host_flags[r] = 1;
  for (size_t r = 0; r < flags.size(); ++r) {
    if (flags[r] != host_flags[r]) {
      std::printf("case %d: row %zu flagged %u, the host's %u\n", c, r,
                  flags[r], host_flags[r]);
      return false;
    }
  }

  // Unpack a bucket of fresh values into the tensors.
  std::vector<char> payload(host_table.count * w);
  fill_random(payload.data(), payload.size(), wire, rng);
  std::memcpy(host_bucket.data() + bshift * w, payload.data(), payload.size());
  std::memcpy(emul_bucket.data() + bshift * w, payload.data(), payload.size());
  unpack_host(host_table, host_bucket.data() + bshift * w, wire, scale,
              divisor);
  run_kernel(emul_table, emul_bucket.data() + bshift * w, wire, false, scale,
             divisor, threads);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!same(tensors[i].host, tensors[i].emul,
              "unpacked tensor " + std::to_string(i), c))
      return false;
  }
  return true;
}

// The check kernel on one array of any floating dtype (float64 included),
// misaligned by up to 8 elements, against all_finite.
bool check_case(int c, std::mt19937_64 &rng) {
  constexpr DType kChecked[] = {DType::kFloat32, DType::kFloat16,
                                DType::kBFloat16, DType::kFloat64};
  const DType dt = kChecked[rng() % 4];
  const size_t per_tile = check_tile_elements(dt);
  const size_t sizes[] = {1, 2, 9, 17, per_tile - 1, per_tile, per_tile + 3,
                          2 * per_tile + 7};
  const size_t count = rng() % 3 == 0 ? 1 + rng() % (3 * per_tile)
                                      : sizes[rng() % 8];
  const size_t shift = rng() % 9;
  std::vector<char> bytes((shift + count) * dtype_size(dt));
  fill_random(bytes.data(), bytes.size(), dt, rng);
  char *p = bytes.data() + shift * dtype_size(dt);
  if (rng() % 2 == 0)
    put_specials(p, count, dt, false, rng);
  if (rng() % 2 == 0)
    put_specials(p, count, dt, true, rng);
  const bool flag = run_check_kernel(p, count, dt, kThreads[rng() % 4]);
  if (flag == !all_finite(p, dt, count))
    return true;
  std::printf("check case %d: %zu elements of %s flagged %d\n", c, count,
              dtype_name(dt), int(flag));
  return false;
}

} // namespace

int main(int argc, char **argv) {
  const int cases = argc > 1 ? std::atoi(argv[1]) : 300;
  std::mt19937_64 rng(argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1);
  for (int c = 0; c < cases; ++c) {
    if (!run_case(c, rng) || !check_case(c, rng))
      return 1;
  }
  std::printf("emulate_pack: %d cases passed\n", cases);
  return 0;
}
