#include "nncomm/observability/flight_recorder.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <thread>

#include "nncomm/core/wait.hpp"
#include "nncomm/observability/config.hpp"

namespace nncomm {

// One operation. `version` is 2 * seq once the record is whole, odd while
// it is being written, so that a dump running beside the writer (another
// thread, a signal) can tell a torn record; state and end time change
// alone afterwards.
struct FlightRecorder::Record {
  std::atomic<uint64_t> version{0};
  uint64_t seq = 0;
  uint64_t fingerprint = 0;
  const char *kind = nullptr;
  const char *label = nullptr; // OperationLabel's format, with its a and b
  size_t label_a = 0, label_b = 0;
  const char *site = nullptr;
  uint64_t count = 0;
  int root = 0;
  DType dtype = DType::kFloat32;
  uint8_t phase = 0;
  std::atomic<State> state{State::kEnqueued};
  int64_t enqueued_us = 0;
  std::atomic<int64_t> ended_us{0};
};

namespace {

std::atomic<bool> recording{true};
std::atomic<int> world_rank{-1};
std::atomic<int> world_size{0};
std::atomic<uint64_t> job{0}; // 0: not named yet
thread_local const char *call_site = nullptr;
// Why the first dump after a failure was written: later dumps (an abort's
// SIGABRT, a launcher's SIGUSR1) name it too, as they replace its file.
std::mutex first_reason_mutex;
char first_reason[512] = "";
std::atomic<bool> has_first_reason{false};

// The recorders alive in the process; dumps hold `registry_mutex`, so
// that none is destroyed under them.
std::mutex registry_mutex;
std::vector<FlightRecorder *> &registry() {
  static std::vector<FlightRecorder *> recorders;
  return recorders;
}
// Rings made so far per group, for their channel numbers.
std::map<std::vector<int>, int> &channels() {
  static std::map<std::vector<int>, int> made;
  return made;
}

int64_t now_us() {
  timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return int64_t(t.tv_sec) * 1000000 + t.tv_nsec / 1000;
}

const char *state_name(FlightRecorder::State s) {
  switch (s) {
  case FlightRecorder::State::kEnqueued: return "enqueued";
  case FlightRecorder::State::kStarted: return "started";
  case FlightRecorder::State::kCompleted: return "completed";
  case FlightRecorder::State::kFailed: return "failed";
  }
  return "unknown";
}

// JSON text written through a fixed buffer with write(2): nothing
// allocated, so that a signal handler can use it too.
class JsonFile {
public:
  explicit JsonFile(int fd) : fd_(fd) {}
  bool ok() const { return ok_; }

  void raw(const char *text) { put(text, std::strlen(text)); }

  void format(const char *fmt, ...) __attribute__((format(printf, 2, 3))) {
    char text[256];
    va_list args;
    va_start(args, fmt);
    const int n = std::vsnprintf(text, sizeof text, fmt, args);
    va_end(args);
    if (n > 0)
      put(text, std::min<size_t>(n, sizeof text - 1));
  }

  // A JSON string, or null.
  void string(const char *text) {
    if (text == nullptr) {
      raw("null");
      return;
    }
    raw("\"");
    for (const char *c = text; *c != '\0'; ++c) {
      if (*c == '"' || *c == '\\') {
        const char escaped[2] = {'\\', *c};
        put(escaped, 2);
      } else if (static_cast<unsigned char>(*c) < 0x20) {
        format("\\u%04x", static_cast<unsigned>(*c));
      } else {
        put(c, 1);
      }
    }
    raw("\"");
  }

  void flush() {
    size_t done = 0;
    while (ok_ && done < used_) {
      const ssize_t n = ::write(fd_, buffer_ + done, used_ - done);
      if (n < 0 && errno == EINTR)
        continue;
      ok_ = n > 0;
      done += n > 0 ? size_t(n) : 0;
    }
    used_ = 0;
  }

private:
  void put(const char *text, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if (used_ == sizeof buffer_)
        flush();
      buffer_[used_++] = text[i];
    }
  }

  int fd_;
  bool ok_ = true;
  size_t used_ = 0;
  char buffer_[16384];
};

// mkdir -p `dir`.
bool make_directories(const char *dir) {
  char path[4096];
  if (std::snprintf(path, sizeof path, "%s", dir) >= int(sizeof path))
    return false;
  for (char *p = path + 1; *p != '\0'; ++p) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
      return false;
    *p = '/';
  }
  return mkdir(path, 0777) == 0 || errno == EEXIST;
}

// Where dumps go unless a directory is named: NNCOMM_FLIGHT_RECORDER_DIR,
// else nncomm-flight-<uid> in the temporary directory (per user: another
// user's would not be writable).
void default_directory(char *out, size_t size) {
  const std::string &dir = config::flight_recorder_dir();
  if (!dir.empty()) {
    std::snprintf(out, size, "%s", dir.c_str());
    return;
  }
  const char *tmp = std::getenv("TMPDIR");
  std::snprintf(out, size, "%s/nncomm-flight-%u",
                tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                static_cast<unsigned>(getuid()));
}

} // namespace

// Writes the rings out; a friend of FlightRecorder, for its fields.
struct Dumper {
  static void group(JsonFile &out, const FlightRecorder &r, bool first) {
    out.raw(first ? "\n  {" : ",\n  {");
    out.raw("\"world_ranks\": [");
    for (size_t i = 0; i < r.world_ranks_.size(); ++i)
      out.format("%s%d", i ? ", " : "", r.world_ranks_[i]);
    const uint64_t last = r.last_seq_.load(std::memory_order_acquire);
    out.format("], \"channel\": %d, \"last_seq\": %llu, \"records\": [",
               r.channel_, static_cast<unsigned long long>(last));
    const uint64_t from = last > r.entries_ ? last - r.entries_ + 1 : 1;
    bool any = false;
    for (uint64_t seq = from; seq <= last && r.entries_ > 0; ++seq)
      any |= record(out, r.ring_[seq % r.entries_], seq, !any);
    out.raw(any ? "\n  ]}" : "]}");
  }

  // Writes the record of `seq` if `slot` holds it whole; true if written.
  static bool record(JsonFile &out, const FlightRecorder::Record &slot,
                     uint64_t seq, bool first) {
    const uint64_t version = slot.version.load(std::memory_order_acquire);
    if (version != 2 * seq)
      return false;
    FlightRecorder::Record copy;
    copy.fingerprint = slot.fingerprint;
    copy.kind = slot.kind;
    copy.label = slot.label;
    copy.label_a = slot.label_a;
    copy.label_b = slot.label_b;
    copy.site = slot.site;
    copy.count = slot.count;
    copy.root = slot.root;
    copy.dtype = slot.dtype;
    copy.phase = slot.phase;
    copy.enqueued_us = slot.enqueued_us;
    const FlightRecorder::State state = slot.state.load();
    const int64_t ended = slot.ended_us.load();
    std::atomic_thread_fence(std::memory_order_acquire);
    if (slot.version.load(std::memory_order_relaxed) != version)
      return false;
    char label[256] = "";
    if (copy.label != nullptr)
      std::snprintf(label, sizeof label, copy.label, copy.label_a,
                    copy.label_b);
    out.raw(first ? "\n   {" : ",\n   {");
    out.format("\"seq\": %llu, \"op\": ", static_cast<unsigned long long>(seq));
    out.string(copy.kind);
    out.raw(", \"call\": ");
    out.string(copy.label != nullptr ? label : nullptr);
    out.format(", \"phase\": \"%s\", \"count\": %llu, \"bytes\": %llu, "
               "\"dtype\": \"%s\", \"root\": %d, \"fingerprint\": "
               "\"%016llx\", \"state\": \"%s\", \"enqueued\": %lld.%06lld, "
               "\"ended\": ",
               copy.phase ? "call check" : "operation",
               static_cast<unsigned long long>(copy.count),
               static_cast<unsigned long long>(copy.count *
                                               dtype_size(copy.dtype)),
               dtype_name(copy.dtype), copy.root,
               static_cast<unsigned long long>(copy.fingerprint),
               state_name(state),
               static_cast<long long>(copy.enqueued_us / 1000000),
               static_cast<long long>(copy.enqueued_us % 1000000));
    if (ended != 0)
      out.format("%lld.%06lld", static_cast<long long>(ended / 1000000),
                 static_cast<long long>(ended % 1000000));
    else
      out.raw("null");
    out.raw(", \"site\": ");
    out.string(copy.site);
    out.raw("}");
    return true;
  }

  // Writes every ring into `dir`, the file's path into `path` (of `size`);
  // with `wait_for_lock` false (a signal handler), gives up where the
  // registry stays held. Allocates nothing itself.
  static bool write(const char *dir, const char *reason, char *path,
                    size_t size, bool wait_for_lock, const char **error) {
    std::unique_lock<std::mutex> lock(registry_mutex, std::defer_lock);
    if (wait_for_lock) {
      lock.lock();
    } else {
      for (int tries = 0; !lock.try_lock(); ++tries) {
        if (tries == 100) {
          *error = "the recorders were busy";
          return false;
        }
        const timespec pause{0, 1000000};
        nanosleep(&pause, nullptr);
      }
    }
    if (!make_directories(dir)) {
      *error = std::strerror(errno);
      return false;
    }
    const int rank = world_rank.load();
    if (rank >= 0)
      std::snprintf(path, size, "%s/nncomm-flight-%d.json", dir, rank);
    else
      std::snprintf(path, size, "%s/nncomm-flight-pid%d.json", dir,
                    static_cast<int>(getpid()));
    // Written aside and renamed: a reader never finds half a file.
    static std::atomic<int> dumps{0};
    char temporary[4200];
    std::snprintf(temporary, sizeof temporary, "%s.%d.%d.tmp", path,
                  static_cast<int>(getpid()), dumps.fetch_add(1));
    const int fd = ::open(temporary, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (fd < 0) {
      *error = std::strerror(errno);
      return false;
    }
    JsonFile out(fd);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    const int64_t now = now_us();
    out.format("{\"nncomm_flight_record\": 1, \"rank\": %d, "
               "\"world_size\": %d, \"host\": ",
               rank, world_size.load());
    out.string(host);
    out.format(", \"pid\": %d, \"time\": %lld.%06lld, \"reason\": ",
               static_cast<int>(getpid()),
               static_cast<long long>(now / 1000000),
               static_cast<long long>(now % 1000000));
    out.string(reason);
    if (const uint64_t named = job.load())
      out.format(", \"job\": \"%016llx\"",
                 static_cast<unsigned long long>(named));
    out.raw(", \"first_reason\": ");
    const bool earlier = has_first_reason.load(std::memory_order_acquire) &&
                         std::strcmp(first_reason, reason) != 0;
    out.string(earlier ? first_reason : nullptr);
    out.format(", \"entries\": %zu, \"groups\": [",
               config::flight_recorder_entries());
    bool first = true;
    for (const FlightRecorder *r : registry()) {
      group(out, *r, first);
      first = false;
    }
    out.raw("\n]}\n");
    out.flush();
    const bool written = out.ok();
    ::close(fd);
    if (!written || ::rename(temporary, path) != 0) {
      *error = written ? std::strerror(errno) : "the write failed";
      ::unlink(temporary);
      return false;
    }
    return true;
  }
};

FlightRecorder::FlightRecorder()
    : FlightRecorder(config::flight_recorder_entries()) {}

FlightRecorder::FlightRecorder(size_t entries)
    : entries_(entries), ring_(entries ? new Record[entries] : nullptr) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry().push_back(this);
}

FlightRecorder::~FlightRecorder() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto &all = registry();
  all.erase(std::find(all.begin(), all.end(), this));
}

void FlightRecorder::set_group(const std::vector<int> &world_ranks) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  world_ranks_ = world_ranks;
  channel_ = channels()[world_ranks]++;
}

void FlightRecorder::enqueue(uint64_t seq, const FlightOp &op,
                             uint64_t phase) {
  if (entries_ == 0 || !recording.load(std::memory_order_relaxed))
    return;
  Record &r = ring_[seq % entries_];
  r.version.store(2 * seq + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  r.seq = seq;
  r.fingerprint = op.fingerprint;
  r.kind = op.kind;
  const OperationLabel *label = OperationLabel::innermost();
  r.label = label != nullptr ? label->format() : nullptr;
  r.label_a = label != nullptr ? label->a() : 0;
  r.label_b = label != nullptr ? label->b() : 0;
  r.site = call_site;
  r.count = op.count;
  r.root = op.root;
  r.dtype = op.dtype;
  r.phase = static_cast<uint8_t>(phase);
  r.state.store(State::kEnqueued, std::memory_order_relaxed);
  r.enqueued_us = now_us();
  r.ended_us.store(0, std::memory_order_relaxed);
  r.version.store(2 * seq, std::memory_order_release);
  last_seq_.store(seq, std::memory_order_release);
}

void FlightRecorder::mark(uint64_t seq, State state) {
  if (entries_ == 0)
    return;
  Record &r = ring_[seq % entries_];
  // Not recorded (recording was off), or overwritten since.
  if (r.version.load(std::memory_order_relaxed) != 2 * seq)
    return;
  if (state == State::kCompleted || state == State::kFailed)
    r.ended_us.store(now_us(), std::memory_order_relaxed);
  r.state.store(state, std::memory_order_release);
}

void FlightRecorder::set_process(int rank, int size) {
  world_rank = rank;
  world_size = size;
}

void FlightRecorder::set_job(uint64_t id) { job = id; }

void FlightRecorder::set_call_site(const char *site) { call_site = site; }

void FlightRecorder::set_recording(bool on) { recording = on; }

Status FlightRecorder::dump(const std::string &dir, const std::string &reason,
                            std::string *path) {
  char directory[4096];
  if (dir.empty())
    default_directory(directory, sizeof directory);
  else
    std::snprintf(directory, sizeof directory, "%s", dir.c_str());
  char written[4200];
  const char *error = nullptr;
  if (!Dumper::write(directory, reason.c_str(), written, sizeof written, true,
                     &error)) {
    return Status::RuntimeError(std::string("could not write the flight "
                                            "record into ") +
                                directory + ": " + error);
  }
  *path = written;
  return Status::Ok();
}

namespace {

// Tells stderr where the record went, and how to read all ranks'.
void announce(const char *path, const char *dir) {
  std::fprintf(stderr,
               "nncomm: world rank %d wrote its flight record to %s "
               "(all ranks': python -m nncomm.flight %s)\n",
               world_rank.load(), path, dir);
  std::fflush(stderr);
}

} // namespace

void FlightRecorder::dump_after(const std::string &reason) {
  if (config::flight_recorder_entries() == 0)
    return;
  {
    std::lock_guard<std::mutex> lock(first_reason_mutex);
    if (!has_first_reason.load()) {
      std::snprintf(first_reason, sizeof first_reason, "%s", reason.c_str());
      has_first_reason.store(true, std::memory_order_release);
    }
  }
  char directory[4096];
  default_directory(directory, sizeof directory);
  std::string path;
  const Status status = dump(directory, reason, &path);
  if (status.ok()) {
    announce(path.c_str(), directory);
  } else {
    std::fprintf(stderr, "nncomm: %s\n", status.message().c_str());
    std::fflush(stderr);
  }
}

void FlightRecorder::dump_after_first_stall(const std::string &reason) {
  static std::atomic<bool> dumped{false};
  if (!dumped.exchange(true))
    dump_after(reason);
}

namespace {

// Fatal signals: each with the action installed before ours.
constexpr int kFatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
struct sigaction previous_fatal[sizeof kFatal / sizeof kFatal[0]];
struct sigaction previous_usr1;
int usr1_pipe[2] = {-1, -1};

void on_fatal(int sig, siginfo_t *info, void *) {
  static std::atomic<bool> dumping{false};
  size_t i = 0;
  while (kFatal[i] != sig)
    ++i;
  if (!dumping.exchange(true)) {
    char reason[64];
    std::snprintf(reason, sizeof reason, "fatal signal %d (%s)", sig,
                  strsignal(sig));
    char directory[4096];
    default_directory(directory, sizeof directory);
    char path[4200];
    const char *error = nullptr;
    if (Dumper::write(directory, reason, path, sizeof path, false, &error))
      announce(path, directory);
  }
  // The handler before ours takes it from here: a fault comes again as
  // the instruction is retried, a signal sent or raised is raised again.
  sigaction(sig, &previous_fatal[i], nullptr);
  if (info == nullptr || info->si_code <= 0 || sig == SIGABRT)
    raise(sig);
}

void on_usr1(int sig, siginfo_t *info, void *context) {
  const int saved = errno;
  const char byte = 1;
  if (::write(usr1_pipe[1], &byte, 1) < 0) {
    // The pipe is full: dumps are already due.
  }
  errno = saved;
  if (previous_usr1.sa_flags & SA_SIGINFO) {
    if (previous_usr1.sa_sigaction != nullptr)
      previous_usr1.sa_sigaction(sig, info, context);
  } else if (previous_usr1.sa_handler != SIG_DFL &&
             previous_usr1.sa_handler != SIG_IGN) {
    previous_usr1.sa_handler(sig);
  }
}

} // namespace

void FlightRecorder::install_signal_handlers() {
  static std::once_flag once;
  if (config::flight_recorder_entries() == 0)
    return;
  std::call_once(once, [] {
    struct sigaction action;
    std::memset(&action, 0, sizeof action);
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    action.sa_sigaction = on_fatal;
    for (size_t i = 0; i < sizeof kFatal / sizeof kFatal[0]; ++i)
      sigaction(kFatal[i], &action, &previous_fatal[i]);
    // A signal handler may not take locks: it wakes a thread that dumps.
    if (pipe2(usr1_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
      return;
    fcntl(usr1_pipe[0], F_SETFL, 0);
    std::thread([] {
      char byte;
      for (;;) {
        const ssize_t n = ::read(usr1_pipe[0], &byte, 1);
        if (n == 1)
          dump_after("SIGUSR1");
        else if (n < 0 && errno != EINTR)
          return;
      }
    }).detach();
    action.sa_sigaction = on_usr1;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGUSR1, &action, &previous_usr1);
  });
}

} // namespace nncomm
