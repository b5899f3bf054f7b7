// What all_reduce_callback's hook does in C++, with no Python: a function
// of the backward in flight ran, so count it (core/readiness.hpp), read
// the gradients it made final (nnabla_arrays.hpp) and hand them to the
// engine. nnabla's backward calls it with no GIL (communicator_callbacks=,
// nnabla_abi.hpp's Bridge), the Python hook first of all
// (function_post_hook=).
//
// Whatever it cannot settle it declines, having changed nothing, and the
// Python hook (backward_hook.pxi) handles that call on the same counts: the
// first call of a backward (which begins it) and the last (which ends it),
// a function the table lacks or one already called, a call repeated by a
// second callback, a gradient not as planned (dtype, size) or whose memory
// nnabla cannot give, a call on another thread than the backward's.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "nncomm/core/engine.hpp"
#include "nncomm/core/readiness.hpp"
#include "nnabla_adapter/nnabla_arrays.hpp"

namespace nncomm {
namespace nnabla_abi {

class BackwardCounts {
public:
  // Over the gradients `arrays` (nbla::NdArray*, kept alive by the
  // caller), read in context `ctx` by `calls`; with `calls` null nothing
  // is read here, and every call goes to Python.
  BackwardCounts(const NdArrayCalls *calls, std::vector<void *> arrays,
                 Context ctx)
      : calls_(calls), arrays_(std::move(arrays)), ctx_(std::move(ctx)) {}

  // The counts, which the Python hook reads, and changes through the
  // methods below.
  const Readiness &readiness() const { return readiness_; }

  // A backward begins on this thread, counted by `table`: the gradients
  // go to `engine`, which planned them as `counts` elements of `dtypes`
  // (both kept alive by the caller until stop()). `caller_ends`: its last
  // call does not end it (DistributedSolver ends it), so it may be
  // counted here.
  void start(std::shared_ptr<const ReadinessTable> table, Engine *engine,
             const std::vector<long> *counts, const std::vector<int> *dtypes,
             bool caller_ends) {
    std::lock_guard<std::mutex> lock(mutex_);
    readiness_.start(std::move(table));
    engine_ = engine;
    counts_ = counts;
    dtypes_ = dtypes;
    caller_ends_ = caller_ends;
    thread_ = std::this_thread::get_id();
  }

  void stop() {
    std::lock_guard<std::mutex> lock(mutex_);
    readiness_.stop();
  }

  // Readiness's, for the Python hook.
  void count(size_t function, uintptr_t key, std::vector<size_t> *ready) {
    std::lock_guard<std::mutex> lock(mutex_);
    readiness_.count(function, key, ready);
  }
  void flush(std::vector<size_t> *ready) {
    std::lock_guard<std::mutex> lock(mutex_);
    readiness_.flush(ready);
  }
  void set_last(uintptr_t key) {
    std::lock_guard<std::mutex> lock(mutex_);
    readiness_.set_last(key);
  }

  // Counts the call of the function named `key` and hands the gradients it
  // made final to the engine; false where it declines (nothing changed).
  bool try_count(uintptr_t key) noexcept {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock() || calls_ == nullptr || !readiness_.active() ||
        key == readiness_.last() || std::this_thread::get_id() != thread_)
      return false;
    const long function = readiness_.table().find(key);
    if (function < 0 || readiness_.called(function) ||
        (readiness_.calls_left() == 1 && !caller_ends_))
      return false;
    final_.clear();
    memory_.clear();
    readiness_.would_make_final(function, &final_);
    for (size_t i : final_) {
      long count = 0;
      int type = 0;
      bool zeroing = false;
      void *ptr = nullptr;
      if (!calls_->head(arrays_[i], &count, &type, &zeroing) ||
          count != (*counts_)[i] || dtype_code(type) != (*dtypes_)[i] ||
          !calls_->memory(arrays_[i], type, ctx_, false, &ptr))
        return false;
      memory_.push_back(ptr);
    }
    final_.clear();
    readiness_.count(function, key, &final_);
    for (size_t k = 0; k < final_.size(); ++k)
      engine_->mark_ready(final_[k], memory_[k],
                          static_cast<DType>((*dtypes_)[final_[k]]));
    return true;
  }

private:
  const NdArrayCalls *const calls_;
  const std::vector<void *> arrays_;
  const Context ctx_;
  // Held by every change of the counts: nothing stops another thread from
  // beginning a backward over the same gradients (a misuse: both would
  // write them) while a call is counted here without the GIL.
  std::mutex mutex_;
  Readiness readiness_;
  Engine *engine_ = nullptr;
  const std::vector<long> *counts_ = nullptr;
  const std::vector<int> *dtypes_ = nullptr;
  bool caller_ends_ = false;
  std::thread::id thread_;
  // Reused by every call, so that none allocates once warm.
  std::vector<size_t> final_;
  std::vector<void *> memory_;
};

} // namespace nnabla_abi
} // namespace nncomm
