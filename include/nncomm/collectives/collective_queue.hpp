// CollectiveQueue: the order of the collectives on one group of ranks.
//
// Every rank must issue a group's collectives in the same order (NCCL
// deadlocks otherwise, MPI matches the wrong calls), and one transport
// carries one operation at a time. Threads that call collectives on one
// group take turns here, first come, first served: a thread waits for its
// turn, makes its calls, and hands the turn on. A caller's thread waiting
// for its turn lets Ctrl-C through, as its waits for other ranks do
// (wait.hpp); its wait is otherwise bounded by the turn before it, whose
// waits are.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>

#include "nncomm/core/status.hpp"

namespace nncomm {

class CollectiveQueue {
public:
  // Holds a turn for its scope; ok() says whether it was given (it is not
  // when the wait was interrupted: status() says so).
  class Turn {
  public:
    explicit Turn(CollectiveQueue &queue);
    ~Turn();
    Turn(const Turn &) = delete;
    Turn &operator=(const Turn &) = delete;
    const Status &status() const { return status_; }

  private:
    CollectiveQueue &queue_;
    uint64_t ticket_;
    Status status_;
  };

private:
  std::mutex mutex_;
  std::condition_variable changed_;
  uint64_t issued_ = 0;
  std::deque<uint64_t> waiting_; // front: the turn under way
};

} // namespace nncomm
