// The engine on fake ranks: buckets reduced right and issued in plan order
// on every rank whatever order gradients become ready in, under the
// schedule NNCOMM_LAUNCH sets for the process (tests/test_unit.py runs
// these under each); the tuner deciding alike on every rank; the failures:
// a rank that fails, a local error, a transport error, a begin() too
// early; one engine serving several plans of its tensors; and priority
// order: the plan sorted highest priority first (ties
// in plan order) and launched in that order on every rank, whatever order
// each rank's gradients come in, with a failed rank and under either
// schedule; a bucket hook reducing every bucket in the transport's stead,
// and a hook's failure ending the iteration on every rank; ZeRO stage 2's
// hook summing each element onto the rank that owns it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include "check.hpp"
#include "fake_transport.hpp"
#include "nncomm/observability/config.hpp"
#include "nncomm/core/engine.hpp"
#include "nncomm/core/bucket_runner.hpp"
#include "nncomm/core/owner_reduction.hpp"
#include "reference.hpp"

using namespace nncomm;
using namespace unit;

namespace {

constexpr DType kWire = DType::kFloat32;
constexpr int kPollUs = 50;

// The one call to the planner.
std::vector<Bucket> plan(const std::vector<TensorSpec> &specs,
                         const std::vector<size_t> &order, size_t pack_size,
                         bool keep_dtype, size_t direct_bytes) {
  return plan_buckets(specs, order, pack_size, keep_dtype, kWire,
                      direct_bytes);
}

struct Model {
  std::vector<TensorSpec> specs;
  std::vector<Bucket> plan;
};

// Tensors in order 0, 1, ...: `counts` float32 elements, `pack_size` per
// bucket, none direct.
Model simple_model(const std::vector<size_t> &counts, size_t pack_size) {
  Model m;
  std::vector<size_t> order;
  for (size_t c : counts) {
    order.push_back(m.specs.size());
    m.specs.push_back({c, DType::kFloat32});
  }
  m.plan = plan(m.specs, order, pack_size, false, size_t(1) << 40);
  return m;
}

// Random tensors (some float16, some empty), order, bucket size, dtype
// policy and direct threshold; 1 to `max_buckets` buckets.
Model random_model(std::mt19937_64 &rng, size_t max_buckets) {
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  for (;;) {
    Model m;
    const size_t n = 1 + pick(10);
    for (size_t t = 0; t < n; ++t) {
      const size_t counts[] = {0, 1, 1 + pick(40), 100 + pick(1900)};
      m.specs.push_back({counts[pick(4)], pick(10) < 3 ? DType::kFloat16
                                                       : DType::kFloat32});
    }
    std::vector<size_t> order(n);
    for (size_t t = 0; t < n; ++t)
      order[t] = t;
    std::shuffle(order.begin(), order.end(), rng);
    const size_t pack_sizes[] = {5, 64, 300, 4096};
    const size_t direct_bytes[] = {200, 1200, size_t(1) << 40};
    m.plan = plan(m.specs, order, pack_sizes[pick(4)], pick(2) == 0,
                  direct_bytes[pick(3)]);
    if (!m.plan.empty() && m.plan.size() <= max_buckets)
      return m;
  }
}

// Rank `rank`'s engine over `model`, its plan added as plan 0.
std::unique_ptr<Engine> engine_on(FakeWorld &world, int rank,
                                  const Model &model) {
  std::unique_ptr<FakeTransport> transport = world.transport(rank);
  auto runner = std::make_unique<BucketRunner>(
      *transport, std::make_unique<HostArrays>());
  auto engine = std::make_unique<Engine>(
      std::move(transport), std::move(runner), model.specs.size(), kPollUs);
  size_t planned = 1;
  CHECK_OK(engine->add_plan(model.plan, &planned));
  CHECK_EQ(planned, size_t(0));
  return engine;
}

std::vector<std::unique_ptr<Engine>> engines_on(FakeWorld &world,
                                                const Model &model) {
  std::vector<std::unique_ptr<Engine>> engines;
  for (int r = 0; r < world.size(); ++r)
    engines.push_back(engine_on(world, r, model));
  return engines;
}

// The calls of `iterations` iterations over `plan`, the same on every rank:
// its buckets in order, then the closing round (failure, time, non-finite).
std::vector<Call> iteration_calls(const std::vector<Bucket> &plan,
                                  int iterations = 1) {
  std::vector<Call> calls;
  for (int i = 0; i < iterations; ++i) {
    for (const Bucket &b : plan)
      calls.push_back({OpKind::kAllreduce, b.count, b.dtype});
    calls.push_back({OpKind::kAllreduce, 3, DType::kInt64});
  }
  return calls;
}

// A rank's gradients: by tensor, its values in the dtype it is marked
// ready with, or none (marked with nullptr: never written on this rank).
using Gradients = std::vector<std::optional<Array>>;

Gradients planned_gradients(const Model &model, std::mt19937_64 &rng) {
  Gradients g;
  for (const TensorSpec &s : model.specs)
    g.emplace_back(random_array(s.dtype, s.count, rng));
  return g;
}

// Mostly as planned; now and then in the other dtype, or none.
Gradients random_gradients(const Model &model, std::mt19937_64 &rng) {
  Gradients g;
  for (const TensorSpec &s : model.specs) {
    const size_t roll = rng() % 20;
    const DType other = s.dtype == DType::kFloat32 ? DType::kFloat16
                                                   : DType::kFloat32;
    if (roll == 0)
      g.emplace_back();
    else
      g.emplace_back(random_array(roll < 3 ? other : s.dtype, s.count, rng));
  }
  return g;
}

// Marks `g`'s tensors ready in a random order and the last ones after a
// pause, so that some buckets are reduced while others wait.
void mark_all(Engine &engine, const Model &model, Gradients &g,
              std::mt19937_64 &rng) {
  std::vector<size_t> order(g.size());
  for (size_t t = 0; t < g.size(); ++t)
    order[t] = t;
  std::shuffle(order.begin(), order.end(), rng);
  for (size_t i = 0; i < order.size(); ++i) {
    const size_t t = order[i];
    if (i == order.size() / 2)
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
    engine.mark_ready(t, g[t] ? g[t]->data() : nullptr,
                      g[t] ? g[t]->dtype() : model.specs[t].dtype);
  }
}

// One iteration of plan `plan` (`model`'s) on every rank, each marking
// from its own thread (as backward's hook does); returns each rank's
// finish().
std::vector<Status> iterate(std::vector<std::unique_ptr<Engine>> &engines,
                            const Model &model, std::vector<Gradients> &g,
                            float scale, int divisor, uint64_t seed,
                            size_t plan = 0) {
  std::vector<Status> finished(engines.size());
  run_ranks(static_cast<int>(engines.size()), [&](int rank) {
    std::mt19937_64 rng(seed + rank);
    CHECK_OK(engines[rank]->begin(plan, scale, divisor));
    mark_all(*engines[rank], model, g[rank], rng);
    finished[rank] = engines[rank]->finish();
  });
  return finished;
}

// The wire dtype tensor `t` travels in (all its buckets have one).
DType wire_of(const Model &model, size_t t) {
  for (const Bucket &b : model.plan) {
    for (size_t u : b.tensors) {
      if (u == t)
        return b.dtype;
    }
  }
  return kWire;
}

// Checks that `after` holds the reduction of `before` on every rank.
void check_reduced(const Model &model, const std::vector<Gradients> &before,
                   const std::vector<Gradients> &after, float scale,
                   int divisor) {
  for (size_t t = 0; t < model.specs.size(); ++t) {
    std::vector<const Array *> shares;
    for (const Gradients &g : before)
      shares.push_back(g[t] ? &*g[t] : nullptr);
    for (size_t r = 0; r < after.size(); ++r) {
      if (after[r][t]) {
        CHECK_SAME(*after[r][t], reduced(shares, wire_of(model, t), scale,
                                         divisor, after[r][t]->dtype()));
      }
    }
  }
}

Launch first_launch() {
  return config::engine_launch().value_or(Launch::kEager);
}

} // namespace

TEST(engine_reduces_random_plans_in_plan_order) {
  std::mt19937_64 rng(11);
  const float scales[] = {1.0f, 0.5f, 3.0f, -1.25f, 0.1f};
  const int iterations = 3;
  size_t direct = 0, half = 0; // buckets of the cases, for their coverage
  for (int c = 0; c < 18; ++c) {
    const int size = 2 + c % 3;
    const Model model = random_model(rng, 60);
    for (const Bucket &b : model.plan) {
      direct += b.direct;
      half += b.dtype == DType::kFloat16;
    }
    FakeWorld world(size);
    for (int r = 0; r < size; ++r)
      world.set_delay(r, std::chrono::microseconds(rng() % 200));
    auto engines = engines_on(world, model);
    for (int i = 0; i < iterations; ++i) {
      const float scale = scales[rng() % 5];
      const int divisors[] = {1, 2, 3, size};
      const int divisor = divisors[rng() % 4];
      std::vector<Gradients> before;
      for (int r = 0; r < size; ++r)
        before.push_back(random_gradients(model, rng));
      std::vector<Gradients> after = before;
      for (const Status &s : iterate(engines, model, after, scale, divisor,
                                     rng()))
        CHECK_OK(s);
      check_reduced(model, before, after, scale, divisor);
    }
    for (int r = 0; r < size; ++r)
      CHECK_EQ(world.calls(r), iteration_calls(model.plan, iterations));
  }
  CHECK(direct > 0 && half > 0);
}

TEST(engine_serves_every_plan_of_its_gradients) {
  // One engine per rank, its thread and transport made once, reduces
  // iterations of two plans of the same tensors (other orders, bucket
  // sizes, dtype policies) in any sequence, each as its own plan says; a
  // plan dropped frees its id for the next.
  std::mt19937_64 rng(23);
  for (int c = 0; c < 6; ++c) {
    const int size = 2 + c % 3;
    std::vector<Model> models = {random_model(rng, 40)};
    for (;;) {
      Model other{models[0].specs, {}};
      std::vector<size_t> order(other.specs.size());
      std::iota(order.begin(), order.end(), size_t(0));
      std::shuffle(order.begin(), order.end(), rng);
      other.plan = plan(other.specs, order, 3 + rng() % 500, rng() % 2 == 0,
                        rng() % 2 == 0 ? 400 : size_t(1) << 40);
      if (!other.plan.empty()) {
        models.push_back(other);
        break;
      }
    }
    FakeWorld world(size);
    auto engines = engines_on(world, models[0]);
    for (auto &engine : engines) {
      size_t id = 0;
      CHECK_OK(engine->add_plan(models[1].plan, &id));
      CHECK_EQ(id, size_t(1));
    }
    std::vector<Call> expected;
    for (size_t which : {1, 0, 0, 1, 0}) {
      const Model &model = models[which];
      std::vector<Gradients> before;
      for (int r = 0; r < size; ++r)
        before.push_back(planned_gradients(model, rng));
      std::vector<Gradients> after = before;
      for (const Status &s : iterate(engines, model, after, 0.5f, size,
                                     rng(), which))
        CHECK_OK(s);
      check_reduced(model, before, after, 0.5f, size);
      const std::vector<Call> calls = iteration_calls(model.plan);
      expected.insert(expected.end(), calls.begin(), calls.end());
    }
    for (int r = 0; r < size; ++r)
      CHECK_EQ(world.calls(r), expected);
    Engine &engine = *engines[0];
    engine.drop_plan(0);
    const Status dropped = engine.begin(0, 1.0f, 1);
    CHECK_EQ(dropped.code(), StatusCode::kInvalidArgument);
    size_t id = 9;
    CHECK_OK(engine.add_plan(models[1].plan, &id));
    CHECK_EQ(id, size_t(0));
  }
}

TEST(engine_adds_no_plan_during_an_iteration) {
  const Model model = simple_model({8, 8}, 8);
  FakeWorld world(1);
  std::unique_ptr<Engine> engine = engine_on(world, 0, model);
  std::mt19937_64 rng(3);
  Gradients g = planned_gradients(model, rng);
  CHECK_OK(engine->begin(0, 1.0f, 1));
  size_t id = 0;
  const Status refused = engine->add_plan(model.plan, &id);
  CHECK_EQ(refused.code(), StatusCode::kRuntimeError);
  CHECK_CONTAINS(refused.message(), "a plan is added between them");
  // Nor is the plan of the iteration under way dropped.
  engine->drop_plan(0);
  mark_all(*engine, model, g, rng);
  CHECK_OK(engine->finish());
  CHECK_OK(engine->begin(0, 1.0f, 1));
  mark_all(*engine, model, g, rng);
  CHECK_OK(engine->finish());
}

TEST(engine_launches_as_the_schedule_says) {
  const Model model = simple_model({10, 10, 10, 10}, 10);
  for (int size : {2, 3, 4}) {
    FakeWorld world(size);
    auto engines = engines_on(world, model);
    std::mt19937_64 rng(size);
    std::vector<Gradients> before;
    for (int r = 0; r < size; ++r)
      before.push_back(planned_gradients(model, rng));
    std::vector<Gradients> after = before;
    run_ranks(size, [&](int rank) {
      Engine &engine = *engines[rank];
      bool decided = false;
      CHECK_EQ(engine.launch(0, &decided), first_launch());
      CHECK_OK(engine.begin(0, 1.0f, 1));
      engine.mark_ready(0, after[rank][0]->data(), DType::kFloat32);
      if (first_launch() == Launch::kEager) {
        // The first bucket goes out alone.
        const auto deadline =
            std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (world.log(rank).empty() &&
               std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        CHECK_EQ(world.log(rank).size(), size_t(1));
      } else {
        // Nothing goes out before the last gradient is ready.
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        CHECK(world.log(rank).empty());
      }
      for (size_t t = 1; t < model.specs.size(); ++t)
        engine.mark_ready(t, after[rank][t]->data(), DType::kFloat32);
      CHECK_OK(engine.finish());
    });
    check_reduced(model, before, after, 1.0f, 1);
  }
}

TEST(engine_tuner_decides_alike_on_every_rank) {
  // Eager twice untimed, then deferred and eager alternately, three
  // iterations each (launch_tuner.hpp).
  const Launch kAuto[] = {Launch::kEager,    Launch::kEager,
                          Launch::kDeferred, Launch::kEager,
                          Launch::kDeferred, Launch::kEager,
                          Launch::kDeferred, Launch::kEager};
  const Model model = simple_model({300, 7, 1000}, 256);
  const int size = 3;
  FakeWorld world(size);
  // Ranks of different speeds: each sees its own times, but the tuner is
  // fed their sum, the same everywhere.
  for (int r = 0; r < size; ++r)
    world.set_delay(r, std::chrono::microseconds(400 * r));
  auto engines = engines_on(world, model);
  std::vector<Launch> chosen(size);
  run_ranks(size, [&](int rank) {
    std::mt19937_64 rng(rank);
    for (int i = 0; i <= 8; ++i) {
      bool decided = false;
      const Launch next = engines[rank]->launch(0, &decided);
      if (config::engine_launch()) {
        CHECK(decided);
        CHECK_EQ(next, *config::engine_launch());
      } else {
        CHECK_EQ(decided, i == 8);
        if (i < 8)
          CHECK_EQ(next, kAuto[i]);
      }
      chosen[rank] = next;
      Gradients g = planned_gradients(model, rng);
      CHECK_OK(engines[rank]->begin(0, 1.0f, 1));
      mark_all(*engines[rank], model, g, rng);
      CHECK_OK(engines[rank]->finish());
    }
  });
  for (int r = 1; r < size; ++r)
    CHECK_EQ(chosen[r], chosen[0]);
}

TEST(engine_converts_a_tensor_marked_in_another_dtype) {
  // One direct bucket per tensor; rank 0 holds tensor 0 in float16.
  Model model;
  model.specs = {{64, DType::kFloat32}, {64, DType::kFloat32}};
  model.plan = plan(model.specs, {0, 1}, 64, false, 64 * 4);
  CHECK(model.plan.size() == 2 && model.plan[0].direct);
  std::mt19937_64 rng(5);
  FakeWorld world(2);
  auto engines = engines_on(world, model);
  std::vector<Gradients> before = {planned_gradients(model, rng),
                                   planned_gradients(model, rng)};
  before[0][0] = random_array(DType::kFloat16, 64, rng);
  std::vector<Gradients> after = before;
  for (const Status &s : iterate(engines, model, after, 0.5f, 3, 1))
    CHECK_OK(s);
  check_reduced(model, before, after, 0.5f, 3);
  // The same call on both ranks; reduced in place only where the dtype is
  // the planned one.
  for (int r = 0; r < 2; ++r)
    CHECK_EQ(world.calls(r), iteration_calls(model.plan));
  CHECK(world.log(0)[0].buffer != after[0][0]->data());
  CHECK(world.log(1)[0].buffer == after[1][0]->data());
  CHECK(world.log(0)[1].buffer == after[0][1]->data());
}

TEST(engine_failed_rank_fails_every_rank_and_writes_nothing) {
  const Model model = simple_model({5, 300, 40, 1}, 64);
  for (int size : {2, 3, 4}) {
    const int failing = size - 1;
    FakeWorld world(size);
    auto engines = engines_on(world, model);
    std::mt19937_64 rng(size);
    std::vector<Gradients> before;
    for (int r = 0; r < size; ++r)
      before.push_back(planned_gradients(model, rng));
    std::vector<Gradients> after = before;
    std::vector<Status> finished(size);
    run_ranks(size, [&](int rank) {
      std::mt19937_64 marking(rank);
      CHECK_OK(engines[rank]->begin(0, 1.0f, size));
      if (rank == failing)
        engines[rank]->fail("backward failed here");
      // Ignored on the failed rank: its gradients stay as they are.
      mark_all(*engines[rank], model, after[rank], marking);
      finished[rank] = engines[rank]->finish();
    });
    for (int r = 0; r < size; ++r) {
      CHECK_EQ(finished[r].code(), StatusCode::kRuntimeError);
      CHECK_CONTAINS(finished[r].message(),
                     r == failing ? "backward failed here"
                                  : "another rank of the group failed");
      // The remaining buckets still went out, as zeros from the failed
      // rank, so no rank was left waiting.
      CHECK_EQ(world.calls(r), iteration_calls(model.plan));
    }
    for (size_t t = 0; t < model.specs.size(); ++t)
      CHECK_SAME(*after[failing][t], *before[failing][t]);

    // The next iteration is whole again.
    before = after;
    for (const Status &s : iterate(engines, model, after, 1.0f, size, 7))
      CHECK_OK(s);
    check_reduced(model, before, after, 1.0f, size);
  }
}

TEST(engine_nonfinite_fails_every_rank_naming_ranks_and_tensors) {
  // Tensor 1 is split across staged buckets, tensor 2 is direct.
  Model model;
  model.specs = {{5, DType::kFloat32}, {300, DType::kFloat32},
                 {400, DType::kFloat32}, {1, DType::kFloat32}};
  model.plan = plan(model.specs, {3, 2, 1, 0}, 64, false, 1200);
  for (int size : {2, 3}) {
    FakeWorld world(size);
    auto engines = engines_on(world, model);
    std::mt19937_64 rng(size);
    std::vector<Gradients> g;
    for (int r = 0; r < size; ++r)
      g.push_back(planned_gradients(model, rng));
    // The last rank: a NaN in tensor 1's second bucket and an infinity in
    // direct tensor 2; rank 0 (with 3 ranks): an infinity in tensor 0.
    const int last = size - 1;
    g[last][1]->set(100, std::nan(""));
    g[last][2]->set(399, -HUGE_VAL);
    if (size == 3)
      g[0][0]->set(0, HUGE_VAL);
    std::vector<Status> finished(size);
    std::vector<std::vector<NonFiniteTensors>> found(size);
    run_ranks(size, [&](int rank) {
      std::mt19937_64 marking(rank);
      CHECK_OK(engines[rank]->begin(0, 1.0f, size, true));
      mark_all(*engines[rank], model, g[rank], marking);
      finished[rank] = engines[rank]->finish();
      found[rank] = engines[rank]->nonfinite();
    });
    std::vector<Call> calls = iteration_calls(model.plan);
    calls.push_back({OpKind::kAllgather, 1 + NonFiniteTensors::kNamed,
                     DType::kInt64});
    for (int r = 0; r < size; ++r) {
      CHECK_EQ(finished[r].code(), StatusCode::kNonFinite);
      CHECK_EQ(world.calls(r), calls);
      CHECK_EQ(found[r].size(), size_t(size == 3 ? 2 : 1));
      const NonFiniteTensors &here = found[r].back();
      CHECK_EQ(here.rank, last);
      CHECK_EQ(here.count, size_t(2));
      CHECK_EQ(here.tensors, (std::vector<size_t>{1, 2}));
      if (size == 3) {
        CHECK_EQ(found[r][0].rank, 0);
        CHECK_EQ(found[r][0].tensors, (std::vector<size_t>{0}));
      }
    }
    // Finite again: the next iteration reduces, with no extra call; with
    // the check off a NaN goes through unseen, at no cost either.
    for (bool check : {true, false}) {
      std::vector<Gradients> before;
      for (int r = 0; r < size; ++r)
        before.push_back(planned_gradients(model, rng));
      if (!check)
        before[0][1]->set(7, std::nan(""));
      std::vector<Gradients> after = before;
      const std::vector<Call> next = iteration_calls(model.plan);
      calls.insert(calls.end(), next.begin(), next.end());
      run_ranks(size, [&](int rank) {
        std::mt19937_64 marking(rank);
        CHECK_OK(engines[rank]->begin(0, 1.0f, size, check));
        mark_all(*engines[rank], model, after[rank], marking);
        CHECK_OK(engines[rank]->finish());
        CHECK(engines[rank]->nonfinite().empty());
      });
      for (int r = 0; r < size; ++r)
        CHECK_EQ(world.calls(r), calls);
      if (check)
        check_reduced(model, before, after, 1.0f, size);
    }
  }
}

TEST(engine_local_error_fails_every_rank) {
  // Tensors 0 and 1 share a staged bucket; rank 0 gives tensor 1 at an
  // address not aligned to its elements, which packing refuses.
  const Model model = simple_model({3, 4, 50}, 10);
  const int size = 3;
  FakeWorld world(size);
  auto engines = engines_on(world, model);
  std::mt19937_64 rng(3);
  std::vector<Gradients> g;
  for (int r = 0; r < size; ++r)
    g.push_back(planned_gradients(model, rng));
  Array unaligned(DType::kFloat32, 5);
  std::vector<Status> finished(size);
  run_ranks(size, [&](int rank) {
    CHECK_OK(engines[rank]->begin(0, 1.0f, 1));
    for (size_t t = 0; t < model.specs.size(); ++t) {
      void *ptr = g[rank][t]->data();
      if (rank == 0 && t == 1)
        ptr = static_cast<char *>(unaligned.data()) + 1;
      engines[rank]->mark_ready(t, ptr, DType::kFloat32);
    }
    finished[rank] = engines[rank]->finish();
  });
  for (int r = 0; r < size; ++r) {
    CHECK_EQ(finished[r].code(), StatusCode::kRuntimeError);
    CHECK_CONTAINS(finished[r].message(),
                   r == 0 ? "not aligned" : "another rank of the group failed");
    // The refused bucket went out once, as zeros.
    CHECK_EQ(world.calls(r), iteration_calls(model.plan));
  }
}

// A runner whose write-back fails once on the rank given, after the
// bucket's reduction completed.
class FailingWriteBack : public BucketRunner {
public:
  FailingWriteBack(Transport &t, bool fails)
      : BucketRunner(t, std::make_unique<HostArrays>()), fails_(fails) {}
  Status finish() override {
    const Status s = BucketRunner::finish();
    if (fails_ && calls_++ == 0)
      return Status::RuntimeError("write-back failed on this rank");
    return s;
  }

private:
  const bool fails_;
  int calls_ = 0;
};

TEST(engine_failed_write_back_is_not_sent_again) {
  // The bucket went out before its write-back failed: the failing rank
  // sends the rest as zeros, never that bucket twice.
  const Model model = simple_model({8, 8, 8}, 8);
  const int size = 2;
  FakeWorld world(size);
  std::vector<std::unique_ptr<Engine>> engines;
  for (int r = 0; r < size; ++r) {
    std::unique_ptr<FakeTransport> t = world.transport(r);
    auto runner = std::make_unique<FailingWriteBack>(*t, r == 0);
    engines.push_back(std::make_unique<Engine>(
        std::move(t), std::move(runner), model.specs.size(), kPollUs));
    size_t planned = 0;
    CHECK_OK(engines.back()->add_plan(model.plan, &planned));
  }
  std::mt19937_64 rng(5);
  std::vector<Gradients> g;
  for (int r = 0; r < size; ++r)
    g.push_back(planned_gradients(model, rng));
  const std::vector<Status> finished = iterate(engines, model, g, 1.0f, 1, 6);
  for (int r = 0; r < size; ++r) {
    CHECK_EQ(finished[r].code(), StatusCode::kRuntimeError);
    CHECK_CONTAINS(finished[r].message(),
                   r == 0 ? "write-back failed"
                          : "another rank of the group failed");
    CHECK_EQ(world.calls(r), iteration_calls(model.plan));
  }
}

TEST(engine_without_buckets_still_tells_a_failure) {
  // Every gradient unreached: no bucket, but a rank's failure still
  // reaches the others through the closing round.
  const Model model = simple_model({}, 8);
  const int size = 3;
  FakeWorld world(size);
  auto engines = engines_on(world, model);
  std::vector<Status> finished(size);
  run_ranks(size, [&](int rank) {
    CHECK_OK(engines[rank]->begin(0, 1.0f, 1));
    if (rank == 1)
      engines[rank]->fail("this rank failed");
    finished[rank] = engines[rank]->finish();
  });
  for (int r = 0; r < size; ++r) {
    CHECK_CONTAINS(finished[r].message(),
                   r == 1 ? "this rank failed"
                          : "another rank of the group failed");
    CHECK_EQ(world.calls(r), iteration_calls(model.plan));
  }
}

TEST(engine_ranks_with_different_plans_fail_as_such) {
  // Rank 0 planned buckets of another size: the first bucket's call
  // differs, which every rank reports as such, and nothing more is sent.
  const Model mine = simple_model({8, 8}, 8);
  const Model other = simple_model({8, 8}, 16);
  const int size = 2;
  FakeWorld world(size);
  std::vector<std::unique_ptr<Engine>> engines;
  engines.push_back(engine_on(world, 0, other));
  engines.push_back(engine_on(world, 1, mine));
  std::vector<Status> finished(size);
  std::vector<float> g(16, 1.0f);
  std::vector<std::vector<float>> grads(size, g);
  run_ranks(size, [&](int rank) {
    CHECK_OK(engines[rank]->begin(0, 1.0f, 1));
    engines[rank]->mark_ready(0, grads[rank].data(), DType::kFloat32);
    engines[rank]->mark_ready(1, grads[rank].data() + 8, DType::kFloat32);
    finished[rank] = engines[rank]->finish();
  });
  for (int r = 0; r < size; ++r) {
    CHECK_EQ(finished[r].code(), StatusCode::kInvalidArgument);
    CHECK_EQ(world.log(r).size(), size_t(1));
  }
}

TEST(engine_transport_error_surfaces_from_finish) {
  const Model model = simple_model({20, 20, 20}, 20);
  const size_t closing = model.plan.size();
  for (int size : {2, 3, 4}) {
    // Bucket 1 fails on every rank: nothing more is sent.
    {
      FakeWorld world(size);
      for (int r = 0; r < size; ++r)
        world.fail_operation(r, 1);
      auto engines = engines_on(world, model);
      std::mt19937_64 rng(size);
      std::vector<Gradients> g;
      for (int r = 0; r < size; ++r)
        g.push_back(planned_gradients(model, rng));
      for (const Status &s : iterate(engines, model, g, 1.0f, 1, 3)) {
        CHECK_EQ(s.code(), StatusCode::kTransport);
        CHECK_CONTAINS(s.message(), "operation 1 on the group");
      }
      for (int r = 0; r < size; ++r)
        CHECK_EQ(world.log(r).size(), size_t(2));
    }
    // The closing round fails on the last rank: the others' iteration is
    // complete and right.
    {
      FakeWorld world(size);
      world.fail_operation(size - 1, closing);
      auto engines = engines_on(world, model);
      std::mt19937_64 rng(size);
      std::vector<Gradients> before;
      for (int r = 0; r < size; ++r)
        before.push_back(planned_gradients(model, rng));
      std::vector<Gradients> after = before;
      const std::vector<Status> finished =
          iterate(engines, model, after, 2.0f, 1, 4);
      for (int r = 0; r + 1 < size; ++r)
        CHECK_OK(finished[r]);
      CHECK_EQ(finished[size - 1].code(), StatusCode::kTransport);
      // Every bucket was reduced before: on the last rank too.
      check_reduced(model, before, after, 2.0f, 1);
    }
  }
}

TEST(engine_refuses_begin_during_an_iteration) {
  const Model model = simple_model({8, 8}, 8);
  const int size = 2;
  FakeWorld world(size);
  auto engines = engines_on(world, model);
  run_ranks(size, [&](int rank) {
    std::mt19937_64 rng(rank);
    Engine &engine = *engines[rank];
    Gradients g = planned_gradients(model, rng);
    CHECK_OK(engine.begin(0, 1.0f, 1));
    const Status again = engine.begin(0, 1.0f, 1);
    CHECK_EQ(again.code(), StatusCode::kRuntimeError);
    CHECK_CONTAINS(again.message(), "still in an iteration");
    mark_all(engine, model, g, rng);
    CHECK_OK(engine.finish());
    // Once finished, the next one begins.
    CHECK_OK(engine.begin(0, 1.0f, 1));
    mark_all(engine, model, g, rng);
    CHECK_OK(engine.finish());
  });
}

TEST(engine_destroyed_while_waiting_gives_up) {
  // Rank 1 never comes: rank 0's first bucket waits until its engine goes.
  const Model model = simple_model({4, 4}, 4);
  FakeWorld world(2);
  std::unique_ptr<Engine> engine = engine_on(world, 0, model);
  std::mt19937_64 rng(1);
  Gradients g = planned_gradients(model, rng);
  CHECK_OK(engine->begin(0, 1.0f, 1));
  mark_all(*engine, model, g, rng);
  while (world.log(0).empty())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto start = std::chrono::steady_clock::now();
  engine.reset();
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
  // The abandoned operation can never complete: nothing starts any more.
  std::string reason;
  CHECK(broken(&reason));
  CHECK_CONTAINS(reason, "cancelled");
}

TEST(engine_finish_lets_an_interrupt_through) {
  // Rank 1 never comes; Ctrl-C (an interrupt check that raised) stops
  // rank 0's finish(), and its engine's reductions.
  set_interrupt_check([] { return 1; });
  const Model model = simple_model({4, 4}, 4);
  FakeWorld world(2);
  std::unique_ptr<Engine> engine = engine_on(world, 0, model);
  std::mt19937_64 rng(1);
  Gradients g = planned_gradients(model, rng);
  CHECK_OK(engine->begin(0, 1.0f, 1));
  mark_all(*engine, model, g, rng);
  const auto start = std::chrono::steady_clock::now();
  CHECK_EQ(engine->finish().code(), StatusCode::kInterrupted);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
  std::string reason;
  CHECK(broken(&reason));
  CHECK_CONTAINS(reason, "interrupted (all_reduce_callback)");
  CHECK_EQ(world.log(0).size(), size_t(1));
}

// -- Priority order: prioritize() sorts the plan, highest priority first,
// ties in plan order, and the engine launches it as it launches any plan.

namespace {

// `model` with its tensors' `priorities`.
Model prioritized(Model model, const std::vector<double> &priorities) {
  prioritize(priorities, &model.plan);
  return model;
}

// What prioritize() must make of `plan`, worked out another way: each
// bucket given the highest of its tensors' `priorities`, then the buckets
// taken one at a time, the first of the highest left.
std::vector<Bucket> highest_first(std::vector<Bucket> plan,
                                  const std::vector<double> &priorities) {
  for (Bucket &b : plan) {
    b.priority = -1e300;
    for (const Segment &s : b.segments)
      b.priority = std::max(b.priority, priorities[s.tensor]);
  }
  std::vector<Bucket> sorted;
  while (!plan.empty()) {
    size_t best = 0;
    for (size_t b = 1; b < plan.size(); ++b) {
      if (plan[b].priority > plan[best].priority)
        best = b;
    }
    sorted.push_back(plan[best]);
    plan.erase(plan.begin() + best);
  }
  return sorted;
}

// The tensors of each bucket of `plan`, taken in `order`.
std::vector<std::vector<size_t>> tensors_of(const std::vector<Bucket> &plan,
                                            const std::vector<size_t> &order) {
  std::vector<std::vector<size_t>> tensors;
  for (size_t b : order)
    tensors.push_back(plan[b].tensors);
  return tensors;
}

// Checks `iterations` iterations of every rank (`launched` being each
// rank's Engine::launched() after the last): the plan's buckets, no call
// but theirs and the closing round, in the plan's order on every rank.
void check_launched(const FakeWorld &world, const Model &model,
                    const std::vector<std::vector<size_t>> &launched,
                    int iterations = 1) {
  std::vector<size_t> every(model.plan.size());
  std::iota(every.begin(), every.end(), size_t(0));
  for (int r = 0; r < world.size(); ++r) {
    CHECK_EQ(world.calls(r), iteration_calls(model.plan, iterations));
    CHECK_EQ(launched[r], every);
  }
}

// Marks `g`'s tensors ready in `order`, `pause` apart.
void mark_in(Engine &engine, const std::vector<size_t> &order, Gradients &g,
             std::chrono::microseconds pause) {
  for (size_t t : order) {
    std::this_thread::sleep_for(pause);
    engine.mark_ready(t, g[t]->data(), g[t]->dtype());
  }
}

// One iteration, rank r running `body(r, engine)` between begin() and
// finish(); returns each rank's finish() and fills `launched`.
std::vector<Status>
iterate_with(std::vector<std::unique_ptr<Engine>> &engines,
             const std::function<void(int, Engine &)> &body,
             std::vector<std::vector<size_t>> *launched) {
  std::vector<Status> finished(engines.size());
  launched->assign(engines.size(), {});
  run_ranks(static_cast<int>(engines.size()), [&](int rank) {
    CHECK_OK(engines[rank]->begin(0, 1.0f, 1));
    body(rank, *engines[rank]);
    finished[rank] = engines[rank]->finish();
    (*launched)[rank] = engines[rank]->launched();
  });
  return finished;
}

// `size` fresh ranks with engines over `model` and planned gradients:
// `before`, and `after` to be reduced.
struct Ranks {
  Ranks(int size, const Model &model)
      : world(size), engines(engines_on(world, model)) {
    std::mt19937_64 rng(size);
    for (int r = 0; r < size; ++r)
      before.push_back(planned_gradients(model, rng));
    after = before;
  }
  FakeWorld world;
  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<Gradients> before, after;
};

// One iteration over `model` on `size` fresh ranks, rank r marking its
// gradients `g` as `mark(r, engine, g)` does: checks that it reduced
// right and launched the plan in its order (check_launched); returns rank
// 0's launches.
std::vector<size_t>
reduce_in_order(int size, const Model &model,
                const std::function<void(int, Engine &, Gradients &)> &mark) {
  Ranks ranks(size, model);
  std::vector<std::vector<size_t>> launched;
  const auto finished = iterate_with(
      ranks.engines,
      [&](int r, Engine &engine) { mark(r, engine, ranks.after[r]); },
      &launched);
  for (const Status &s : finished)
    CHECK_OK(s);
  check_reduced(model, ranks.before, ranks.after, 1.0f, 1);
  check_launched(ranks.world, model, launched);
  return launched[0];
}

} // namespace

TEST(plan_prioritized_highest_first_ties_in_plan_order) {
  std::mt19937_64 rng(29);
  for (int c = 0; c < 200; ++c) {
    const Model model = random_model(rng, 40);
    std::vector<double> priorities(model.specs.size());
    for (double &p : priorities)
      p = static_cast<double>(rng() % 4) - 1.5;
    const std::vector<Bucket> want = highest_first(model.plan, priorities);
    const Model got = prioritized(model, priorities);
    CHECK_EQ(got.plan.size(), want.size());
    for (size_t b = 0; b < want.size(); ++b) {
      CHECK_EQ(got.plan[b].priority, want[b].priority);
      CHECK_EQ(got.plan[b].tensors, want[b].tensors);
    }
    CHECK_EQ(plan_fingerprint(got.plan), plan_fingerprint(want));
    // Ranks given other priorities are told apart, even where the order
    // stays.
    std::vector<double> higher = priorities;
    for (double &p : higher)
      p += 1;
    CHECK(plan_fingerprint(prioritized(model, higher).plan) !=
          plan_fingerprint(got.plan));
  }
}

TEST(engine_priority_reduces_random_plans_in_priority_order) {
  std::mt19937_64 rng(23);
  for (int c = 0; c < 18; ++c) {
    const int size = 2 + c % 3;
    Model model;
    do {
      model = random_model(rng, 40);
      std::vector<double> priorities(model.specs.size());
      for (double &p : priorities)
        p = static_cast<double>(rng() % 4) - 1.5;
      model = prioritized(model, priorities);
    } while (model.plan.size() < 2 ||
             model.plan[0].priority == model.plan.back().priority);
    for (size_t b = 1; b < model.plan.size(); ++b)
      CHECK(model.plan[b - 1].priority >= model.plan[b].priority);
    FakeWorld world(size);
    for (int r = 0; r < size; ++r)
      world.set_delay(r, std::chrono::microseconds(rng() % 200));
    auto engines = engines_on(world, model);
    const int iterations = 3;
    std::vector<std::vector<size_t>> launched;
    for (int i = 0; i < iterations; ++i) {
      std::vector<Gradients> before;
      for (int r = 0; r < size; ++r)
        before.push_back(random_gradients(model, rng));
      std::vector<Gradients> after = before;
      const uint64_t seed = rng();
      const auto finished = iterate_with(
          engines,
          [&](int rank, Engine &engine) {
            std::mt19937_64 marking(seed + rank);
            mark_all(engine, model, after[rank], marking);
          },
          &launched);
      for (const Status &s : finished)
        CHECK_OK(s);
      check_reduced(model, before, after, 1.0f, 1);
    }
    check_launched(world, model, launched, iterations);
  }
}

TEST(engine_priority_sends_the_highest_first_when_all_are_ready) {
  // Tensor 1 spans every bucket, and is made ready last: all four buckets
  // become ready at once, (a, 1), (1), (1), (1, b) of priorities 5, 0, 0
  // and 9, and go out as (1, b), (a, 1), (1), (1).
  Model model = simple_model({1, 38, 1}, 10);
  const uint64_t unordered = plan_fingerprint(model.plan);
  model = prioritized(model, {5, 0, 9});
  CHECK(plan_fingerprint(model.plan) != unordered);
  for (int size : {1, 2, 3, 4}) {
    const std::vector<size_t> launched = reduce_in_order(
        size, model, [](int, Engine &engine, Gradients &g) {
          mark_in(engine, {0, 2, 1}, g, std::chrono::microseconds(500));
        });
    CHECK_EQ(tensors_of(model.plan, launched),
             (std::vector<std::vector<size_t>>{{1, 2}, {0, 1}, {1}, {1}}));
  }
}

TEST(engine_priority_order_whatever_order_ranks_are_ready_in) {
  // Six buckets, priorities rising along the planned order (as "forward"
  // gives): they go out last tensor's first.
  const Model model =
      prioritized(simple_model({8, 8, 8, 8, 8, 8}, 8), {0, 1, 2, 3, 4, 5});
  const std::vector<size_t> forward = {0, 1, 2, 3, 4, 5};
  const std::vector<size_t> backward = {5, 4, 3, 2, 1, 0};
  const std::vector<std::vector<size_t>> highest_first = {{5}, {4}, {3},
                                                          {2}, {1}, {0}};
  const auto pause = std::chrono::microseconds(2000);
  struct Case {
    // Rank r's order, and whether it marks without pauses.
    std::function<std::vector<size_t>(int)> order;
    std::function<bool(int)> at_once;
  };
  const Case cases[] = {
      // One rank far ahead.
      {[&](int) { return forward; }, [](int r) { return r == 0; }},
      // Opposite orders.
      {[&](int r) { return r % 2 == 0 ? forward : backward; },
       [](int) { return false; }},
      // One rank ahead, in the opposite order.
      {[&](int r) { return r == 0 ? backward : forward; },
       [](int r) { return r == 0; }},
  };
  for (const Case &c : cases) {
    for (int size : {2, 3, 4}) {
      const std::vector<size_t> launched = reduce_in_order(
          size, model, [&](int rank, Engine &engine, Gradients &g) {
            mark_in(engine, c.order(rank), g,
                    c.at_once(rank) ? std::chrono::microseconds(0) : pause);
          });
      CHECK_EQ(tensors_of(model.plan, launched), highest_first);
    }
  }
}

TEST(engine_priority_failed_rank_sends_zeros_and_fails_every_rank) {
  const Model model =
      prioritized(simple_model({5, 300, 40, 1, 64}, 64), {3, 1, 4, 1, 5});
  for (int size : {2, 3, 4}) {
    const int failing = size - 1;
    for (size_t marked_first : {size_t(0), size_t(2)}) {
      Ranks ranks(size, model);
      std::vector<Gradients> &before = ranks.before, &after = ranks.after;
      std::vector<std::vector<size_t>> launched;
      const std::vector<size_t> order = {4, 3, 2, 1, 0};
      const auto finished = iterate_with(
          ranks.engines,
          [&](int rank, Engine &engine) {
            if (rank != failing) {
              mark_in(engine, order, after[rank],
                      std::chrono::microseconds(1000));
              return;
            }
            mark_in(engine,
                    std::vector<size_t>(order.begin(),
                                        order.begin() + marked_first),
                    after[rank], std::chrono::microseconds(0));
            engine.fail("backward failed here");
          },
          &launched);
      for (int r = 0; r < size; ++r) {
        CHECK_EQ(finished[r].code(), StatusCode::kRuntimeError);
        CHECK_CONTAINS(finished[r].message(),
                       r == failing ? "backward failed here"
                                    : "another rank of the group failed");
      }
      check_launched(ranks.world, model, launched);
      // The failed rank's buckets that were not ready went out as zeros and
      // wrote nothing back.
      for (size_t k = marked_first; k < order.size(); ++k)
        CHECK_SAME(*after[failing][order[k]], *before[failing][order[k]]);

      // The next iteration is whole again.
      before = after;
      const auto again = iterate_with(
          ranks.engines,
          [&](int rank, Engine &engine) {
            mark_in(engine, order, after[rank], std::chrono::microseconds(0));
          },
          &launched);
      for (const Status &s : again)
        CHECK_OK(s);
      check_reduced(model, before, after, 1.0f, 1);
      check_launched(ranks.world, model, launched, 2);
    }
  }
}

namespace {

// A bucket hook that sums each bucket through the transport, as the engine
// would, recording the buckets it saw; with `fail_at`, it fails at that
// bucket instead (on every rank, as a Python hook's failure is agreed).
class SummingHook : public BucketHook {
public:
  explicit SummingHook(size_t fail_at = SIZE_MAX) : fail_at_(fail_at) {}
  Status reduce(const HookedBucket &bucket, Transport &transport,
                const Polling &polling) override {
    seen.push_back(bucket.index);
    CHECK_EQ(bucket.count * dtype_size(bucket.dtype),
             bucket.bucket->count * dtype_size(bucket.bucket->dtype));
    if (bucket.index == fail_at_)
      return Status::RuntimeError("the hook failed");
    return transport.allreduce(bucket.buffer, bucket.count, bucket.dtype,
                               1.0f, 1, &polling);
  }
  std::vector<size_t> seen;

private:
  const size_t fail_at_;
};

} // namespace

TEST(engine_hook_reduces_every_bucket_as_the_transport_would) {
  std::mt19937_64 rng(17);
  for (int c = 0; c < 9; ++c) {
    const int size = 1 + c % 3;
    const Model model = random_model(rng, 30);
    FakeWorld world(size);
    auto engines = engines_on(world, model);
    for (int i = 0; i < 2; ++i) {
      const float scale = i == 0 ? 1.0f : 0.5f;
      const int divisor = i == 0 ? 1 : size;
      std::vector<Gradients> before;
      for (int r = 0; r < size; ++r)
        before.push_back(random_gradients(model, rng));
      std::vector<Gradients> after = before;
      std::vector<SummingHook> hooks(size);
      const uint64_t seed = rng();
      run_ranks(size, [&](int rank) {
        std::mt19937_64 marks(seed + rank);
        CHECK_OK(engines[rank]->begin(0, scale, divisor, false,
                                      &hooks[rank]));
        mark_all(*engines[rank], model, after[rank], marks);
        CHECK_OK(engines[rank]->finish());
      });
      check_reduced(model, before, after, scale, divisor);
      std::vector<size_t> every(model.plan.size());
      std::iota(every.begin(), every.end(), size_t(0));
      for (const SummingHook &h : hooks)
        CHECK_EQ(h.seen, every);
    }
    for (int r = 0; r < size; ++r)
      CHECK_EQ(world.calls(r), iteration_calls(model.plan, 2));
  }
}

TEST(engine_hook_failure_ends_the_iteration_on_every_rank) {
  const Model model = simple_model({30, 40, 50}, 40);
  const int size = 2;
  FakeWorld world(size);
  auto engines = engines_on(world, model);
  std::mt19937_64 rng(5);
  std::vector<Gradients> g;
  for (int r = 0; r < size; ++r)
    g.push_back(planned_gradients(model, rng));
  for (bool fails : {true, false}) {
    std::vector<SummingHook> hooks;
    for (int r = 0; r < size; ++r)
      hooks.emplace_back(fails ? 1 : SIZE_MAX);
    std::vector<Status> finished(size);
    run_ranks(size, [&](int rank) {
      std::mt19937_64 marks(rank);
      CHECK_OK(engines[rank]->begin(0, 1.0f, 1, false, &hooks[rank]));
      mark_all(*engines[rank], model, g[rank], marks);
      finished[rank] = engines[rank]->finish();
    });
    for (int r = 0; r < size; ++r) {
      if (fails)
        CHECK_CONTAINS(finished[r].message(), "the hook failed");
      else
        CHECK_OK(finished[r]);
    }
  }
  // The failed iteration sent its first bucket and nothing after the
  // hook failed, not even the closing round; the next went on as usual.
  std::vector<Call> calls = {
      {OpKind::kAllreduce, model.plan[0].count, DType::kFloat32}};
  for (const Call &c : iteration_calls(model.plan))
    calls.push_back(c);
  for (int r = 0; r < size; ++r)
    CHECK_EQ(world.calls(r), calls);
}

TEST(owner_runs_split_segments_at_the_owners_bounds) {
  // Tensors of 4, 6 and 5 elements end to end; ranks own [0, 5), [5, 9)
  // and [9, 15). A bucket holding tensor 2, then 1 from its element 2, then
  // tensor 0's first 3 elements.
  Bucket bucket;
  bucket.segments = {{2, 0, 5}, {1, 2, 4}, {0, 0, 3}};
  std::vector<OwnerRun> runs;
  CHECK_OK(owner_runs(bucket, {0, 4, 10}, {0, 5, 9, 15}, &runs));
  // Tensor 2 is [10, 15): rank 2. Tensor 1's [6, 10): rank 1 to 9, then
  // rank 2. Tensor 0's [0, 3): rank 0.
  const std::vector<std::tuple<size_t, size_t, int>> want = {
      {0, 5, 2}, {5, 3, 1}, {8, 1, 2}, {9, 3, 0}};
  CHECK_EQ(runs.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK_EQ(std::make_tuple(runs[i].offset, runs[i].count, runs[i].owner),
             want[i]);
  }
  // Adjacent runs of one owner are one: tensors 0 and 1 both rank 0's.
  bucket.segments = {{0, 0, 4}, {1, 0, 1}};
  CHECK_OK(owner_runs(bucket, {0, 4, 10}, {0, 5, 9, 15}, &runs));
  CHECK_EQ(runs.size(), size_t(1));
  CHECK_EQ(runs[0].count, size_t(5));
  bucket.segments = {{3, 0, 1}};
  CHECK_CONTAINS(owner_runs(bucket, {0, 4, 10}, {0, 5, 9, 15}, &runs)
                     .message(), "knows 3 gradients");
  bucket.segments = {{2, 0, 6}};
  CHECK_CONTAINS(owner_runs(bucket, {0, 4, 10}, {0, 5, 9, 15}, &runs)
                     .message(), "which has 15");
}

TEST(engine_owner_reduction_sums_each_element_on_its_owner_alone) {
  // Random plans, ranges cut anywhere (some empty), and gradients that now
  // and then come in another dtype than planned or not at all: a rank may
  // stage a direct bucket that another reduces in place.
  std::mt19937_64 rng(23);
  for (int c = 0; c < 48; ++c) {
    const int size = 1 + c % 4;
    const Model model = random_model(rng, 30);
    std::vector<size_t> starts;
    size_t total = 0;
    for (const TensorSpec &s : model.specs) {
      starts.push_back(total);
      total += s.count;
    }
    std::vector<size_t> bounds = {0, total};
    for (int r = 1; r < size; ++r)
      bounds.push_back(rng() % (total + 1));
    std::sort(bounds.begin(), bounds.end());
    FakeWorld world(size);
    auto engines = engines_on(world, model);
    std::vector<OwnerReduction> hooks;
    hooks.reserve(size);
    for (int r = 0; r < size; ++r)
      hooks.emplace_back(starts, bounds);
    const int divisor = size;
    // Scaled by 1, direct buckets are reduced where they lie; else staged.
    const float scale = c % 2 == 0 ? 1.0f : 0.5f;
    std::vector<Gradients> before;
    for (int r = 0; r < size; ++r)
      before.push_back(random_gradients(model, rng));
    std::vector<Gradients> after = before;
    const uint64_t seed = rng();
    run_ranks(size, [&](int rank) {
      std::mt19937_64 marks(seed + rank);
      CHECK_OK(engines[rank]->begin(0, scale, divisor, false, &hooks[rank]));
      mark_all(*engines[rank], model, after[rank], marks);
      CHECK_OK(engines[rank]->finish());
    });
    for (size_t t = 0; t < model.specs.size(); ++t) {
      std::vector<const Array *> shares;
      for (const Gradients &g : before)
        shares.push_back(g[t] ? &*g[t] : nullptr);
      for (int r = 0; r < size; ++r) {
        if (!after[r][t])
          continue;
        const Array want = reduced(shares, wire_of(model, t), scale, divisor,
                                   after[r][t]->dtype());
        for (size_t i = 0; i < want.count(); ++i) {
          const size_t at = starts[t] + i;
          if (bounds[r] <= at && at < bounds[r + 1])
            CHECK_EQ(after[r][t]->get(i), want.get(i));
          else
            CHECK(std::isnan(after[r][t]->get(i)));
        }
      }
    }
  }
}
