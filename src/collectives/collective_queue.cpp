#include "nncomm/collectives/collective_queue.hpp"

#include <algorithm>
#include <chrono>

#include "nncomm/core/wait.hpp"

namespace nncomm {

CollectiveQueue::Turn::Turn(CollectiveQueue &queue) : queue_(queue) {
  std::unique_lock<std::mutex> lock(queue_.mutex_);
  ticket_ = queue_.issued_++;
  queue_.waiting_.push_back(ticket_);
  while (!queue_.changed_.wait_for(lock, std::chrono::milliseconds(100), [&] {
    return queue_.waiting_.front() == ticket_;
  })) {
    lock.unlock();
    const bool stop = interrupted();
    lock.lock();
    if (stop && queue_.waiting_.front() != ticket_) {
      queue_.waiting_.erase(std::find(queue_.waiting_.begin(),
                                      queue_.waiting_.end(), ticket_));
      status_ = Status::Interrupted();
      return;
    }
  }
}

CollectiveQueue::Turn::~Turn() {
  if (!status_.ok())
    return;
  {
    std::lock_guard<std::mutex> lock(queue_.mutex_);
    queue_.waiting_.pop_front();
  }
  queue_.changed_.notify_all();
}

} // namespace nncomm
