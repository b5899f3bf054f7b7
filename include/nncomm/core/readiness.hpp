// Readiness: when each gradient of a backward is final. A gradient is
// final once the last function of the backward that writes it has run, so
// that shared parameters are handed to the engine once, after their last
// use. The framework adapter (pyx/nnabla_adapter/) builds a ReadinessTable
// from its analysis of the graph, once per graph, and counts each
// function's call here: in C++, so that nnabla's callback reaches the
// engine with no Python per function, as PyTorch's reducer counts in C++.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

namespace nncomm {

// The functions a backward calls, each named by a key (nnabla: the address
// of its graph node), and the gradients each writes. Immutable.
class ReadinessTable {
public:
  // Function k, named `keys[k]` (distinct, not 0), writes the gradients
  // `written[k]` (positions among `num_gradients`, each once).
  ReadinessTable(const std::vector<uintptr_t> &keys,
                 std::vector<std::vector<size_t>> written,
                 size_t num_gradients);

  // The index of the function named `key`, or -1.
  long find(uintptr_t key) const {
    const auto it = index_.find(key);
    return it == index_.end() ? -1 : static_cast<long>(it->second);
  }
  size_t num_functions() const { return written_.size(); }
  const std::vector<size_t> &written(size_t function) const {
    return written_[function];
  }
  // Per gradient: how many of the functions write it.
  const std::vector<int> &writers() const { return writers_; }

private:
  std::unordered_map<uintptr_t, size_t> index_;
  std::vector<std::vector<size_t>> written_;
  std::vector<int> writers_;
};

// One backward's counts over a table: which functions ran, and per
// gradient how many of its writers are still to run. Not thread-safe: one
// backward runs on one thread.
class Readiness {
public:
  // A backward over `table` begins: nothing has run.
  void start(std::shared_ptr<const ReadinessTable> table);
  // No backward is in flight.
  void stop() { table_.reset(); }
  bool active() const { return table_ != nullptr; }
  const ReadinessTable &table() const { return *table_; }

  bool called(size_t function) const { return called_[function] != 0; }
  int pending(size_t gradient) const { return pending_[gradient]; }
  size_t calls_left() const { return calls_left_; }
  // The key of the latest call counted (0: none yet), which a second
  // callback over the same gradients would repeat.
  uintptr_t last() const { return last_; }
  void set_last(uintptr_t key) { last_ = key; }

  // Function `function` (not called yet) ran, as call `key`: appends the
  // gradients it made final to `ready`.
  void count(size_t function, uintptr_t key, std::vector<size_t> *ready);
  // The gradients count(function) would make final, appended to `ready`,
  // without counting.
  void would_make_final(size_t function, std::vector<size_t> *ready) const;
  // Backward returned before some writers ran: every gradient still
  // waiting for one is final now, appended to `ready`.
  void flush(std::vector<size_t> *ready);

private:
  std::shared_ptr<const ReadinessTable> table_;
  std::vector<int> pending_;
  std::vector<char> called_;
  size_t calls_left_ = 0;
  uintptr_t last_ = 0;
};

} // namespace nncomm
