#include "nncomm/timeline.hpp"

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace nncomm {

std::atomic<bool> Timeline::on_{false};

namespace {

using Clock = Timeline::Clock;

struct Event {
  Track track;
  char phase; // 'X' (complete) or 'i' (instant)
  const char *name;
  Clock::time_point begin, end;
  TimelineArgs args;
};

constexpr Track kTracks[] = {Track::kBackward, Track::kGradients,
                             Track::kEngine, Track::kCollectives,
                             Track::kStalls};

const char *track_name(Track track) {
  switch (track) {
  case Track::kBackward: return "backward";
  case Track::kGradients: return "gradients";
  case Track::kEngine: return "engine";
  case Track::kCollectives: return "collectives";
  case Track::kStalls: return "stalls";
  }
  return "unknown";
}

// The timeline's state. It lives as long as the process, since any thread
// may record at any time, stop() or not.
struct Recorder {
  std::mutex mutex; // guards the members up to `start`
  std::condition_variable wake; // the writer: stop, or a buffer half full
  bool running = false;
  bool stopping = false;
  std::vector<Event> pending; // reserved: recording never allocates
  size_t capacity = 0;
  size_t half = 1;
  uint64_t dropped = 0;
  Clock::time_point start;
  // Set by start() before the writer starts, read by it, and by stop()
  // after it ended.
  int rank = 0;
  std::string path;
  std::FILE *file = nullptr;
  std::thread writer;
};

Recorder &recorder() {
  static Recorder *const r = new Recorder;
  return *r;
}

// Serialises start() and stop().
std::mutex control;

double micros(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

void put_string(std::FILE *f, const char *s) {
  std::fputc('"', f);
  for (; *s != '\0'; ++s) {
    const unsigned char c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      std::fputc('\\', f);
      std::fputc(c, f);
    } else if (c < 0x20) {
      std::fprintf(f, "\\u%04x", c);
    } else {
      std::fputc(c, f);
    }
  }
  std::fputc('"', f);
}

void put_args(std::FILE *f, const TimelineArgs &a) {
  const char *separator = "";
  const auto number = [&](const char *key, int64_t value) {
    if (value < 0)
      return;
    std::fprintf(f, "%s\"%s\":%lld", separator, key,
                 static_cast<long long>(value));
    separator = ",";
  };
  std::fputc('{', f);
  number("iteration", a.iteration);
  number("bucket", a.bucket);
  number("tensor", a.tensor);
  number("bytes", a.bytes);
  if (a.dtype != nullptr) {
    std::fprintf(f, "%s\"dtype\":", separator);
    put_string(f, a.dtype);
    separator = ",";
  }
  if (a.key != nullptr) {
    std::fprintf(f, "%s\"%s\":", separator, a.key);
    put_string(f, a.text.c_str());
  }
  std::fputc('}', f);
}

void put_event(const Recorder &r, const Event &e) {
  std::FILE *f = r.file;
  std::fputs("{\"name\":", f);
  if (e.name != nullptr)
    put_string(f, e.name);
  else
    std::fprintf(f, "\"%lld\"", static_cast<long long>(e.args.tensor));
  std::fprintf(f, ",\"cat\":\"%s\",\"ph\":\"%c\",\"ts\":%.3f,",
               track_name(e.track), e.phase, micros(e.begin - r.start));
  if (e.phase == 'X')
    std::fprintf(f, "\"dur\":%.3f,", micros(e.end - e.begin));
  else
    std::fputs("\"s\":\"t\",", f);
  std::fprintf(f, "\"pid\":%d,\"tid\":%d,\"args\":", r.rank,
               static_cast<int>(e.track));
  put_args(f, e.args);
  std::fputs("},\n", f);
}

// The names and order of the rank's process and tracks.
void put_metadata(const Recorder &r) {
  const char *line = "{\"name\":\"%s\",\"ph\":\"M\",\"ts\":0,\"pid\":%d,"
                     "\"tid\":%d,\"args\":{\"%s\":";
  std::fprintf(r.file, line, "process_name", r.rank, 0, "name");
  std::fprintf(r.file, "\"rank %d\"}},\n", r.rank);
  std::fprintf(r.file, line, "process_sort_index", r.rank, 0, "sort_index");
  std::fprintf(r.file, "%d}},\n", r.rank);
  for (Track track : kTracks) {
    const int tid = static_cast<int>(track);
    std::fprintf(r.file, line, "thread_name", r.rank, tid, "name");
    std::fprintf(r.file, "\"%s\"}},\n", track_name(track));
    std::fprintf(r.file, line, "thread_sort_index", r.rank, tid,
                 "sort_index");
    std::fprintf(r.file, "%d}},\n", tid);
  }
}

void write_loop(Recorder &r) {
  std::vector<Event> batch;
  batch.reserve(r.capacity);
  std::fputs("[\n", r.file);
  put_metadata(r);
  std::unique_lock<std::mutex> lock(r.mutex);
  for (;;) {
    r.wake.wait_for(lock,
                    std::chrono::milliseconds(Timeline::kFlushMilliseconds),
                    [&] { return r.stopping || r.pending.size() >= r.half; });
    batch.swap(r.pending);
    const bool last = r.stopping;
    lock.unlock();
    for (const Event &e : batch)
      put_event(r, e);
    batch.clear();
    // What a job that dies leaves is readable up to here.
    std::fflush(r.file);
    if (last)
      return;
    lock.lock();
  }
}

void record(Event &&e) {
  Recorder &r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  // An event that began before start() belongs to no timeline's clock.
  if (!r.running || e.begin < r.start)
    return;
  if (r.pending.size() >= r.capacity) {
    ++r.dropped;
    return;
  }
  r.pending.push_back(std::move(e));
  if (r.pending.size() == r.half)
    r.wake.notify_one();
}

} // namespace

Status Timeline::start(const std::string &path, int rank, size_t capacity) {
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> serial(control);
  Recorder &r = recorder();
  if (r.writer.joinable()) {
    return Status::RuntimeError("a timeline is already being recorded, to " +
                                r.path + "; stop it first");
  }
  if (capacity == 0)
    return Status::InvalidArgument("a timeline needs room for events");
  std::FILE *file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    return Status::InvalidArgument("cannot create the timeline file " + path +
                                   ": " + std::strerror(errno));
  }
  r.rank = rank;
  r.path = path;
  r.file = file;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    r.pending.clear();
    r.pending.reserve(capacity);
    r.capacity = capacity;
    r.half = std::max<size_t>(capacity / 2, 1);
    r.dropped = 0;
    r.start = now;
    r.running = true;
    r.stopping = false;
  }
  r.writer = std::thread(write_loop, std::ref(r));
  on_.store(true, std::memory_order_relaxed);
  return Status::Ok();
}

Status Timeline::stop() {
  std::lock_guard<std::mutex> serial(control);
  Recorder &r = recorder();
  if (!r.writer.joinable())
    return Status::Ok();
  on_.store(false, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    r.running = false;
    r.stopping = true;
  }
  r.wake.notify_all();
  r.writer.join();
  uint64_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    dropped = r.dropped;
    std::vector<Event>().swap(r.pending);
  }
  std::fprintf(r.file,
               "{\"name\":\"timeline stopped\",\"cat\":\"timeline\","
               "\"ph\":\"i\",\"s\":\"p\",\"ts\":%.3f,\"pid\":%d,\"tid\":0,"
               "\"args\":{\"dropped_events\":%llu}}\n]\n",
               micros(Clock::now() - r.start), r.rank,
               static_cast<unsigned long long>(dropped));
  const bool written = std::ferror(r.file) == 0;
  const bool closed = std::fclose(r.file) == 0;
  r.file = nullptr;
  if (dropped > 0) {
    std::fprintf(stderr,
                 "nncomm: the timeline %s dropped %llu events, recorded "
                 "faster than they could be written\n",
                 r.path.c_str(), static_cast<unsigned long long>(dropped));
  }
  if (!written || !closed) {
    return Status::RuntimeError("writing the timeline file " + r.path +
                                " failed (is the disk full?)");
  }
  return Status::Ok();
}

void Timeline::complete(Track track, const char *name,
                        Clock::time_point begin, Clock::time_point end,
                        TimelineArgs args) {
  if (on())
    record(Event{track, 'X', name, begin, end, std::move(args)});
}

void Timeline::instant(Track track, const char *name, TimelineArgs args) {
  if (!on())
    return;
  const Clock::time_point now = Clock::now();
  record(Event{track, 'i', name, now, now, std::move(args)});
}

} // namespace nncomm
