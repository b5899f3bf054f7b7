// The bucket runner on host memory, one bucket at a time on fake ranks: a direct bucket is
// reduced where it lies, a staged one packed and unpacked into the pieces
// of its tensors and nowhere else, and zeros are sent without anything
// being written back.
#include <optional>

#include "check.hpp"
#include "fake_transport.hpp"
#include "nncomm/core/bucket_runner.hpp"
#include "nncomm/core/wait.hpp"
#include "reference.hpp"

using namespace nncomm;
using namespace unit;

namespace {

// What a rank passes for one tensor: its array, or nothing (nullptr).
using Tensors = std::vector<std::optional<Array>>;

struct Reduction {
  Bucket bucket;
  float scale = 1.0f;
  int divisor = 1;
  int zeros_rank = -1; // the rank that sends zeros (failed), if any
  bool imprecise = false; // the transport would scale imprecisely
};

// Reduces `r.bucket` of `tensors[rank]` on every rank, with one runner each.
void run_bucket(FakeWorld &world, const Reduction &r,
                std::vector<Tensors> &tensors) {
  run_ranks(world.size(), [&](int rank) {
    std::unique_ptr<FakeTransport> transport = world.transport(rank);
    if (r.imprecise)
      transport->scale_imprecisely();
    BucketRunner runner(*transport, std::make_unique<HostArrays>());
    CHECK_OK(runner.prepare({r.bucket}));
    std::vector<void *> ptrs;
    std::vector<DType> dtypes;
    for (std::optional<Array> &t : tensors[rank]) {
      ptrs.push_back(t ? t->data() : nullptr);
      dtypes.push_back(t ? t->dtype() : r.bucket.dtype);
    }
    WorkPtr work;
    CHECK_OK(runner.start(0, r.bucket, TensorTable{ptrs, dtypes}, r.scale,
                          r.divisor, rank == r.zeros_rank, false, &work));
    CHECK_OK(wait_for(*work, rank == 0, nullptr));
    CHECK_OK(runner.finish());
  });
}

// What segment `s` of the bucket should hold on each rank once reduced.
Array segment_reduced(const Reduction &r, const std::vector<Tensors> &before,
                      const Segment &s, DType out) {
  std::vector<std::optional<Array>> pieces(before.size());
  std::vector<const Array *> shares;
  for (size_t rank = 0; rank < before.size(); ++rank) {
    const std::optional<Array> &t = before[rank][s.tensor];
    if (t && static_cast<int>(rank) != r.zeros_rank)
      pieces[rank] = t->slice(s.tensor_offset, s.count);
    shares.push_back(pieces[rank] ? &*pieces[rank] : nullptr);
  }
  return reduced(shares, r.bucket.dtype, r.scale, r.divisor, out);
}

// Checks every rank's tensors after `r`: segments reduced where the rank
// has the tensor and did not send zeros; everything else as before.
void check_bucket(const Reduction &r, const std::vector<Tensors> &before,
                  const std::vector<Tensors> &after) {
  for (size_t rank = 0; rank < after.size(); ++rank) {
    for (size_t t = 0; t < after[rank].size(); ++t) {
      if (!after[rank][t])
        continue;
      Array want = *before[rank][t];
      if (static_cast<int>(rank) != r.zeros_rank) {
        for (const Segment &s : r.bucket.segments) {
          if (s.tensor != t)
            continue;
          const Array piece = segment_reduced(r, before, s, want.dtype());
          for (size_t i = 0; i < s.count; ++i)
            want.set(s.tensor_offset + i, piece.get(i));
        }
      }
      CHECK_SAME(*after[rank][t], want);
    }
  }
}

std::vector<Tensors> random_tensors(int size,
                                    const std::vector<TensorSpec> &specs,
                                    std::mt19937_64 &rng) {
  std::vector<Tensors> tensors(size);
  for (Tensors &t : tensors) {
    for (const TensorSpec &s : specs)
      t.emplace_back(random_array(s.dtype, s.count, rng));
  }
  return tensors;
}

Bucket direct_bucket(size_t tensor, size_t offset, size_t count) {
  Bucket b;
  b.dtype = DType::kFloat32;
  b.count = count;
  b.direct = true;
  b.segments = {{tensor, offset, count}};
  b.tensors = {tensor};
  return b;
}

// Pieces of three tensors (tensor 0 split: its middle only), float32 wire.
Bucket staged_bucket() {
  Bucket b;
  b.dtype = DType::kFloat32;
  b.segments = {{0, 3, 10}, {1, 0, 7}, {2, 0, 1}};
  b.count = 18;
  b.tensors = {0, 1, 2};
  return b;
}

const std::vector<TensorSpec> kStagedSpecs = {
    {20, DType::kFloat32}, {7, DType::kFloat16}, {1, DType::kFloat32}};

} // namespace

TEST(host_runner_reduces_a_direct_bucket_in_place) {
  std::mt19937_64 rng(1);
  for (int size : {2, 3, 4}) {
    Reduction r;
    r.bucket = direct_bucket(1, 5, 30);
    r.scale = 0.1f;
    r.divisor = size;
    const std::vector<Tensors> before = random_tensors(
        size, {{4, DType::kFloat32}, {40, DType::kFloat32}}, rng);
    std::vector<Tensors> after = before;
    FakeWorld world(size);
    run_bucket(world, r, after);
    check_bucket(r, before, after);
    for (int rank = 0; rank < size; ++rank) {
      const std::vector<LoggedOp> log = world.log(rank);
      CHECK_EQ(log.size(), size_t(1));
      CHECK_EQ(log[0].call, (Call{OpKind::kAllreduce, 30, DType::kFloat32}));
      CHECK(log[0].buffer ==
            static_cast<const char *>(after[rank][1]->data()) + 5 * 4);
    }
  }
}

TEST(host_runner_stages_a_direct_bucket_the_transport_would_scale_badly) {
  // Scaled by packing instead, as NCCL's float16 scalar would lose
  // precision; unscaled, it stays in place.
  std::mt19937_64 rng(4);
  for (float scale : {0.1f, 1.0f}) {
    Reduction r;
    r.bucket = direct_bucket(0, 0, 16);
    r.scale = scale;
    r.divisor = scale == 1.0f ? 1 : 3;
    r.imprecise = true;
    const std::vector<Tensors> before =
        random_tensors(3, {{16, DType::kFloat32}}, rng);
    std::vector<Tensors> after = before;
    FakeWorld world(3);
    run_bucket(world, r, after);
    check_bucket(r, before, after);
    for (int rank = 0; rank < 3; ++rank) {
      const bool in_place = world.log(rank)[0].buffer == after[rank][0]->data();
      CHECK_EQ(in_place, scale == 1.0f);
    }
  }
}

TEST(host_runner_stages_pieces_of_tensors) {
  std::mt19937_64 rng(2);
  for (int size : {2, 3, 4}) {
    Reduction r;
    r.bucket = staged_bucket();
    r.scale = -1.25f;
    r.divisor = 3;
    const std::vector<Tensors> before =
        random_tensors(size, kStagedSpecs, rng);
    std::vector<Tensors> after = before;
    FakeWorld world(size);
    run_bucket(world, r, after);
    check_bucket(r, before, after);
    for (int rank = 0; rank < size; ++rank) {
      CHECK_EQ(world.calls(rank),
               (std::vector<Call>{{OpKind::kAllreduce, 18, DType::kFloat32}}));
    }
  }
}

TEST(host_runner_stages_a_direct_bucket_of_another_dtype) {
  std::mt19937_64 rng(3);
  Reduction r;
  r.bucket = direct_bucket(0, 0, 16);
  r.scale = 3.0f;
  std::vector<Tensors> before =
      random_tensors(2, {{16, DType::kFloat32}}, rng);
  before[1][0] = random_array(DType::kFloat16, 16, rng);
  std::vector<Tensors> after = before;
  FakeWorld world(2);
  run_bucket(world, r, after);
  check_bucket(r, before, after);
  CHECK(world.log(0)[0].buffer == after[0][0]->data());
  CHECK(world.log(1)[0].buffer != after[1][0]->data());
}

TEST(host_runner_zeros_write_nothing_back) {
  std::mt19937_64 rng(4);
  for (int size : {2, 3, 4}) {
    for (bool direct : {false, true}) {
      // The last rank failed (zeros); rank 0 never wrote tensor 1.
      Reduction r;
      r.bucket = direct ? direct_bucket(1, 0, 7) : staged_bucket();
      r.divisor = 2;
      r.zeros_rank = size - 1;
      const std::vector<TensorSpec> specs =
          direct ? std::vector<TensorSpec>{{1, DType::kFloat32},
                                           {7, DType::kFloat32}}
                 : kStagedSpecs;
      std::vector<Tensors> before = random_tensors(size, specs, rng);
      before[0][1].reset();
      std::vector<Tensors> after = before;
      FakeWorld world(size);
      run_bucket(world, r, after);
      check_bucket(r, before, after);
    }
  }
}
