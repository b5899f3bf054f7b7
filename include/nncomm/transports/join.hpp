// Join: training on inputs of uneven length across ranks, as PyTorch's
// Join. Inside a join scope, a rank whose data ends leaves (Join::Leave)
// and from then on takes part in every operation the ranks still training
// make, with neutral data (zeros for sums, the identity of a comparison),
// until every rank has left. Nothing needs to know what they will call:
// each rank still training sends a leaver the description of each of its
// operations (a ShadowOp) on every MpiTransport, before or while it waits
// in it, and the leaver makes the same MPI calls from it.
//
// While nobody has left, a rank pays a lock per operation and one
// MPI_Iprobe per 16 tests of a wait that has not completed: no message, no
// extra collective. The descriptions of recent operations are kept (a history
// per transport) because a rank can run ahead of one that has left
// without noticing, in an operation that completes without it (the root
// of a broadcast): once the leaver's notice comes, with the number of
// operations it made on each transport, it is sent every one it missed.
//
// A leaver makes an operation only when every rank still training in it
// has described it (or has left before it): a broadcast rooted at a rank
// that has left, a new communicator, or a description that differs
// between ranks makes every rank fail instead, naming the problem.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nncomm/core/dtype.hpp"
#include "nncomm/core/status.hpp"

namespace nncomm {

class MpiTransport;

// An operation as a rank that has left must make it.
struct ShadowOp {
  enum class Kind : uint64_t {
    kAllreduce = 1,
    kReduce,
    kBcast,
    kAllgather,
    kReduceScatter,
    kAlltoallv,
    kAllgatherv,
    kBarrier,
    kAgree,     // same_everywhere on the transport's communicator
    kCheck,     // same_everywhere on its check_call() communicator
    kDuplicate, // a new communicator: refused while a rank has left
    kCount,     // Join::Count's round
    kUnite,     // unite(): bitwise OR of words
  };
  Kind kind = Kind::kBarrier;
  const char *name = nullptr; // a literal, naming it in flight records
  DType dt = DType::kInt64;
  uint64_t count = 0;
  int root = 0;
  int divisor = 1;
  float scale = 1.0f;
  uint64_t fingerprint = 0; // what the stall reports compare
  uint64_t phase = 0;
  // allgatherv: every rank's count; alltoallv: the sender's counts to each
  // rank (`counts`) and from each rank (`from`).
  std::vector<uint64_t> counts;
  std::vector<uint64_t> from;
};

class Join {
public:
  // Opens a scope over `root`'s ranks (every nncomm transport of those
  // ranks takes part). `throw_early`: a rank that leaves makes every rank
  // raise at the next Count round instead. Collective over `root`.
  static Status Open(MpiTransport &root, bool throw_early);
  // Whether a scope is open: one load, which every operation makes.
  static bool open();

  // Called by a transport as it begins `op`: keeps its description and
  // sends it to the ranks known to have left (and what they missed).
  static Status note(MpiTransport &t, const ShadowOp &op);
  // Called by waits that have not completed (every 16th call takes
  // messages): takes the other ranks' notices and sends the ranks that
  // left what they miss. Fails, marking the process broken, once a rank
  // reported that it cannot go on.
  static Status poll();

  // This rank's inputs ended after `steps` (the updates it made in the
  // scope): tells the others, then takes part in every operation they make
  // until every rank has left. Sets `*last` to the root rank that trained
  // longest (most steps, then most operations; the lowest of those alike),
  // and `*terminated` to whether the scope ended at a Count round that
  // found a rank gone (throw_early).
  static Status Leave(uint64_t steps, int *last, bool *terminated);
  // This rank leaves the scope with an error: every other rank's next
  // wait fails with `why`, naming this rank.
  static void Abandon(const std::string &why);
  // Ends the scope on this rank, after Leave (or Abandon). The ranks'
  // call checks start afresh: the ranks that left did not make the calls.
  static void Close();

  // A round counting the ranks of `root` still training (those that left
  // add 0): `*training`. Collective over the ranks still training.
  static Status Count(MpiTransport &root, int *training);
  // Whether world rank `world_rank` has left, as this rank knows.
  static bool left(int world_rank);

  // A transport is being destroyed: the scope forgets what it kept of it.
  static void withdraw(MpiTransport *t);

};

} // namespace nncomm
