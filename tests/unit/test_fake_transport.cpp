// The fake itself: its results are the reference's, bit for bit, and its
// controls do what the other tests rely on.
#include <chrono>
#include <cstring>
#include <thread>

#include "check.hpp"
#include "fake_transport.hpp"
#include "nncomm/core/wait.hpp"
#include "reference.hpp"

using namespace nncomm;
using namespace unit;

namespace {

const DType kAllDtypes[] = {DType::kFloat32, DType::kFloat64,
                            DType::kFloat16, DType::kBFloat16,
                            DType::kInt32,   DType::kInt64};

// Waits for the operation `started` opened.
Status waited(Status started, WorkPtr &work, int rank) {
  NNCOMM_RETURN_IF_ERROR(started);
  return wait_for(*work, rank == 0, nullptr);
}

std::vector<const Array *> pointers(const std::vector<Array> &arrays) {
  std::vector<const Array *> p;
  for (const Array &a : arrays)
    p.push_back(&a);
  return p;
}

// Blocks of `counts` in rank order, `gap` elements apart.
Blocks spaced(const std::vector<size_t> &counts, size_t gap) {
  Blocks blocks;
  size_t at = gap;
  for (size_t count : counts) {
    blocks.counts.push_back(count);
    blocks.offsets.push_back(at);
    at += count + gap;
  }
  return blocks;
}

// `count` elements of `from` from `from_at` on, into `to` from `to_at` on.
void copy_into(Array &to, size_t to_at, const Array &from, size_t from_at,
               size_t count) {
  const size_t elem = dtype_size(to.dtype());
  std::memcpy(static_cast<char *>(to.data()) + to_at * elem,
              static_cast<const char *>(from.data()) + from_at * elem,
              count * elem);
}

} // namespace

TEST(fake_allreduce_sums_in_rank_order_and_scales) {
  std::mt19937_64 rng(1);
  for (int size : {2, 3, 4}) {
    for (DType dt : kAllDtypes) {
      const bool floating = dtype_is_floating(dt);
      const float scale = floating ? 0.1f : 1.0f;
      const int divisor = floating ? 3 : 1;
      std::vector<Array> in, out;
      for (int r = 0; r < size; ++r)
        in.push_back(random_array(dt, 257, rng));
      out = in;
      FakeWorld world(size);
      run_ranks(size, [&](int rank) {
        auto transport = world.transport(rank);
        WorkPtr work;
        CHECK_OK(waited(transport->start_allreduce(out[rank].data(), 257, dt,
                                                   scale, divisor, &work),
                        work, rank));
      });
      const Array want = reduced(pointers(in), dt, scale, divisor, dt);
      for (int r = 0; r < size; ++r)
        CHECK_SAME(out[r], want);
    }
  }
}

TEST(fake_rooted_and_gathering_operations) {
  std::mt19937_64 rng(2);
  const size_t n = 33;
  for (int size : {2, 3, 4}) {
    for (DType dt : kAllDtypes) {
      for (int root = 0; root < size; ++root) {
        std::vector<Array> in, reduce, bcast, gathered, scattered;
        for (int r = 0; r < size; ++r) {
          in.push_back(random_array(dt, size * n, rng));
          gathered.emplace_back(dt, size * size * n);
          scattered.emplace_back(dt, n);
        }
        reduce = bcast = in;
        FakeWorld world(size);
        run_ranks(size, [&](int rank) {
          auto t = world.transport(rank);
          WorkPtr work;
          CHECK_OK(waited(t->start_reduce(reduce[rank].data(), size * n, dt,
                                          root, 1, &work),
                          work, rank));
          CHECK_OK(waited(t->start_bcast(bcast[rank].data(), size * n, dt,
                                         root, &work),
                          work, rank));
          CHECK_OK(waited(t->start_allgather(in[rank].data(),
                                             gathered[rank].data(), size * n,
                                             dt, &work),
                          work, rank));
          CHECK_OK(waited(t->start_reduce_scatter(in[rank].data(),
                                                  scattered[rank].data(), n,
                                                  dt, 1, &work),
                          work, rank));
          CHECK_OK(waited(t->start_barrier(&work), work, rank));
        });
        const Array sum = reduced(pointers(in), dt, 1.0f, 1, dt);
        for (int r = 0; r < size; ++r) {
          CHECK_SAME(reduce[r], r == root ? sum : in[r]);
          CHECK_SAME(bcast[r], in[root]);
          for (int q = 0; q < size; ++q)
            CHECK_SAME(gathered[r].slice(q * size * n, size * n), in[q]);
          CHECK_SAME(scattered[r], sum.slice(r * n, n));
        }
      }
    }
  }
}

TEST(fake_alltoallv_and_allgatherv_move_blocks_where_they_lie) {
  std::mt19937_64 rng(3);
  // Rank q sends rank r (q + 2r) % 4 elements (none to some) in an
  // alltoallv, and (3q + 1) % 4 to every rank in an allgatherv. Blocks lie
  // apart; what lies between them must stay as it was.
  const auto count = [](int q, int r) { return size_t((q + 2 * r) % 4); };
  const auto gathered = [](int q) { return size_t((3 * q + 1) % 4); };
  for (int size : {1, 2, 3, 4}) {
    for (DType dt : kAllDtypes) {
      std::vector<Blocks> sends(size), recvs(size), gathers(size);
      std::vector<Array> in, out, all, gather_in;
      for (int r = 0; r < size; ++r) {
        std::vector<size_t> to, from, each;
        for (int q = 0; q < size; ++q) {
          to.push_back(count(r, q));
          from.push_back(count(q, r));
          each.push_back(gathered(q));
        }
        sends[r] = spaced(to, 1);
        recvs[r] = spaced(from, 2);
        gathers[r] = spaced(each, r);
        in.push_back(random_array(dt, sends[r].extent() + 1, rng));
        out.push_back(random_array(dt, recvs[r].extent() + 2, rng));
        all.push_back(random_array(dt, gathers[r].extent() + 1, rng));
        gather_in.push_back(random_array(dt, gathered(r), rng));
      }
      std::vector<Array> want_out = out, want_all = all;
      for (int r = 0; r < size; ++r) {
        for (int q = 0; q < size; ++q) {
          copy_into(want_out[r], recvs[r].offsets[q], in[q],
                    sends[q].offsets[r], count(q, r));
          copy_into(want_all[r], gathers[r].offsets[q], gather_in[q], 0,
                    gathered(q));
        }
      }
      FakeWorld world(size);
      run_ranks(size, [&](int rank) {
        auto t = world.transport(rank);
        WorkPtr work;
        CHECK_OK(waited(t->start_alltoallv(in[rank].data(), sends[rank],
                                           out[rank].data(), recvs[rank], dt,
                                           &work),
                        work, rank));
        CHECK_OK(waited(t->start_allgatherv(gather_in[rank].data(),
                                            gathered(rank), all[rank].data(),
                                            gathers[rank], dt, &work),
                        work, rank));
      });
      for (int r = 0; r < size; ++r) {
        CHECK_SAME(out[r], want_out[r]);
        CHECK_SAME(all[r], want_all[r]);
      }
    }
  }
}

TEST(fake_alltoallv_fails_where_counts_do_not_match) {
  // Rank 0 expects 3 elements from rank 1, which sends it 2.
  FakeWorld world(2);
  std::vector<Array> in(2, Array(DType::kInt32, 4)),
      out(2, Array(DType::kInt32, 5));
  run_ranks(2, [&](int rank) {
    auto t = world.transport(rank);
    const Blocks blocks = Blocks::packed({2, 2});
    const Blocks expects = Blocks::packed({2, rank == 0 ? 3u : 2u});
    WorkPtr work;
    const Status status =
        waited(t->start_alltoallv(in[rank].data(), blocks, out[rank].data(),
                                  expects, DType::kInt32, &work),
               work, rank);
    CHECK_EQ(status.code(), StatusCode::kInvalidArgument);
    CHECK_CONTAINS(status.message(), "world rank 1 sends 2 elements to "
                                     "world rank 0, which expects 3");
  });
}

TEST(fake_unite_ors_every_rank_words) {
  FakeWorld world(3);
  run_ranks(3, [&](int rank) {
    auto t = world.transport(rank);
    uint64_t words[2] = {uint64_t{1} << rank, rank == 2 ? ~uint64_t{0} : 0};
    CHECK_OK(t->unite(words, 2));
    CHECK_EQ(words[0], uint64_t{7});
    CHECK_EQ(words[1], ~uint64_t{0});
  });
}

TEST(fake_agree_and_check_call) {
  FakeWorld world(3);
  run_ranks(3, [&](int rank) {
    auto t = world.transport(rank);
    bool same = false;
    CHECK_OK(t->agree(42, &same));
    CHECK(same);
    CHECK_OK(t->agree(rank == 1 ? 7 : 42, &same));
    CHECK(!same);
    // A signature is compared the first time only, unless `always`.
    CHECK_OK(t->check_call(5, false));
    CHECK_OK(t->check_call(5, false));
    CHECK_OK(t->check_call(5, true));
    // Ranks comparing different signatures fail together.
    const Status differ = t->check_call(rank == 2 ? 9 : 8, false);
    CHECK_EQ(differ.code(), StatusCode::kInvalidArgument);
    CHECK_CONTAINS(differ.message(), "make different calls");
  });
  for (int r = 0; r < 3; ++r) {
    CHECK_EQ(world.calls(r),
             (std::vector<Call>{{OpKind::kAgree},
                                {OpKind::kAgree},
                                {OpKind::kCheck},
                                {OpKind::kCheck},
                                {OpKind::kCheck}}));
  }
}

TEST(fake_different_calls_fail_on_every_rank) {
  for (int size : {2, 3, 4}) {
    FakeWorld world(size);
    std::vector<Array> bufs(size, Array(DType::kFloat32, 5));
    run_ranks(size, [&](int rank) {
      auto t = world.transport(rank);
      WorkPtr work;
      const size_t count = rank == size - 1 ? 5 : 4;
      const Status status = waited(
          t->start_allreduce(bufs[rank].data(), count, DType::kFloat32, 1.0f,
                             1, &work),
          work, rank);
      CHECK_EQ(status.code(), StatusCode::kInvalidArgument);
      CHECK_CONTAINS(status.message(), "allreduce of " +
                                           std::to_string(count) +
                                           " float32 here");
      CHECK_CONTAINS(status.message(), "operation 0 on the group");
      // The ranks go on matching the next operation.
      CHECK_OK(waited(t->start_barrier(&work), work, rank));
    });
  }
}

TEST(fake_failing_operation_fails_on_its_rank_only) {
  FakeWorld world(3, {10, 11, 12});
  world.fail_operation(1, 1);
  run_ranks(3, [&](int rank) {
    auto t = world.transport(rank);
    WorkPtr work;
    for (size_t k = 0; k < 3; ++k) {
      const Status status = waited(t->start_barrier(&work), work, rank);
      if (rank == 1 && k == 1) {
        CHECK_EQ(status.code(), StatusCode::kTransport);
        CHECK_CONTAINS(status.message(), "operation 1 on the group of world "
                                         "ranks [10, 11, 12] failed on "
                                         "world rank 11");
      } else {
        CHECK_OK(status);
      }
    }
  });
}

TEST(fake_late_rank_is_reported_missing_until_it_arrives) {
  using namespace std::chrono;
  FakeWorld world(3, {4, 6, 8});
  world.set_delay(2, milliseconds(300));
  const auto start = steady_clock::now();
  run_ranks(3, [&](int rank) {
    auto t = world.transport(rank);
    WorkPtr work;
    CHECK_OK(t->start_barrier(&work));
    if (rank == 0) {
      std::this_thread::sleep_for(milliseconds(100));
      bool done = true;
      CHECK_OK(work->test(&done));
      CHECK(!done);
      const Stall stall = work->inspect();
      CHECK(stall.known);
      CHECK_EQ(stall.missing, std::vector<int>{8});
      CHECK(stall.differing.empty());
    }
    CHECK_OK(wait_for(*work, rank == 0, nullptr));
    CHECK(steady_clock::now() - start >= milliseconds(300));
  });
}
