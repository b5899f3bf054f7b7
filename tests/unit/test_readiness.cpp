// Readiness: a gradient is final once the last of its writers has run,
// whatever order they run in; what would_make_final predicts is what
// count makes final; flush makes final what is still waiting; a table
// refuses keys it could not tell apart.
#include <algorithm>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>

#include "check.hpp"
#include "nncomm/core/readiness.hpp"

using namespace nncomm;

namespace {

// Functions 0..n-1 named 100 + k.
uintptr_t key(size_t function) { return 100 + function; }

std::shared_ptr<const ReadinessTable>
table_of(const std::vector<std::vector<size_t>> &written,
         size_t num_gradients) {
  std::vector<uintptr_t> keys(written.size());
  for (size_t k = 0; k < keys.size(); ++k)
    keys[k] = key(k);
  return std::make_shared<ReadinessTable>(keys, written, num_gradients);
}

bool throws(const std::function<void()> &body) {
  try {
    body();
  } catch (const std::exception &) {
    return true;
  }
  return false;
}

} // namespace

TEST(readiness_table_finds_functions_and_counts_writers) {
  // Gradient 1 is shared by functions 0 and 2; gradient 3 nobody writes.
  const auto table = table_of({{0, 1}, {2}, {1}}, 4);
  CHECK_EQ(table->num_functions(), size_t(3));
  CHECK_EQ(table->find(key(2)), 2L);
  CHECK_EQ(table->find(7), -1L);
  CHECK_EQ(table->writers(), (std::vector<int>{1, 2, 1, 0}));
}

TEST(readiness_table_refuses_keys_it_cannot_tell_apart) {
  CHECK(throws([] { ReadinessTable({5, 5}, {{0}, {1}}, 2); }));
  CHECK(throws([] { ReadinessTable({0}, {{0}}, 1); }));
  CHECK(throws([] { ReadinessTable({5}, {{0}, {1}}, 2); }));
  CHECK(throws([] { ReadinessTable({5}, {{2}}, 2); }));
}

TEST(readiness_gradient_final_after_its_last_writer_in_any_order) {
  // Random tables, functions counted in random orders: each gradient is
  // made final exactly once, at the call of its last writer, and what
  // would_make_final predicts is what count makes final.
  std::mt19937 random(7);
  for (int round = 0; round < 200; ++round) {
    const size_t functions = 1 + random() % 12, gradients = 1 + random() % 9;
    std::vector<std::vector<size_t>> written(functions);
    for (auto &w : written)
      for (size_t i = 0; i < gradients; ++i)
        if (random() % 3 == 0)
          w.push_back(i);
    const auto table = table_of(written, gradients);
    std::vector<size_t> order(functions);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), random);
    std::vector<size_t> last_writer(gradients, functions);
    for (size_t k : order)
      for (size_t i : written[k])
        last_writer[i] = k;

    Readiness counts;
    CHECK(!counts.active());
    counts.start(table);
    CHECK(counts.active());
    std::vector<int> made_final(gradients, 0);
    for (size_t step = 0; step < functions; ++step) {
      const size_t k = order[step];
      CHECK(!counts.called(k));
      std::vector<size_t> predicted, ready;
      counts.would_make_final(k, &predicted);
      counts.count(k, key(k), &ready);
      CHECK_EQ(ready, predicted);
      CHECK(counts.called(k));
      CHECK_EQ(counts.last(), key(k));
      CHECK_EQ(counts.calls_left(), functions - step - 1);
      for (size_t i : ready) {
        CHECK_EQ(last_writer[i], k);
        ++made_final[i];
      }
    }
    for (size_t i = 0; i < gradients; ++i) {
      CHECK_EQ(made_final[i], last_writer[i] < functions ? 1 : 0);
      CHECK_EQ(counts.pending(i), 0);
    }
    std::vector<size_t> flushed;
    counts.flush(&flushed);
    CHECK(flushed.empty());
  }
}

TEST(readiness_flush_makes_final_what_still_waits) {
  const auto table = table_of({{0, 1}, {1, 2}, {2}}, 4);
  Readiness counts;
  counts.start(table);
  std::vector<size_t> ready;
  counts.count(0, key(0), &ready);
  CHECK_EQ(ready, (std::vector<size_t>{0}));
  ready.clear();
  counts.flush(&ready); // functions 1 and 2 never ran
  CHECK_EQ(ready, (std::vector<size_t>{1, 2}));
  CHECK_EQ(counts.calls_left(), size_t(2));
  // A new backward starts from the table again.
  counts.start(table);
  CHECK_EQ(counts.pending(2), 2);
  CHECK(!counts.called(0));
  CHECK_EQ(counts.last(), uintptr_t(0));
  counts.stop();
  CHECK(!counts.active());
}
