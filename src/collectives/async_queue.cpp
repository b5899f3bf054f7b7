#include "nncomm/collectives/async_queue.hpp"

#include <chrono>
#include <set>

#include "nncomm/core/wait.hpp"
#include "nncomm/observability/flight_recorder.hpp"

namespace nncomm {

namespace {
// Every queue of the process, for DrainAll.
std::mutex queues_mutex;
std::set<AsyncQueue *> &queues() {
  static std::set<AsyncQueue *> all;
  return all;
}

// Waits on `changed` under `lock` until `ready()`, the queue testing
// without pause meanwhile (`hurry`); with `interruptible`, Python's signal
// handlers run about every 100 ms, and one that raises ends the wait
// (kInterrupted).
template <typename Ready>
Status wait_until(std::unique_lock<std::mutex> &lock,
                  std::condition_variable &changed, std::atomic<bool> &hurry,
                  bool interruptible, const Ready &ready) {
  while (!ready()) {
    hurry = true;
    if (changed.wait_for(lock, std::chrono::milliseconds(100), ready))
      break;
    if (interruptible) {
      lock.unlock();
      const bool stop = interrupted();
      lock.lock();
      if (stop && !ready())
        return Status::Interrupted();
    }
  }
  return Status::Ok();
}
} // namespace

Status GroupCall::run(Group &group) {
  // Its records name the line that started it, as a blocking call's do.
  FlightRecorder::set_call_site(site);
  struct Unset {
    ~Unset() { FlightRecorder::set_call_site(nullptr); }
  } unset;
  switch (kind) {
  case Kind::kAllReduce:
    // Arrays were made to hold memory when the call was started: nothing
    // is left zeroing for this thread to write.
    return group.all_reduce(where, arrays, division, 1.0f, fuse,
                            Materializer{});
  case Kind::kReduce:
    return group.reduce(where, arrays, root, division, fuse);
  case Kind::kBcast:
    return group.bcast(where, arrays, root, fuse);
  case Kind::kAllGather:
    return group.all_gather(where, one, arrays);
  case Kind::kReduceScatter:
    return group.reduce_scatter(where, arrays, one, division);
  }
  return Status::InvalidArgument("an unknown kind of collective");
}

bool Pending::done() {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

Status Pending::wait(bool interruptible) {
  std::unique_lock<std::mutex> lock(mutex_);
  NNCOMM_RETURN_IF_ERROR(wait_until(lock, ran_, *hurry_, interruptible,
                                    [this] { return done_; }));
  return status_;
}

Status AsyncQueue::Create(Group &group, int poll_us,
                          std::unique_ptr<AsyncQueue> *out) {
  std::unique_ptr<Group> own;
  // A rank making a call started here where another makes it blocking
  // waits for a call the other never makes here: the messages say where.
  NNCOMM_RETURN_IF_ERROR(group.duplicate(
      Track::kAsync, "in its queue of async_op=True calls", &own));
  out->reset(new AsyncQueue(std::move(own), poll_us));
  return Status::Ok();
}

AsyncQueue::AsyncQueue(std::unique_ptr<Group> group, int poll_us)
    : group_(std::move(group)),
      hurry_(std::make_shared<std::atomic<bool>>(false)),
      polling_{poll_us, hurry_.get(), &cancel_} {
  thread_ = std::thread([this] { serve(); });
  std::lock_guard<std::mutex> lock(queues_mutex);
  queues().insert(this);
}

AsyncQueue::~AsyncQueue() {
  {
    std::lock_guard<std::mutex> lock(queues_mutex);
    queues().erase(this);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cancel_ = true;
  changed_.notify_all();
  thread_.join();
}

std::shared_ptr<Pending> AsyncQueue::start(GroupCall call) {
  std::shared_ptr<Pending> pending(new Pending(std::move(call), hurry_));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(pending);
  }
  changed_.notify_all();
  return pending;
}

void AsyncQueue::serve() {
  PollingScope scope(&polling_);
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) {
      // Nothing is left to run them: their callers hear so, rather than
      // waiting for ever.
      for (const auto &left : queue_) {
        std::lock_guard<std::mutex> done(left->mutex_);
        left->done_ = true;
        left->status_ = Status::Communicator(
            "a collective started with async_op=True was left unrun: its "
            "group's queue was stopped");
        left->ran_.notify_all();
      }
      queue_.clear();
      return;
    }
    std::shared_ptr<Pending> next = queue_.front();
    lock.unlock();
    const Status status = next->call_.run(*group_);
    {
      std::lock_guard<std::mutex> done(next->mutex_);
      next->done_ = true;
      next->status_ = status;
    }
    next->ran_.notify_all();
    lock.lock();
    queue_.pop_front();
    if (queue_.empty()) {
      *hurry_ = false; // nobody waits for a collective of this queue
      idle_.notify_all();
    }
  }
}

Status AsyncQueue::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  return wait_until(lock, idle_, *hurry_, true,
                    [this] { return queue_.empty(); });
}

Status AsyncQueue::DrainAll() {
  // Held throughout: a queue being destroyed meanwhile waits here (its
  // thread needs nothing of this one to run what is left).
  std::lock_guard<std::mutex> lock(queues_mutex);
  for (AsyncQueue *queue : queues())
    NNCOMM_RETURN_IF_ERROR(queue->drain());
  return Status::Ok();
}

} // namespace nncomm
