// FlightRecorder: the last operations of each transport, kept for the
// moment a job hangs or its ranks diverge, as PyTorch's flight recorder
// keeps NCCL's collectives.
//
// Every transport (a group's, an engine's) owns one: a ring of the last
// config::flight_recorder_entries() operations (NNCOMM_FLIGHT_RECORDER,
// default 2000, 0: none), allocated once. An operation is recorded as the
// transport opens it (its position, kind, sizes, dtype, root, fingerprint,
// the nncomm call (OperationLabel) and the Python line that made it, where
// the binding gave one), then marked started, completed or failed: a few
// stores, no allocation, no lock (one thread at a time uses a transport).
//
// The rings of every transport of the process are written out together,
// one JSON file per world rank (nncomm-flight-<rank>.json) in
// config::flight_recorder_dir(): when a wait fails (timeout, ranks found in
// different calls, Ctrl-C), at a wait's first stall report, when the ranks
// make different calls, when the job is aborted, on a fatal signal
// (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT: best effort, then the
// previous handler), on SIGUSR1, and on request (dump()). A reader may
// meet a record being rewritten: each carries a version (a seqlock), so a
// record torn by a writer is left out rather than written half old, half
// new. python -m nncomm.flight reads the files of all ranks.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nncomm/core/dtype.hpp"
#include "nncomm/core/status.hpp"

namespace nncomm {

// An operation as a transport opens it: what the stall reports compare
// (`fingerprint`) and what it is made of. `kind`: a literal.
struct FlightOp {
  const char *kind;
  size_t count;
  DType dtype;
  int root;
  uint64_t fingerprint;
};

class FlightRecorder {
public:
  enum class State : uint8_t { kEnqueued = 0, kStarted, kCompleted, kFailed };

  // A ring of `entries` records (0: records nothing), by default
  // config::flight_recorder_entries(); registered with the process's
  // recorders, so that dumps find it.
  FlightRecorder();
  explicit FlightRecorder(size_t entries);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder &) = delete;
  FlightRecorder &operator=(const FlightRecorder &) = delete;

  // The group whose operations this ring holds, by world rank; also
  // numbers it among this process's rings of the same ranks, in creation
  // order (the same on every rank, creation being collective).
  void set_group(const std::vector<int> &world_ranks);

  // Operation `seq` opened (`phase` 1: the comparison of a call).
  void enqueue(uint64_t seq, const FlightOp &op, uint64_t phase);
  // Its MPI call was made; it completed; it failed.
  void started(uint64_t seq) { mark(seq, State::kStarted); }
  void completed(uint64_t seq) { mark(seq, State::kCompleted); }
  void failed(uint64_t seq) { mark(seq, State::kFailed); }

  // The process's world rank and size, named in its file and its name.
  static void set_process(int world_rank, int world_size);
  // The job, the same on every rank of it and on no other job's, so that
  // the files of jobs that wrote into one directory are told apart.
  static void set_job(uint64_t id);
  // The Python line making this thread's calls ("file:line in function"),
  // or null; it must outlive every recorder (the binding interns it).
  static void set_call_site(const char *site);
  // Turns recording on and off for the whole process (on by default),
  // for measuring its cost; a ring keeps what it holds.
  static void set_recording(bool on);

  // Writes every ring into `dir` (created if missing; "" is
  // config::flight_recorder_dir()), `reason` being why; `*path`: the file.
  static Status dump(const std::string &dir, const std::string &reason,
                     std::string *path);
  // dump() into the configured directory after a failure, saying so on
  // stderr; nothing when recording is off (NNCOMM_FLIGHT_RECORDER=0).
  static void dump_after(const std::string &reason);
  // dump_after(), once per process: a stall lasts while the wait does.
  static void dump_after_first_stall(const std::string &reason);
  // Dumps on SIGUSR1 (from a thread of its own) and, best effort, on fatal
  // signals, which then reach the handler installed before. Once per
  // process; nothing when NNCOMM_FLIGHT_RECORDER=0.
  static void install_signal_handlers();

  struct Record;

private:
  void mark(uint64_t seq, State state);
  friend struct Dumper;

  const size_t entries_;
  std::unique_ptr<Record[]> ring_;
  std::atomic<uint64_t> last_seq_{0};
  std::vector<int> world_ranks_;
  int channel_ = 0;
};

} // namespace nncomm
