#include "nncomm/observability/timeline.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
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
                             Track::kStalls, Track::kDevice, Track::kAsync};

const char *track_name(Track track) {
  switch (track) {
  case Track::kBackward: return "backward";
  case Track::kGradients: return "gradients";
  case Track::kEngine: return "engine";
  case Track::kCollectives: return "collectives";
  case Track::kStalls: return "stalls";
  case Track::kDevice: return "device";
  case Track::kAsync: return "async";
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

// The writer formats with appends and integer conversions rather than
// printf: a step can record thousands of events, and the writer's thread
// shares the cores with training.
void append_int(std::string &out, int64_t value) {
  char digits[24];
  const auto done = std::to_chars(digits, digits + sizeof digits, value);
  out.append(digits, done.ptr);
}

// Microseconds to the nanosecond, from a duration that is not negative.
void append_micros(std::string &out, Clock::duration d) {
  const int64_t ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  append_int(out, ns / 1000);
  const int64_t fraction = ns % 1000;
  out += '.';
  out += static_cast<char>('0' + fraction / 100);
  out += static_cast<char>('0' + fraction / 10 % 10);
  out += static_cast<char>('0' + fraction % 10);
}

void append_string(std::string &out, const char *s) {
  out += '"';
  for (; *s != '\0'; ++s) {
    const unsigned char c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      const char *hex = "0123456789abcdef";
      out += "\\u00";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

void append_args(std::string &out, const TimelineArgs &a) {
  char separator = '{';
  const auto key = [&](const char *name) {
    out += separator;
    out += '"';
    out += name;
    out += "\":";
    separator = ',';
  };
  const auto number = [&](const char *name, int64_t value) {
    if (value >= 0) {
      key(name);
      append_int(out, value);
    }
  };
  number("iteration", a.iteration);
  number("bucket", a.bucket);
  number("tensor", a.tensor);
  number("bytes", a.bytes);
  if (a.dtype != nullptr) {
    key("dtype");
    append_string(out, a.dtype);
  }
  if (a.key != nullptr) {
    key(a.key);
    append_string(out, a.text.c_str());
  }
  if (separator == '{')
    out += '{';
  out += '}';
}

void append_event(std::string &out, const Recorder &r, const Event &e) {
  out += "{\"name\":";
  if (e.name != nullptr) {
    append_string(out, e.name);
  } else {
    out += '"';
    append_int(out, e.args.tensor);
    out += '"';
  }
  out += ",\"cat\":\"";
  out += track_name(e.track);
  out += "\",\"ph\":\"";
  out += e.phase;
  out += "\",\"ts\":";
  append_micros(out, e.begin - r.start);
  if (e.phase == 'X') {
    out += ",\"dur\":";
    append_micros(out, e.end - e.begin);
  } else {
    out += ",\"s\":\"t\"";
  }
  out += ",\"pid\":";
  append_int(out, r.rank);
  out += ",\"tid\":";
  append_int(out, static_cast<int>(e.track));
  out += ",\"args\":";
  append_args(out, e.args);
  out += "},\n";
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
  std::string text;
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
      append_event(text, r, e);
    std::fwrite(text.data(), 1, text.size(), r.file);
    text.clear();
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
  // The last event, and the array's end.
  std::string last = "{\"name\":\"timeline stopped\",\"cat\":\"timeline\","
                     "\"ph\":\"i\",\"s\":\"p\",\"ts\":";
  append_micros(last, Clock::now() - r.start);
  last += ",\"pid\":";
  append_int(last, r.rank);
  last += ",\"tid\":0,\"args\":{\"dropped_events\":";
  append_int(last, static_cast<int64_t>(dropped));
  last += "}}\n]\n";
  std::fwrite(last.data(), 1, last.size(), r.file);
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
