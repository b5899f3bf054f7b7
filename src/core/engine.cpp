#include "nncomm/core/engine.hpp"

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "nncomm/observability/config.hpp"

namespace nncomm {

namespace {

// The next engine iteration's number, across the process's engines.
std::atomic<int64_t> next_iteration{0};

} // namespace

Engine::Engine(std::unique_ptr<Transport> transport,
               std::unique_ptr<BucketRunner> runner, size_t num_tensors,
               int poll_us)
    : transport_(std::move(transport)), runner_(std::move(runner)),
      polling_{poll_us, &hurry_, &cancel_}, ptrs_(num_tensors, nullptr),
      dtypes_(num_tensors, DType::kFloat32) {
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  // A reduction still waiting for other ranks gives up, so the join below
  // (made holding the GIL) is bounded.
  cancel_ = true;
  changed_.notify_all();
  thread_.join();
}

Status Engine::add_plan(std::vector<Bucket> plan, size_t *id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (active_) {
    // The thread reads the runner's buffers while it reduces.
    return Status::RuntimeError(
        "nncomm's engine is in an iteration; a plan is added between them");
  }
  std::unique_ptr<Plan> added(
      new Plan{std::move(plan), std::vector<std::vector<size_t>>(ptrs_.size()),
               LaunchTuner(config::engine_launch())});
  for (size_t b = 0; b < added->buckets.size(); ++b) {
    for (size_t t : added->buckets[b].tensors)
      added->buckets_of[t].push_back(b);
  }
  NNCOMM_RETURN_IF_ERROR(runner_->prepare(added->buckets));
  const auto free_slot = std::find(plans_.begin(), plans_.end(), nullptr);
  *id = static_cast<size_t>(free_slot - plans_.begin());
  if (free_slot == plans_.end())
    plans_.push_back(std::move(added));
  else
    *free_slot = std::move(added);
  return Status::Ok();
}

void Engine::drop_plan(size_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (id >= plans_.size() || (active_ && plans_[id].get() == plan_))
    return;
  if (plans_[id].get() == plan_)
    plan_ = nullptr;
  plans_[id].reset();
}

Status Engine::begin(size_t plan, float scale, int divisor,
                     bool check_finite, BucketHook *hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (active_) {
    // Its thread may be reducing a bucket of that iteration right now.
    return Status::RuntimeError(
        "nncomm's engine is still in an iteration; close it (finish()) "
        "before beginning another");
  }
  if (plan >= plans_.size() || !plans_[plan])
    return Status::InvalidArgument("no such plan in nncomm's engine");
  plan_ = plans_[plan].get();
  pending_.resize(plan_->buckets.size());
  for (size_t b = 0; b < pending_.size(); ++b) {
    pending_[b] = plan_->buckets[b].tensors.size();
  }
  std::fill(ptrs_.begin(), ptrs_.end(), nullptr);
  next_ = 0;
  ready_ = 0;
  // Even without buckets the closing round runs: it is how the ranks
  // learn that one failed.
  active_ = true;
  closing_ = false;
  failed_here_ = failed_elsewhere_ = false;
  failure_.clear();
  error_ = Status::Ok();
  scale_ = scale;
  divisor_ = divisor;
  check_finite_ = check_finite;
  hook_ = hook;
  nonfinite_.clear();
  noted_.clear();
  reports_.clear();
  hurry_ = false;
  iteration_ = next_iteration++;
  started_ = std::chrono::steady_clock::now();
  return Status::Ok();
}

void Engine::mark_ready(size_t tensor, void *ptr, DType dtype) {
  bool wake = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!active_ || failed_here_)
      return;
    if (Timeline::on()) {
      TimelineArgs args;
      args.iteration = iteration_;
      args.tensor = static_cast<int64_t>(tensor);
      Timeline::instant(Track::kGradients, nullptr, std::move(args));
    }
    ptrs_[tensor] = ptr;
    dtypes_[tensor] = dtype;
    const size_t was_ready = ready_;
    for (size_t b : plan_->buckets_of[tensor]) {
      const bool last = --pending_[b] == 0;
      if (last) {
        const Status status = runner_->ready(b);
        if (!status.ok()) {
          lock.unlock();
          fail(status.message());
          return;
        }
      }
      ready_ += last;
    }
    // Only when the thread has something to do: a wake-up per bucket costs
    // backward a context switch.
    wake = ready_ > was_ready && next_step() != Step::kWait;
  }
  if (wake)
    changed_.notify_all();
}

void Engine::note_nonfinite(size_t tensor) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (active_)
    noted_.push_back(tensor);
}

void Engine::fail(const std::string &message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!active_ || failed_here_)
      return;
    fail_here(message);
  }
  changed_.notify_all();
}

Status Engine::finish() {
  const Status status = end_backward();
  if (Timeline::on()) {
    TimelineArgs args;
    args.iteration = iteration_;
    Timeline::complete(Track::kBackward, "backward", started_,
                       Timeline::Clock::now(), std::move(args));
  }
  return status;
}

Status Engine::end_backward() {
  hurry_ = true;
  std::unique_lock<std::mutex> lock(mutex_);
  closing_ = true;
  changed_.notify_all();
  {
    TimelineSpan span(Track::kBackward, "wait_engine");
    if (span.on())
      span.args().iteration = iteration_;
    // The thread's own waits are bounded; this one also lets Ctrl-C
    // through.
    while (!changed_.wait_for(lock, std::chrono::milliseconds(100),
                              [this] { return !active_; })) {
      lock.unlock();
      const bool stop = interrupted();
      lock.lock();
      if (stop) {
        mark_broken("a wait was interrupted (all_reduce_callback)", false);
        cancel_ = true;
        changed_.wait(lock, [this] { return !active_; });
        return Status::Interrupted();
      }
    }
  }
  // Whatever happened, the framework's later work must not overtake what
  // was written back.
  const Status closed = runner_->close();
  if (failed_here_)
    return Status::RuntimeError(failure_);
  if (!error_.ok())
    return error_;
  if (failed_elsewhere_) {
    return Status::RuntimeError(
        "another rank of the group failed during this backward; the "
        "gradients were not all-reduced");
  }
  if (!reports_.empty()) {
    std::string ranks;
    for (const NonFiniteTensors &r : reports_)
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(r.rank);
    return Status::NonFinite("gradients held a NaN or an infinity on group "
                             "ranks " + ranks);
  }
  return closed;
}

std::vector<NonFiniteTensors> Engine::nonfinite() {
  std::lock_guard<std::mutex> lock(mutex_);
  return active_ ? std::vector<NonFiniteTensors>() : reports_;
}

Engine::Step Engine::next_step() const {
  if (stop_)
    return Step::kStop;
  if (!active_)
    return Step::kWait;
  // The closing round waits for finish(), so that a failure of this rank
  // up to then reaches the others.
  if (next_ == plan_->buckets.size())
    return closing_ || failed_here_ ? Step::kClose : Step::kWait;
  const bool eager = plan_->tuner.next() == Launch::kEager;
  const bool complete = ready_ == plan_->buckets.size();
  return pending_[next_] == 0 && (eager || complete) ? Step::kBucket
                                                      : Step::kWait;
}

void Engine::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    Step step = next_step();
    if (step == Step::kWait) {
      const bool tracing = Timeline::on();
      const Timeline::Clock::time_point since =
          tracing ? Timeline::Clock::now() : Timeline::Clock::time_point();
      changed_.wait(lock, [&] {
        step = next_step();
        return step != Step::kWait;
      });
      if (tracing)
        trace_wait(since);
    }
    if (step == Step::kStop)
      return;
    const bool failed = failed_here_;
    if (step == Step::kClose) {
      lock.unlock();
      bool any_failed = false;
      double seconds = 0;
      OperationLabel label("all_reduce_callback: the round after the last "
                           "bucket");
      Status status = close_iteration(failed, &any_failed, &seconds);
      lock.lock();
      if (status.ok() && !any_failed)
        plan_->tuner.record(seconds);
      failed_elsewhere_ = any_failed;
      end_iteration(status);
      continue;
    }
    const size_t b = next_;
    lock.unlock();
    Status status;
    Phase reached;
    {
      OperationLabel label("all_reduce_callback: gradient bucket %zu of %zu",
                           b + 1, plan_->buckets.size());
      status = reduce_bucket(b, failed, &reached);
    }
    lock.lock();
    if (status.ok() || (reached == Phase::kWritingBack && !failed)) {
      // Sent; a failure to write it back is this rank's alone.
      ++next_;
      if (!status.ok())
        fail_here(status.message());
    } else if (reached == Phase::kPreparing && !failed) {
      // Not sent: it goes out as zeros, with the rest.
      fail_here(status.message());
    } else {
      // The ranks no longer agree on what comes next (the transport failed,
      // or they make different calls), so nothing more is sent.
      end_iteration(status);
    }
  }
}

void Engine::trace_wait(Timeline::Clock::time_point since) const {
  // Idle between iterations is no wait for backward; the part of a wait
  // after begin() is.
  if (!active_)
    return;
  TimelineArgs args;
  args.iteration = iteration_;
  Timeline::complete(Track::kEngine, "wait_gradients",
                     std::max(since, started_), Timeline::Clock::now(),
                     std::move(args));
}

void Engine::trace_bucket(TimelineSpan &span, size_t b) const {
  if (!span.on())
    return;
  TimelineArgs &args = span.args();
  args.iteration = iteration_;
  args.bucket = static_cast<int64_t>(b);
  const Bucket &bucket = plan_->buckets[b];
  args.bytes = static_cast<int64_t>(bucket.count * dtype_size(bucket.dtype));
  args.dtype = dtype_name(bucket.dtype);
}

void Engine::end_iteration(const Status &status) {
  if (!status.ok() && error_.ok())
    error_ = status;
  active_ = false;
  changed_.notify_all();
}

void Engine::fail_here(const std::string &message) {
  failed_here_ = true;
  failure_ = message;
  std::fill(pending_.begin(), pending_.end(), 0);
  ready_ = plan_->buckets.size();
}

Status Engine::close_iteration(bool failed, bool *any_failed, double *seconds) {
  TimelineSpan span(Track::kEngine, "close");
  if (span.on())
    span.args().iteration = iteration_;
  const auto elapsed = std::chrono::steady_clock::now() - started_;
  // noted_ is complete: finish() was called after the last note. Every
  // bucket's work has completed, so a device's findings are on the host,
  // or on their way (DeviceArrays::findings); the round is the first point
  // that needs them, so no transport waits for them (NCCL's would not).
  nonfinite_.insert(nonfinite_.end(), noted_.begin(), noted_.end());
  // A rank that cannot read its findings takes part as a failed one, so
  // that the others do not wait for it.
  const Status collected = runner_->nonfinite(&nonfinite_);
  failed = failed || !collected.ok();
  int64_t round[3] = {
      failed ? 1 : 0,
      std::chrono::duration_cast<std::chrono::microseconds>(elapsed).count(),
      nonfinite_.empty() ? 0 : 1};
  NNCOMM_RETURN_IF_ERROR(
      transport_->host().allreduce(round, 3, DType::kInt64, 1.0f, 1,
                                   &polling_));
  *any_failed = round[0] > 0;
  *seconds = static_cast<double>(round[1]) * 1e-6;
  NNCOMM_RETURN_IF_ERROR(round[2] > 0 ? gather_nonfinite() : Status::Ok());
  return collected;
}

Status Engine::gather_nonfinite() {
  constexpr size_t kRecord = 1 + NonFiniteTensors::kNamed;
  std::sort(nonfinite_.begin(), nonfinite_.end());
  nonfinite_.erase(std::unique(nonfinite_.begin(), nonfinite_.end()),
                   nonfinite_.end());
  // This rank's record: how many, then the first kNamed.
  std::vector<int64_t> mine(kRecord, 0);
  mine[0] = static_cast<int64_t>(nonfinite_.size());
  for (size_t i = 0; i < nonfinite_.size() && i < NonFiniteTensors::kNamed;
       ++i)
    mine[1 + i] = static_cast<int64_t>(nonfinite_[i]);
  std::vector<int64_t> all(kRecord * transport_->size());
  Transport &host = transport_->host();
  WorkPtr work;
  NNCOMM_RETURN_IF_ERROR(host.start_allgather(mine.data(), all.data(),
                                              kRecord, DType::kInt64, &work));
  NNCOMM_RETURN_IF_ERROR(wait_for(*work, host.rank() == 0, &polling_));
  reports_.clear();
  for (int r = 0; r < transport_->size(); ++r) {
    const int64_t *record = &all[r * kRecord];
    if (record[0] == 0)
      continue;
    NonFiniteTensors found{r, static_cast<size_t>(record[0]), {}};
    for (size_t i = 0; i < found.count && i < NonFiniteTensors::kNamed; ++i)
      found.tensors.push_back(static_cast<size_t>(record[1 + i]));
    reports_.push_back(std::move(found));
  }
  return Status::Ok();
}

Launch Engine::launch(size_t plan, bool *decided) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (plan >= plans_.size() || !plans_[plan]) {
    *decided = false;
    return Launch::kEager;
  }
  *decided = plans_[plan]->tuner.decided();
  return plans_[plan]->tuner.next();
}

size_t Engine::written_back() {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_;
}

std::vector<size_t> Engine::launched() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<size_t> order(next_);
  std::iota(order.begin(), order.end(), size_t(0));
  return order;
}

Status Engine::reduce_bucket(size_t b, bool failed, Phase *reached) {
  *reached = Phase::kPreparing;
  const Bucket &bucket = plan_->buckets[b];
  const TensorTable tensors{ptrs_, dtypes_};
  const bool check = check_finite_ && !failed;
  WorkPtr work;
  void *staged = nullptr;
  int hook_divisor = 1;
  {
    TimelineSpan span(Track::kEngine, "pack");
    trace_bucket(span, b);
    NNCOMM_RETURN_IF_ERROR(
        hook_ != nullptr
            ? runner_->stage(b, bucket, tensors, scale_, divisor_, failed,
                             check, hook_->reduces_in_place(), &staged,
                             &hook_divisor)
            : runner_->start(b, bucket, tensors, scale_, divisor_, failed,
                             check, &work));
  }
  *reached = Phase::kReducing;
  {
    TimelineSpan span(Track::kEngine, hook_ != nullptr ? "hook" : "reduce");
    trace_bucket(span, b);
    NNCOMM_RETURN_IF_ERROR(
        hook_ != nullptr
            ? hook_->reduce(HookedBucket{b, plan_->buckets.size(), &bucket,
                                         staged, bucket.count, bucket.dtype,
                                         hook_divisor, runner_->stream(),
                                         runner_->device()},
                            *transport_, polling_)
            : wait_for(*work, transport_->rank() == 0, &polling_));
  }
  *reached = Phase::kWritingBack;
  TimelineSpan span(Track::kEngine, "unpack");
  trace_bucket(span, b);
  return runner_->finish();
}

} // namespace nncomm
