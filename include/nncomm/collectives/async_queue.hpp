// AsyncQueue: a group's nonblocking collectives (Horovod's allreduce_async
// and synchronize, PyTorch's async_op=True and Work.wait).
//
// A caller starts a collective and goes on computing; a thread of the
// queue's runs the collectives in the order they were started, on a
// duplicate of the group (a transport of its own), so that they never
// interleave with the group's blocking collectives, which other threads
// may make meanwhile: the ranks match each sequence on its own
// communicator, so each rank need only start the same collectives in the
// same order, as for blocking ones. The thread waits for other ranks as an
// engine's does (wait.hpp's Polling): it sleeps between tests while nobody
// waits for the result, so the caller's computation keeps its core, and
// tests without pause once someone does (Pending::wait). Its waits are
// bounded and fail as any wait does; a failure is its call's result, which
// wait() hands back.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "nncomm/collectives/group.hpp"

namespace nncomm {

// One collective of a Group, as its arguments: what a blocking call would
// pass, kept until the queue's thread runs it.
struct GroupCall {
  enum class Kind { kAllReduce, kReduce, kBcast, kAllGather, kReduceScatter };
  Kind kind = Kind::kAllReduce;
  Placement where;
  // The arrays reduced, broadcast or received (all_gather), or sent
  // (reduce_scatter).
  std::vector<ArrayRef> arrays;
  // all_gather's send, reduce_scatter's recv.
  ArrayRef one;
  int root = 0;
  bool division = false;
  bool fuse = true;
  // The caller's line, for the flight recorder (set_call_site), or null.
  const char *site = nullptr;

  Status run(Group &group);
};

// A collective started on an AsyncQueue; kept by its caller, and by the
// queue until it has run.
class Pending {
public:
  // Whether it has run; never blocks.
  bool done();
  // Blocks until it has run and returns its status; its queue tests
  // without pause meanwhile. With `interruptible`, Python's signal handlers
  // run about every 100 ms, and one that raises ends the wait at once
  // (kInterrupted) while the collective goes on, to be waited for again.
  Status wait(bool interruptible);

private:
  friend class AsyncQueue;
  Pending(GroupCall call, std::shared_ptr<std::atomic<bool>> hurry)
      : call_(std::move(call)), hurry_(std::move(hurry)) {}

  GroupCall call_;
  const std::shared_ptr<std::atomic<bool>> hurry_; // the queue's
  std::mutex mutex_;
  std::condition_variable ran_;
  bool done_ = false;
  Status status_;
};

class AsyncQueue {
public:
  // A queue on a duplicate of `group`, with its thread, waiting as an
  // engine does (`poll_us` between tests). Collective over the group.
  static Status Create(Group &group, int poll_us,
                       std::unique_ptr<AsyncQueue> *out);
  // Stops the thread; a collective still waiting for other ranks gives
  // up, and those not run yet fail. (The binding's Pendings keep their
  // group, and so its queue, until their collectives have run.)
  ~AsyncQueue();

  // Starts `call`, after every collective started before it.
  std::shared_ptr<Pending> start(GroupCall call);

  // Waits until every queue of the process has run what was started on it
  // (comm.join() opens, leaves and closes its scope only then, so that a
  // collective runs inside the scope on every rank or on none, and no
  // thread but the caller's uses a transport the scope shadows); Python's
  // signal handlers run about every 100 ms, and one that raises ends the
  // wait (kInterrupted).
  static Status DrainAll();

private:
  AsyncQueue(std::unique_ptr<Group> group, int poll_us);
  void serve();
  Status drain();

  const std::unique_ptr<Group> group_;
  const std::shared_ptr<std::atomic<bool>> hurry_;
  std::atomic<bool> cancel_{false};
  const Polling polling_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::condition_variable idle_; // the queue became empty
  std::deque<std::shared_ptr<Pending>> queue_; // front: running
  bool stop_ = false;
  std::thread thread_;
};

} // namespace nncomm
