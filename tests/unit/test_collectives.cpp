// The list collectives on fake ranks: results against the reference, the
// messages a fused all_reduce sends, zeroing arrays, roots, gathering and
// scattering, and calls that differ between ranks.
#include <algorithm>
#include <map>
#include <numeric>
#include <optional>

#include "check.hpp"
#include "fake_transport.hpp"
#include "nncomm/collectives/list_collectives.hpp"
#include "nncomm/observability/config.hpp"
#include "reference.hpp"

using namespace nncomm;
using namespace unit;

namespace {

const DType kFloating[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                           DType::kBFloat16};

struct Spec {
  DType dtype;
  size_t count;
};

// A rank's arrays: nullopt for a zeroing one (nullptr).
using Arrays = std::vector<std::optional<Array>>;

std::vector<ArrayRef> refs(Arrays &arrays, const std::vector<Spec> &specs) {
  std::vector<ArrayRef> r;
  for (size_t i = 0; i < specs.size(); ++i) {
    r.push_back({arrays[i] ? arrays[i]->data() : nullptr, specs[i].count,
                 specs[i].dtype});
  }
  return r;
}

Arrays random_arrays(const std::vector<Spec> &specs, std::mt19937_64 &rng) {
  Arrays arrays;
  for (const Spec &s : specs)
    arrays.emplace_back(random_array(s.dtype, s.count, rng));
  return arrays;
}

// Elements of `dtype` that reach the direct threshold.
size_t direct_count(DType dtype) {
  return config::direct_bytes() / dtype_size(dtype);
}

// Whether array `s` travels packed into its dtype's message; arrays of no
// elements travel in none.
bool fused(const Spec &s, bool fuse) {
  return fuse && s.count > 0 &&
         s.count * dtype_size(s.dtype) < config::direct_bytes();
}

bool direct(const Spec &s, bool fuse) { return s.count > 0 && !fused(s, fuse); }

// Memory for zeroing arrays, handed out by the Materializer and recorded.
struct Zeroing {
  std::vector<Spec> specs;
  std::vector<std::optional<Array>> given; // by array index
  std::vector<size_t> asked;

  static void *give(void *context, size_t index) {
    Zeroing &z = *static_cast<Zeroing *>(context);
    z.asked.push_back(index);
    std::mt19937_64 rng(index); // stale contents, to be overwritten
    z.given[index] =
        random_array(z.specs[index].dtype, z.specs[index].count, rng);
    return z.given[index]->data();
  }
};

// One all_reduce of arrays `specs` over every rank, `arrays[r]` holding
// rank r's (nullopt: zeroing there); checks the results, which zeroing
// arrays got memory, and the messages. Without `zeroing` the call gets no
// materializer (as device memory, which is never zeroing), and `arrays`
// must all be there.
void check_all_reduce(int size, const std::vector<Spec> &specs,
                      const std::vector<Arrays> &arrays, bool division,
                      float scale, bool fuse, bool zeroing = true) {
  FakeWorld world(size);
  std::vector<Arrays> after = arrays;
  std::vector<Zeroing> given(size, Zeroing{specs, Arrays(specs.size()), {}});
  std::vector<std::vector<Call>> sent(size);
  run_ranks(size, [&](int rank) {
    auto transport = world.transport(rank);
    HostArrays memory;
    std::vector<ArrayRef> list = refs(after[rank], specs);
    const Materializer materialize =
        zeroing ? Materializer{&Zeroing::give, &given[rank]}
                : Materializer{nullptr, nullptr};
    CHECK_OK(all_reduce_list(*transport, memory, list, division, scale, fuse,
                             materialize));
    for (const Call &c : world.calls(rank)) {
      if (c.kind != OpKind::kCheck)
        sent[rank].push_back(c);
    }
  });

  std::vector<bool> written(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    for (const Arrays &a : arrays)
      written[i] = written[i] || a[i].has_value();
  }

  // With `zeroing`, the message of the first array's dtype first (it
  // carries a flag per array saying which were written somewhere), then
  // each other dtype's, in order of first appearance, if one of its arrays
  // was written somewhere, then each direct array written somewhere.
  std::vector<DType> dtypes;
  if (zeroing)
    dtypes.push_back(specs[0].dtype);
  std::map<DType, size_t> counts;
  std::map<DType, bool> wanted;
  for (size_t i = 0; i < specs.size(); ++i) {
    const DType dt = specs[i].dtype;
    if (!fused(specs[i], fuse))
      continue;
    if (std::find(dtypes.begin(), dtypes.end(), dt) == dtypes.end())
      dtypes.push_back(dt);
    counts[dt] += specs[i].count;
    wanted[dt] = wanted[dt] || written[i];
  }
  std::vector<Call> expected;
  for (size_t k = 0; k < dtypes.size(); ++k) {
    if (k == 0 && zeroing) {
      expected.push_back({OpKind::kAllreduce, counts[dtypes[0]] + specs.size(),
                          dtypes[0]});
    } else if (wanted[dtypes[k]]) {
      expected.push_back({OpKind::kAllreduce, counts[dtypes[k]], dtypes[k]});
    }
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    if (direct(specs[i], fuse) && written[i])
      expected.push_back({OpKind::kAllreduce, specs[i].count, specs[i].dtype});
  }
  for (int r = 0; r < size; ++r)
    CHECK_EQ(sent[r], expected);

  // Arrays zeroing here get memory where some rank wrote them, and only
  // there; arrays zeroing everywhere stay as they are.
  for (size_t i = 0; i < specs.size(); ++i) {
    std::vector<const Array *> shares;
    for (const Arrays &a : arrays)
      shares.push_back(a[i] ? &*a[i] : nullptr);
    const Array want = reduced(shares, specs[i].dtype, scale,
                               division ? size : 1, specs[i].dtype);
    for (int r = 0; r < size; ++r) {
      const std::optional<Array> &got =
          arrays[r][i] ? after[r][i] : given[r].given[i];
      CHECK_EQ(got.has_value(), written[i]);
      if (got)
        CHECK_SAME(*got, want);
    }
  }
  for (int r = 0; r < size; ++r) {
    std::vector<size_t> needed;
    for (size_t i = 0; i < specs.size(); ++i) {
      if (!arrays[r][i] && written[i])
        needed.push_back(i);
    }
    std::sort(given[r].asked.begin(), given[r].asked.end());
    CHECK_EQ(given[r].asked, needed);
  }
}

} // namespace

TEST(all_reduce_list_sends_one_message_per_dtype_and_direct_array) {
  std::mt19937_64 rng(1);
  const std::vector<Spec> specs = {{DType::kFloat32, 17},
                                   {DType::kFloat16, 5},
                                   {DType::kFloat32,
                                    direct_count(DType::kFloat32)},
                                   {DType::kFloat64, 9},
                                   {DType::kFloat16, 1},
                                   {DType::kBFloat16, 0}};
  for (int size : {2, 3, 4}) {
    for (bool fuse : {true, false}) {
      std::vector<Arrays> arrays;
      for (int r = 0; r < size; ++r)
        arrays.push_back(random_arrays(specs, rng));
      check_all_reduce(size, specs, arrays, true, 0.5f, fuse);
    }
  }
}

TEST(all_reduce_list_skips_arrays_zeroing_everywhere) {
  // Array 1 (float16, fused) and 2 (direct) are zeroing on every rank,
  // array 3 written on rank 1 only: its message is sent, theirs not.
  std::mt19937_64 rng(2);
  const std::vector<Spec> specs = {{DType::kFloat32, 8},
                                   {DType::kFloat16, 5},
                                   {DType::kFloat32,
                                    direct_count(DType::kFloat32) + 3},
                                   {DType::kFloat64, 6}};
  for (int size : {2, 3, 4}) {
    std::vector<Arrays> arrays;
    for (int r = 0; r < size; ++r) {
      arrays.push_back(random_arrays(specs, rng));
      arrays[r][1].reset();
      arrays[r][2].reset();
      if (r != 1)
        arrays[r][3].reset();
    }
    check_all_reduce(size, specs, arrays, false, -1.25f, true);
  }
}

TEST(all_reduce_list_without_a_materializer_sends_no_flags) {
  // No array can be zeroing (device memory): one message per fused dtype,
  // in order of first appearance, without flags, then the direct arrays;
  // the first array direct or empty changes nothing of that.
  std::mt19937_64 rng(5);
  const std::vector<Spec> specs = {{DType::kFloat32,
                                    direct_count(DType::kFloat32)},
                                   {DType::kFloat16, 5},
                                   {DType::kFloat32, 17},
                                   {DType::kBFloat16, 0},
                                   {DType::kFloat64, 9},
                                   {DType::kFloat16, 1}};
  for (int size : {2, 3, 4}) {
    for (bool fuse : {true, false}) {
      std::vector<Arrays> arrays;
      for (int r = 0; r < size; ++r)
        arrays.push_back(random_arrays(specs, rng));
      check_all_reduce(size, specs, arrays, true, 0.5f, fuse, false);
    }
  }
}

TEST(all_reduce_list_random_lists) {
  std::mt19937_64 rng(3);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  for (int c = 0; c < 30; ++c) {
    const int size = 2 + c % 3;
    // Integers only as they are: no scale, no division.
    const bool integers = pick(4) == 0;
    const float scales[] = {1.0f, 0.5f, -1.25f, 3.0f};
    const float scale = integers ? 1.0f : scales[pick(4)];
    const bool division = !integers && pick(2) == 0;
    std::vector<Spec> specs;
    for (size_t n = 1 + pick(8); specs.size() < n;) {
      const DType dt = integers && pick(2) == 0 ? DType::kInt32
                                                : kFloating[pick(4)];
      const size_t counts[] = {0, direct_count(dt) + pick(3), 1 + pick(300)};
      const size_t roll = pick(12);
      specs.push_back({dt, counts[roll == 0 ? 0 : roll == 1 ? 1 : 2]});
    }
    std::vector<Arrays> arrays;
    for (int r = 0; r < size; ++r)
      arrays.push_back(random_arrays(specs, rng));
    // Some arrays zeroing on some ranks, some on all.
    for (size_t i = 0; i < specs.size(); ++i) {
      const size_t mode = pick(6);
      for (int r = 0; r < size; ++r) {
        if (mode == 0 || (mode == 1 && pick(2) == 0))
          arrays[r][i].reset();
      }
    }
    check_all_reduce(size, specs, arrays, division, scale, pick(2) == 0);
  }
}

TEST(reduce_list_to_each_root) {
  std::mt19937_64 rng(4);
  const std::vector<Spec> specs = {{DType::kFloat16, 7},
                                   {DType::kFloat32,
                                    direct_count(DType::kFloat32)},
                                   {DType::kFloat64, 3},
                                   {DType::kFloat16, 30},
                                   {DType::kFloat64, 0},
                                   {DType::kBFloat16, 4}};
  for (int size : {2, 3, 4}) {
    for (int root = 0; root < size; ++root) {
      for (bool fuse : {true, false}) {
        const bool division = root % 2 == 0;
        std::vector<Arrays> before;
        for (int r = 0; r < size; ++r)
          before.push_back(random_arrays(specs, rng));
        std::vector<Arrays> after = before;
        FakeWorld world(size);
        run_ranks(size, [&](int rank) {
          auto transport = world.transport(rank);
          HostArrays memory;
          CHECK_OK(reduce_list(*transport, memory, refs(after[rank], specs),
                               root, division, fuse));
        });
        for (size_t i = 0; i < specs.size(); ++i) {
          std::vector<const Array *> shares;
          for (const Arrays &a : before)
            shares.push_back(&*a[i]);
          const Array sum = reduced(shares, specs[i].dtype, 1.0f,
                                    division ? size : 1, specs[i].dtype);
          for (int r = 0; r < size; ++r)
            CHECK_SAME(*after[r][i], r == root ? sum : *before[r][i]);
        }
      }
    }
  }
}

namespace {

// Host memory that, as a device's, cannot scale float64 messages: pack and
// unpack refuse to, so the collectives must leave it to the transport.
class NoFloat64Scaling : public HostArrays {
public:
  bool scales(DType wire) const override { return wire != DType::kFloat64; }
  Status pack(const PackTable &table, void *message, DType wire,
              float scale) override {
    if (wire == DType::kFloat64 && scale != 1.0f)
      return Status::InvalidArgument("float64 scaled while packing");
    return HostArrays::pack(table, message, wire, scale);
  }
  Status unpack(const PackTable &table, const void *message, DType wire,
                int divisor) override {
    if (wire == DType::kFloat64 && divisor != 1)
      return Status::InvalidArgument("float64 divided while unpacking");
    return HostArrays::unpack(table, message, wire, divisor);
  }
};

} // namespace

TEST(list_collectives_leave_scaling_to_the_transport_where_memory_cannot) {
  std::mt19937_64 rng(8);
  const std::vector<Spec> specs = {{DType::kFloat64, 17},
                                   {DType::kFloat32, 9},
                                   {DType::kFloat64, 5},
                                   {DType::kFloat64,
                                    direct_count(DType::kFloat64) + 1}};
  for (int size : {2, 3, 4}) {
    std::vector<Arrays> before;
    for (int r = 0; r < size; ++r)
      before.push_back(random_arrays(specs, rng));
    std::vector<Arrays> summed = before, rooted = before;
    const int root = 1;
    FakeWorld world(size);
    run_ranks(size, [&](int rank) {
      auto transport = world.transport(rank);
      NoFloat64Scaling memory;
      std::vector<ArrayRef> list = refs(summed[rank], specs);
      CHECK_OK(all_reduce_list(*transport, memory, list, true, 0.5f, true,
                               Materializer{nullptr, nullptr}));
      CHECK_OK(reduce_list(*transport, memory, refs(rooted[rank], specs),
                           root, true, true));
    });
    for (size_t i = 0; i < specs.size(); ++i) {
      std::vector<const Array *> shares;
      for (const Arrays &a : before)
        shares.push_back(&*a[i]);
      const DType dt = specs[i].dtype;
      const Array mean = reduced(shares, dt, 0.5f, size, dt);
      const Array root_mean = reduced(shares, dt, 1.0f, size, dt);
      for (int r = 0; r < size; ++r) {
        CHECK_SAME(*summed[r][i], mean);
        CHECK_SAME(*rooted[r][i], r == root ? root_mean : *before[r][i]);
      }
    }
  }
}

TEST(bcast_list_from_each_root) {
  std::mt19937_64 rng(5);
  const std::vector<Spec> specs = {{DType::kInt64, 3},
                                   {DType::kFloat32,
                                    direct_count(DType::kFloat32)},
                                   {DType::kFloat16, 11},
                                   {DType::kFloat16, 0},
                                   {DType::kInt64, 2}};
  for (int size : {2, 3, 4}) {
    for (int root = 0; root < size; ++root) {
      for (bool fuse : {true, false}) {
        std::vector<Arrays> before;
        for (int r = 0; r < size; ++r)
          before.push_back(random_arrays(specs, rng));
        std::vector<Arrays> after = before;
        FakeWorld world(size);
        run_ranks(size, [&](int rank) {
          auto transport = world.transport(rank);
          HostArrays memory;
          CHECK_OK(bcast_list(*transport, memory, refs(after[rank], specs),
                              root, fuse));
        });
        for (int r = 0; r < size; ++r) {
          for (size_t i = 0; i < specs.size(); ++i)
            CHECK_SAME(*after[r][i], *before[root][i]);
        }
      }
    }
  }
}

TEST(lone_arrays_are_sent_where_they_lie) {
  // A dtype's only array is sent from its own memory, in its message's
  // turn; the first dtype's, 32 KiB here, after the zeroing flags alone.
  // Array 0 is zeroing on rank 1 (given memory, zeros as its share), array
  // 1 written on rank 0 only; the two float64 arrays share a message.
  std::mt19937_64 rng(9);
  const std::vector<Spec> specs = {{DType::kFloat32, 8192},
                                   {DType::kFloat16, 5},
                                   {DType::kFloat64, 3},
                                   {DType::kFloat64, 4}};
  CHECK(!direct(specs[0], true)); // as tests/test_unit.py sets it
  for (int size : {2, 3}) {
    std::vector<Arrays> arrays;
    for (int r = 0; r < size; ++r) {
      arrays.push_back(random_arrays(specs, rng));
      if (r == 1)
        arrays[r][0].reset();
      if (r != 0)
        arrays[r][1].reset();
    }
    std::vector<Arrays> after = arrays;
    std::vector<Zeroing> given(size, Zeroing{specs, Arrays(specs.size()), {}});
    FakeWorld world(size);
    run_ranks(size, [&](int rank) {
      auto transport = world.transport(rank);
      HostArrays memory;
      std::vector<ArrayRef> list = refs(after[rank], specs);
      CHECK_OK(all_reduce_list(*transport, memory, list, true, 0.5f, true,
                               {&Zeroing::give, &given[rank]}));
    });
    for (int r = 0; r < size; ++r) {
      std::vector<LoggedOp> sent;
      for (const LoggedOp &op : world.log(r)) {
        if (op.call.kind != OpKind::kCheck)
          sent.push_back(op);
      }
      const std::vector<Call> expected = {
          {OpKind::kAllreduce, specs.size(), DType::kFloat32},
          {OpKind::kAllreduce, 8192, DType::kFloat32},
          {OpKind::kAllreduce, 5, DType::kFloat16},
          {OpKind::kAllreduce, 7, DType::kFloat64}};
      CHECK_EQ(sent.size(), expected.size());
      for (size_t k = 0; k < sent.size() && k < expected.size(); ++k)
        CHECK_EQ(sent[k].call, expected[k]);
      const Arrays &own = arrays[r][0] ? after[r] : given[r].given;
      CHECK(sent.size() > 2 && sent[1].buffer == own[0]->data());
      const Arrays &half = arrays[r][1] ? after[r] : given[r].given;
      CHECK(sent.size() > 2 && sent[2].buffer == half[1]->data());
    }
    for (size_t i = 0; i < specs.size(); ++i) {
      std::vector<const Array *> shares;
      for (const Arrays &a : arrays)
        shares.push_back(a[i] ? &*a[i] : nullptr);
      const Array want =
          reduced(shares, specs[i].dtype, 0.5f, size, specs[i].dtype);
      for (int r = 0; r < size; ++r)
        CHECK_SAME(arrays[r][i] ? *after[r][i] : *given[r].given[i], want);
    }
  }

  // bcast and reduce: from the array's memory, on every rank.
  const std::vector<Spec> one = {{DType::kFloat16, 11}};
  const auto per_rank = [&](int size) {
    std::vector<Arrays> arrays;
    for (int r = 0; r < size; ++r)
      arrays.push_back(random_arrays(one, rng));
    return arrays;
  };
  for (int size : {2, 3}) {
    const std::vector<Arrays> before = per_rank(size);
    std::vector<Arrays> after = before;
    FakeWorld world(size);
    run_ranks(size, [&](int rank) {
      auto transport = world.transport(rank);
      HostArrays memory;
      CHECK_OK(bcast_list(*transport, memory, refs(after[rank], one), 1,
                          true));
      CHECK_OK(reduce_list(*transport, memory, refs(after[rank], one), 0,
                           false, true));
    });
    std::vector<const Array *> shares(size, &*before[1][0]);
    const Array sum = reduced(shares, DType::kFloat16, 1.0f, 1,
                              DType::kFloat16);
    for (int r = 0; r < size; ++r) {
      for (const LoggedOp &op : world.log(r)) {
        if (op.call.kind != OpKind::kCheck)
          CHECK(op.buffer == after[r][0]->data());
      }
      CHECK_SAME(*after[r][0], r == 0 ? sum : *before[1][0]);
    }
  }

  // Packed after all where the transport would scale it less precisely.
  for (int size : {2, 3}) {
    const std::vector<Arrays> before = per_rank(size);
    std::vector<Arrays> after = before;
    FakeWorld world(size);
    run_ranks(size, [&](int rank) {
      auto transport = world.transport(rank);
      transport->scale_imprecisely();
      HostArrays memory;
      std::vector<ArrayRef> list = refs(after[rank], one);
      CHECK_OK(all_reduce_list(*transport, memory, list, false, 0.5f, true,
                               {nullptr, nullptr}));
    });
    std::vector<const Array *> shares;
    for (const Arrays &a : before)
      shares.push_back(&*a[0]);
    const Array want = reduced(shares, DType::kFloat16, 0.5f, 1,
                               DType::kFloat16);
    for (int r = 0; r < size; ++r) {
      for (const LoggedOp &op : world.log(r)) {
        if (op.call.kind != OpKind::kCheck)
          CHECK(op.buffer != after[r][0]->data());
      }
      CHECK_SAME(*after[r][0], want);
    }
  }
}

TEST(all_gather_into_one_array_or_a_list) {
  std::mt19937_64 rng(6);
  const size_t n = 13;
  for (int size : {2, 3, 4}) {
    for (DType dt : kFloating) {
      std::vector<Array> send;
      for (int r = 0; r < size; ++r)
        send.push_back(random_array(dt, n, rng));
      std::vector<Array> whole(size, Array(dt, size * n));
      std::vector<std::vector<Array>> parts(
          size, std::vector<Array>(size, Array(dt, n)));
      FakeWorld world(size);
      run_ranks(size, [&](int rank) {
        auto transport = world.transport(rank);
        HostArrays memory;
        const ArrayRef mine{send[rank].data(), n, dt};
        CHECK_OK(all_gather(*transport, memory, mine,
                            {{whole[rank].data(), size * n, dt}}));
        std::vector<ArrayRef> list;
        for (Array &p : parts[rank])
          list.push_back({p.data(), n, dt});
        CHECK_OK(all_gather(*transport, memory, mine, list));
      });
      for (int r = 0; r < size; ++r) {
        for (int q = 0; q < size; ++q) {
          CHECK_SAME(whole[r].slice(q * n, n), send[q]);
          CHECK_SAME(parts[r][q], send[q]);
        }
      }
    }
  }
}

TEST(all_gatherv_into_one_array_or_a_list) {
  // Rank r contributes (2r + 1) % 5 elements (none from rank 2).
  std::mt19937_64 rng(8);
  const auto count = [](int r) { return size_t((2 * r + 1) % 5); };
  for (int size : {1, 2, 3, 4}) {
    for (DType dt : {DType::kFloat16, DType::kInt64}) {
      std::vector<size_t> counts;
      std::vector<Array> send;
      for (int r = 0; r < size; ++r) {
        counts.push_back(count(r));
        send.push_back(random_array(dt, count(r), rng));
      }
      const size_t total =
          std::accumulate(counts.begin(), counts.end(), size_t(0));
      std::vector<Array> whole(size, Array(dt, total));
      std::vector<std::vector<Array>> parts(size);
      for (int r = 0; r < size; ++r) {
        for (int q = 0; q < size; ++q)
          parts[r].emplace_back(dt, count(q));
      }
      FakeWorld world(size);
      run_ranks(size, [&](int rank) {
        auto transport = world.transport(rank);
        HostArrays memory;
        const ArrayRef mine{send[rank].data(), count(rank), dt};
        CHECK_OK(all_gatherv(*transport, memory, mine, counts,
                             {{whole[rank].data(), total, dt}}));
        std::vector<ArrayRef> list;
        for (Array &p : parts[rank])
          list.push_back({p.data(), p.count(), dt});
        CHECK_OK(all_gatherv(*transport, memory, mine, counts, list));
      });
      for (int r = 0; r < size; ++r) {
        size_t at = 0;
        for (int q = 0; q < size; ++q) {
          CHECK_SAME(whole[r].slice(at, count(q)), send[q]);
          CHECK_SAME(parts[r][q], send[q]);
          at += count(q);
        }
      }
    }
  }
}

TEST(alltoall_sends_each_rank_its_block) {
  // Rank q sends rank r (q * r + r) % 3 elements (none from or to some).
  std::mt19937_64 rng(9);
  const auto count = [](int q, int r) { return size_t((q * r + r) % 3); };
  for (int size : {1, 2, 3, 4}) {
    for (DType dt : {DType::kFloat32, DType::kInt32}) {
      std::vector<std::vector<size_t>> sends(size), recvs(size);
      std::vector<Array> in, out;
      for (int r = 0; r < size; ++r) {
        for (int q = 0; q < size; ++q) {
          sends[r].push_back(count(r, q));
          recvs[r].push_back(count(q, r));
        }
        in.push_back(random_array(
            dt, std::accumulate(sends[r].begin(), sends[r].end(), size_t(0)),
            rng));
        out.emplace_back(dt, std::accumulate(recvs[r].begin(),
                                             recvs[r].end(), size_t(0)));
      }
      FakeWorld world(size);
      run_ranks(size, [&](int rank) {
        auto transport = world.transport(rank);
        CHECK_OK(alltoall(*transport, {in[rank].data(), in[rank].count(), dt},
                          sends[rank],
                          {out[rank].data(), out[rank].count(), dt},
                          recvs[rank]));
      });
      for (int r = 0; r < size; ++r) {
        size_t at = 0;
        for (int q = 0; q < size; ++q) {
          const Blocks from = Blocks::packed(sends[q]);
          CHECK_SAME(out[r].slice(at, count(q, r)),
                     in[q].slice(from.offsets[r], count(q, r)));
          at += count(q, r);
        }
      }
    }
  }
}

TEST(alltoall_and_all_gatherv_refuse_dtypes_that_differ_between_ranks) {
  FakeWorld world(3);
  std::vector<Array> in(3, Array(DType::kFloat64, 3)), out = in;
  run_ranks(3, [&](int rank) {
    auto transport = world.transport(rank);
    HostArrays memory;
    const DType dt = rank == 1 ? DType::kInt64 : DType::kFloat64;
    const ArrayRef send{in[rank].data(), 3, dt};
    const ArrayRef recv{out[rank].data(), 3, dt};
    Status differ = alltoall(*transport, send, {1, 1, 1}, recv, {1, 1, 1});
    CHECK_EQ(differ.code(), StatusCode::kInvalidArgument);
    CHECK_CONTAINS(differ.message(), "make different calls");
    CHECK_CONTAINS(differ.message(), "alltoall of 3 elements");
    differ = all_gatherv(*transport, memory, {in[rank].data(), 1, dt},
                         {1, 1, 1}, {recv});
    CHECK_EQ(differ.code(), StatusCode::kInvalidArgument);
    CHECK_CONTAINS(differ.message(), "make different calls");
  });
}

TEST(reduce_scatter_from_one_array_or_a_list) {
  std::mt19937_64 rng(7);
  const size_t n = 9;
  for (int size : {2, 3, 4}) {
    for (DType dt : kFloating) {
      for (bool division : {false, true}) {
        std::vector<Array> whole;
        for (int r = 0; r < size; ++r)
          whole.push_back(random_array(dt, size * n, rng));
        std::vector<Array> from_whole(size, Array(dt, n));
        std::vector<Array> from_list(size, Array(dt, n));
        FakeWorld world(size);
        run_ranks(size, [&](int rank) {
          auto transport = world.transport(rank);
          HostArrays memory;
          CHECK_OK(reduce_scatter(*transport, memory,
                                  {{whole[rank].data(), size * n, dt}},
                                  {from_whole[rank].data(), n, dt}, division));
          std::vector<Array> blocks;
          for (int q = 0; q < size; ++q)
            blocks.push_back(whole[rank].slice(q * n, n));
          std::vector<ArrayRef> list;
          for (Array &b : blocks)
            list.push_back({b.data(), n, dt});
          CHECK_OK(reduce_scatter(*transport, memory, list,
                                  {from_list[rank].data(), n, dt}, division));
        });
        for (int r = 0; r < size; ++r) {
          std::vector<Array> blocks;
          for (const Array &w : whole)
            blocks.push_back(w.slice(r * n, n));
          std::vector<const Array *> shares;
          for (const Array &b : blocks)
            shares.push_back(&b);
          const Array want =
              reduced(shares, dt, 1.0f, division ? size : 1, dt);
          CHECK_SAME(from_whole[r], want);
          CHECK_SAME(from_list[r], want);
        }
      }
    }
  }
}

TEST(collectives_refuse_calls_that_differ_between_ranks) {
  for (int size : {2, 3, 4}) {
    FakeWorld world(size);
    std::vector<Array> data(size, Array(DType::kFloat32, 5));
    run_ranks(size, [&](int rank) {
      auto transport = world.transport(rank);
      HostArrays memory;
      auto call = [&](size_t count) {
        std::vector<ArrayRef> list = {{data[rank].data(), count,
                                       DType::kFloat32}};
        return all_reduce_list(*transport, memory, list, false, 1.0f, true,
                               Materializer{nullptr, nullptr});
      };
      // The last rank passes 5 elements, the others 4: every rank fails.
      Status differ = call(rank == size - 1 ? 5 : 4);
      CHECK_EQ(differ.code(), StatusCode::kInvalidArgument);
      CHECK_CONTAINS(differ.message(), "make different calls");
      CHECK_CONTAINS(differ.message(), "all_reduce of 1 arrays");
      // Nothing was sent; the same call everywhere then goes through.
      CHECK_OK(call(4));
      // A call this rank compared before is not compared again: the last
      // rank's new one meets the others' message and fails there, on
      // every rank.
      differ = call(rank == size - 1 ? 3 : 4);
      CHECK_EQ(differ.code(), StatusCode::kInvalidArgument);
      CHECK_CONTAINS(differ.message(), "make different calls");
    });
  }
}

TEST(collectives_compare_calls_as_configured) {
  // NNCOMM_CHECK_CALLS: a signature compared the first time it comes
  // (unset), every time (1), never (0).
  const config::CallChecks checks = config::check_calls();
  const size_t expected = checks == config::CallChecks::kOff     ? 0
                          : checks == config::CallChecks::kEvery ? 3
                                                                 : 1;
  FakeWorld world(2);
  std::vector<Array> data(2, Array(DType::kFloat64, 4));
  run_ranks(2, [&](int rank) {
    auto transport = world.transport(rank);
    HostArrays memory;
    for (int k = 0; k < 3; ++k) {
      CHECK_OK(bcast_list(*transport, memory,
                          {{data[rank].data(), 4, DType::kFloat64}}, 1, true));
    }
    const std::vector<Call> calls = world.calls(rank);
    CHECK_EQ(static_cast<size_t>(std::count(calls.begin(), calls.end(),
                                            Call{OpKind::kCheck})),
             expected);
  });
}
