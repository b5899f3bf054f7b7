// Engine: the background thread that all-reduces gradient buckets while
// backward goes on.
//
// The framework adapter (pyx/nnabla_adapter/backward_hook.pxi) calls
// mark_ready() as each gradient becomes final. The engine's thread launches buckets strictly in
// plan order, so every rank issues the same calls whatever order its
// gradients finish in: it waits until the next bucket's tensors
// are all ready and has its BucketRunner reduce it (times `scale`, summed,
// divided by `divisor`), waiting on the transport as its Polling says.
//
// Buckets go out as soon as they are ready, or all once the last is ready,
// as the LaunchTuner says.
//
// Priority order (BytePS's `priority=`) is the plan's own order:
// prioritize() (bucket_plan.hpp) sorts the buckets highest priority first,
// and the engine launches them as it launches any plan.
//
// A rank that fails locally mid-iteration (fail()) still sends every
// remaining bucket, zero-filled, so that no rank is left waiting; after the
// last bucket, once finish() is called, the ranks sum a failure flag and
// the iteration's time, so every rank learns whether some rank failed
// before it finished, and every rank's tuner sees the same times.
//
// With a bucket hook (begin()'s `hook`, bucket_hook.hpp), each bucket is
// packed into the staging buffer and reduced by the hook, on this thread,
// on the engine's transport, instead of by the transport's all-reduce; the
// hook makes sure every rank learns of a failure of its own, so a failed
// hook ends the iteration on every rank, as a transport's error does.
//
// With the NaN/infinity check on (begin()'s `check_finite`), the runner
// checks each gradient as it packs it (or before reducing it in place),
// and the bucket goes out all the same, so every rank's calls stay
// matched; the runner hands over what it found just before the closing
// round (on a device, only then do the flags reach the host, so no
// bucket waits for them), which carries a third number, whether this rank
// found one (always sent, 0 with the check off, so that ranks that
// disagree on the setting still match and the check costs nothing off),
// and only where some rank did, one small all-gather tells every rank
// which tensors of which ranks: finish() then fails with kNonFinite on
// every rank, before the framework updates anything.
//
// While the timeline is on (timeline.hpp), the engine records each
// iteration from begin() to the return of finish() ("backward", with
// finish()'s wait for the thread, "wait_engine"), each gradient made ready,
// and on the thread's own track each bucket's "pack" (packing, and posting
// the reduction), "reduce" (waiting for it) and "unpack" (writing it
// back), the closing round ("close") and the thread's waits for backward
// within an iteration ("wait_gradients"). Iterations are numbered across
// the process's engines, so that each number is one engine's iteration.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nncomm/core/bucket_hook.hpp"
#include "nncomm/core/bucket_plan.hpp"
#include "nncomm/core/bucket_runner.hpp"
#include "nncomm/core/launch_tuner.hpp"
#include "nncomm/core/status.hpp"
#include "nncomm/observability/timeline.hpp"
#include "nncomm/transports/transport.hpp"
#include "nncomm/core/wait.hpp"

namespace nncomm {

// A rank's tensors that held a NaN or an infinity in an iteration: its
// rank in the group, how many, and the first kNamed of them by index.
struct NonFiniteTensors {
  static constexpr size_t kNamed = 8;
  int rank;
  size_t count;
  std::vector<size_t> tensors;
};

class Engine {
public:
  // Starts the thread, which communicates on `transport` alone (give each
  // engine its own communicator: two engines on one would interleave their
  // collectives differently on different ranks), reducing buckets of
  // `num_tensors` tensors with `runner` (which works on `transport`), by
  // the plans added to it: one engine serves every plan of a set of
  // gradients (a graph that reaches other parameters, a parameter
  // reshaped), its thread and communicators made once.
  Engine(std::unique_ptr<Transport> transport,
         std::unique_ptr<BucketRunner> runner, size_t num_tensors,
         int poll_us);
  ~Engine();
  Engine(const Engine &) = delete;
  Engine &operator=(const Engine &) = delete;

  // Adds `plan`, which covers the engine's tensors by index (its buckets
  // launched in its order), and has the runner allocate for its largest
  // bucket (BucketRunner::prepare), so that no iteration allocates.
  // `*id` names it for begin(). Fails during an iteration.
  Status add_plan(std::vector<Bucket> plan, size_t *id);
  // Forgets plan `id` (never the one of an iteration under way).
  void drop_plan(size_t id);
  // Starts an iteration of plan `plan`: every tensor is pending again;
  // with `check_finite`, each is checked for NaN and infinity before it
  // leaves; with `hook`, which must last until finish() returns, the hook
  // reduces every bucket. Fails while the previous iteration is under way
  // (finish() ends it).
  Status begin(size_t plan, float scale, int divisor,
               bool check_finite = false, BucketHook *hook = nullptr);
  // Tensor `tensor` is final, at `ptr`, holding `dtype`. A dtype other
  // than the one planned is converted to and from the bucket's dtype.
  void mark_ready(size_t tensor, void *ptr, DType dtype);
  // Tensor `tensor`, which no bucket of the plan holds (the framework
  // reduces it itself), holds a NaN or an infinity: reported with the
  // others. Called before finish().
  void note_nonfinite(size_t tensor);
  // This rank failed: the remaining buckets go out zero-filled, the flag
  // round tells the other ranks, and finish() returns `message`.
  void fail(const std::string &message);
  // Waits until every bucket of the iteration is reduced. Fails with this
  // rank's own error, an MPI error, a timeout, the news that another rank
  // failed, or Interrupted when Ctrl-C stopped the wait (the engine then
  // gives up its reductions: nothing can be sent any more), or
  // kNonFinite when a rank checking found a NaN or an infinity
  // (nonfinite() says where).
  Status finish();
  // The ranks whose tensors held a NaN or an infinity in the latest
  // iteration, in rank order; empty unless finish() failed with
  // kNonFinite.
  std::vector<NonFiniteTensors> nonfinite();
  // The schedule of plan `plan`'s next iteration; `*decided`: whether its
  // tuner has settled on it (launch_tuner.hpp).
  Launch launch(size_t plan, bool *decided);
  // The buckets of the latest iteration that went out, in that order.
  std::vector<size_t> launched();
  // How many buckets of the latest iteration are reduced and written back:
  // the plan's first ones (its order is the launch order). In host memory
  // their tensors are the framework's again.
  size_t written_back();

private:
  // A plan added, with what the engine keeps of it.
  struct Plan {
    std::vector<Bucket> buckets;
    std::vector<std::vector<size_t>> buckets_of; // tensor -> its buckets
    // Its next() is the plan's schedule: it changes only when an
    // iteration's closing round is recorded.
    LaunchTuner tuner;
  };

  // What the thread does next.
  enum class Step { kWait, kBucket, kClose, kStop };
  // Called holding mutex_.
  Step next_step() const;
  void run();
  // finish() but for the timeline.
  Status end_backward();
  // The thread waited from `since` (the timeline being on): recorded when
  // an iteration was under way. Called holding mutex_.
  void trace_wait(Timeline::Clock::time_point since) const;
  // Fills in `span`'s args for bucket `b`, when the timeline is on.
  void trace_bucket(TimelineSpan &span, size_t b) const;
  // How far a bucket got: a failure while preparing it is this rank's
  // alone and the bucket can still go out (as zeros); one while it is
  // reduced is the transport's or the ranks' (they make different calls),
  // after which nothing more can be sent; one while writing it back is this
  // rank's alone, the bucket having gone out.
  enum class Phase { kPreparing, kReducing, kWritingBack };
  // Reduces bucket `b`; `failed` sends zeros instead. `*reached`: how far
  // it got.
  Status reduce_bucket(size_t b, bool failed, Phase *reached);
  // This rank failed (`message`): the remaining buckets go out as zeros.
  // Called holding mutex_.
  void fail_here(const std::string &message);
  // Nothing more is sent this iteration; finish() reports `status` unless
  // an earlier error. Called holding mutex_.
  void end_iteration(const Status &status);
  // The round after the last bucket: did any rank fail, and how long did
  // the iteration take on all ranks together (for the tuner)?
  Status close_iteration(bool failed, bool *any_failed, double *seconds);
  // After a closing round in which some rank found a NaN or an infinity:
  // every rank's findings into reports_, gathered from all.
  Status gather_nonfinite();

  const std::unique_ptr<Transport> transport_;
  const std::unique_ptr<BucketRunner> runner_; // uses transport_
  std::atomic<bool> hurry_{false}; // finish() is waiting: poll without pause
  std::atomic<bool> cancel_{false}; // stop waiting on MPI: being destroyed
  const Polling polling_;

  std::mutex mutex_;
  std::vector<std::unique_ptr<Plan>> plans_; // by id; null: dropped
  Plan *plan_ = nullptr;                     // the latest iteration's
  std::condition_variable changed_;
  std::vector<size_t> pending_; // bucket -> tensors not ready yet
  std::vector<void *> ptrs_;    // tensor -> its memory this iteration
  std::vector<DType> dtypes_;   // tensor -> its dtype this iteration
  // The next bucket to launch; at the plan's size, the closing round is
  // next.
  size_t next_ = 0;
  size_t ready_ = 0; // buckets whose tensors are all ready (or failed)
  std::chrono::steady_clock::time_point started_;
  int64_t iteration_ = -1; // the process-wide number of the latest begin()
  bool active_ = false;  // an iteration is under way
  bool closing_ = false; // finish() was called: the closing round may go
  bool stop_ = false;
  bool failed_here_ = false;
  bool failed_elsewhere_ = false;
  std::string failure_;
  Status error_;
  float scale_ = 1.0f;
  int divisor_ = 1;
  bool check_finite_ = false;
  BucketHook *hook_ = nullptr;
  // Tensors found holding a NaN or an infinity here this iteration (by the
  // thread, possibly twice: a tensor split across buckets), and what the
  // ranks told each other.
  std::vector<size_t> nonfinite_;
  std::vector<size_t> noted_; // by note_nonfinite(), under mutex_
  std::vector<NonFiniteTensors> reports_;

  std::thread thread_; // last: starts once everything above exists
};

} // namespace nncomm
