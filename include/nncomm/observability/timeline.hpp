// Timeline: a trace of what this rank's communication does, for Perfetto
// and chrome://tracing, as Horovod's timeline (HOROVOD_TIMELINE) is.
//
// The engine, the list collectives and the waits record events here, in
// the process-wide timeline; one background thread formats and writes
// them, so that no recording thread waits for the file. While the timeline
// is off, a record site costs one relaxed atomic load (Timeline::on()).
// While it is on, a record takes a mutex and moves a small struct into a
// buffer reserved when the timeline started: no allocation, no formatting.
// The writer swaps that buffer for its own every kFlushMilliseconds, or
// as soon as it is half full, and writes outside the mutex. An event that
// finds the buffer full (a disk slower than the events come) is dropped
// and counted, and the count is written when the timeline stops.
//
// The file is the Trace Event Format's JSON Array Format: "[" and one event
// a line, each line ending with a comma; stop() writes a last event (an
// instant, "timeline stopped", whose args hold the count of dropped
// events) and the closing "]". A job that dies leaves a file without them,
// which the viewers read all the same (the format makes the "]" optional).
// pid is the rank, named "rank N" by metadata; tid is the Track, named by
// metadata too, and every event's "cat" is its track's name. Times are
// microseconds of steady_clock since start(), which the binding calls right
// after a barrier, so that the ranks of one host line up.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "nncomm/core/status.hpp"

namespace nncomm {

// A rank's rows in the viewer (tid): the engine's iterations as backward
// sees them (the framework's thread), gradients becoming ready, the engine
// thread's work, the list collectives, stall reports, and what a GPU does
// for the engine's buckets (device_trace.hpp).
enum class Track : int {
  kBackward = 1,
  kGradients = 2,
  kEngine = 3,
  kCollectives = 4,
  kStalls = 5,
  kDevice = 6,
  kAsync = 7, // the collectives of the queues of async_op=True calls
};

// What an event says in its "args" besides its name; fields left as they
// are here are left out.
struct TimelineArgs {
  int64_t iteration = -1;
  int64_t bucket = -1;
  int64_t tensor = -1;
  int64_t bytes = -1;
  const char *dtype = nullptr; // a dtype's name (dtype.hpp), or "mixed"
  // With `text`, under this key: "group" (collectives), "message" (stalls).
  const char *key = nullptr;
  std::string text;
};

class Timeline {
public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kFlushMilliseconds = 100;
  // Events one buffer holds (two are reserved while on: about 7 MB).
  static constexpr size_t kDefaultCapacity = size_t(1) << 15;

  // Whether events are being recorded.
  static bool on() { return on_.load(std::memory_order_relaxed); }
  // Starts recording into a new file at `path` as rank `rank`; times count
  // from now. `capacity`: events a buffer holds. Fails when a timeline is
  // being recorded, or the file cannot be created.
  static Status start(const std::string &path, int rank,
                      size_t capacity = kDefaultCapacity);
  // Stops recording, writes out every event recorded and closes the file;
  // fails when writing it failed. Nothing to do when not recording.
  static Status stop();

  // Records a complete event ("X") from `begin` to `end` on `track`.
  // `name`: a string that outlives the timeline (a literal); nullptr names
  // it by `args.tensor`. Recorded only while on, and only when it began
  // after start().
  static void complete(Track track, const char *name, Clock::time_point begin,
                       Clock::time_point end, TimelineArgs args);
  // Records an instant event ("i") now on `track`, named as above.
  static void instant(Track track, const char *name, TimelineArgs args);

private:
  static std::atomic<bool> on_;
};

// Records a complete event over its scope, when the timeline was on as it
// began (and the span is `wanted`); fill in args() (only when on()).
class TimelineSpan {
public:
  TimelineSpan(Track track, const char *name, bool wanted = true)
      : on_(wanted && Timeline::on()), track_(track), name_(name) {
    if (on_) {
      args_.emplace();
      begin_ = Timeline::Clock::now();
    }
  }
  ~TimelineSpan() {
    if (on_) {
      Timeline::complete(track_, name_, begin_, Timeline::Clock::now(),
                         std::move(*args_));
    }
  }
  TimelineSpan(const TimelineSpan &) = delete;
  TimelineSpan &operator=(const TimelineSpan &) = delete;

  bool on() const { return on_; }
  TimelineArgs &args() { return *args_; }

private:
  const bool on_;
  const Track track_;
  const char *const name_;
  Timeline::Clock::time_point begin_;
  std::optional<TimelineArgs> args_; // only while on: nothing to build off
};

} // namespace nncomm
