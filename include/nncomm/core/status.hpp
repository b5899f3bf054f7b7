// Status: how the C++ core reports failure. The core never throws; every
// call that can fail returns a Status that the Cython layer turns into a
// Python exception (pyx/errors.pxi), so errors cross the nogil boundary as
// plain values.
#pragma once

#include <string>
#include <utility>

namespace nncomm {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1, // raised as ValueError
  // The transport (MPI, NCCL, CUDA) failed: raised as RuntimeError carrying
  // its own error string.
  kTransport = 2,
  kOutOfMemory = 3,     // raised as MemoryError
  kRuntimeError = 4,    // raised as RuntimeError
  // The ranks can no longer communicate: a wait timed out, or an earlier
  // one was interrupted or timed out. Raised as nncomm.CommunicatorError.
  kCommunicator = 5,
  // A wait was interrupted by a signal whose Python handler raised (Ctrl-C:
  // KeyboardInterrupt); the binding re-raises that exception.
  kInterrupted = 6,
  // A gradient held a NaN or an infinity on some rank (check_finite); the
  // engine says where (Engine::nonfinite()). Raised as
  // nncomm.NonFiniteGradientError.
  kNonFinite = 7,
};

class Status {
public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) {
    return Status(StatusCode::kInvalidArgument, std::move(msg));
  }
  static Status RuntimeError(std::string msg) {
    return Status(StatusCode::kRuntimeError, std::move(msg));
  }
  static Status OutOfMemory(std::string msg) {
    return Status(StatusCode::kOutOfMemory, std::move(msg));
  }
  static Status Communicator(std::string msg) {
    return Status(StatusCode::kCommunicator, std::move(msg));
  }
  static Status Interrupted() {
    return Status(StatusCode::kInterrupted, "interrupted");
  }
  static Status NonFinite(std::string msg) {
    return Status(StatusCode::kNonFinite, std::move(msg));
  }
  static Status Transport(std::string msg) {
    return Status(StatusCode::kTransport, std::move(msg));
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string &message() const { return message_; }

private:
  Status(StatusCode code, std::string msg)
      : code_(code), message_(std::move(msg)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

} // namespace nncomm

// Returns early from the enclosing function when `expr` is not OK.
#define NNCOMM_RETURN_IF_ERROR(expr)                                           \
  do {                                                                         \
    ::nncomm::Status _nncomm_status = (expr);                                  \
    if (!_nncomm_status.ok())                                                  \
      return _nncomm_status;                                                   \
  } while (0)
