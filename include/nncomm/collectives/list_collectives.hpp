// List collectives: nnabla's all_reduce / reduce / bcast over a list of
// arrays, all_gather and reduce_scatter, and Horovod's alltoall and
// allgather of blocks that differ in size, built on a Transport.
//
// Fusion: with `fuse` set (nnabla's inplace=False), arrays smaller than
// config::direct_bytes() are packed per dtype into the memory's fusion
// buffer and sent as one message per dtype, in order of first appearance,
// so every rank issues the same calls. A message that would hold one array
// is sent from the array instead, in its turn, unless the transport would
// scale it less precisely than packing (or it carries all_reduce's
// zeroing flags, below 16 KiB). Larger arrays, and all arrays without
// `fuse`, are communicated where they lie, one after another. The arrays
// live in `memory` (host or device: array_memory.hpp), and so do the
// messages.
//
// Arguments are validated by the binding before any rank communicates; that
// the ranks make the same call is checked here (Transport::check_call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "nncomm/core/array_memory.hpp"
#include "nncomm/core/dtype.hpp"
#include "nncomm/core/status.hpp"
#include "nncomm/observability/timeline.hpp"
#include "nncomm/transports/transport.hpp"

namespace nncomm {

struct ArrayRef {
  void *ptr;    // host memory; nullptr for a zeroing array (all_reduce only)
  size_t count; // elements
  DType dtype;
  // Names the array in the check that all ranks make the same call (the
  // same on every rank for the same array, e.g. a hash of its parameter's
  // name; 0: unnamed).
  uint64_t tag = 0;
};

// Gives writable memory for array `index` of an all_reduce list whose
// pointer was nullptr, once it is known that the result must be stored
// there. Returns nullptr on failure. A null `fn` says that no array of the
// call can be zeroing (device memory) on any rank.
struct Materializer {
  void *(*fn)(void *context, size_t index);
  void *context;
};

// A list collective on the timeline's `track` (timeline.hpp: the
// collectives, or the nonblocking ones' async track), over its scope: named
// `name`, with the bytes this rank sends in `sent`, their dtype ("mixed"
// where they differ) and its group's name. A call on no arrays (the
// callback's closing all_reduce of the gradients backward did not reach,
// usually none) is left off.
class CollectiveSpan {
public:
  CollectiveSpan(Track track, const char *name, const std::string &group,
                 const std::vector<ArrayRef> &sent)
      : CollectiveSpan(track, name, group, sent.data(), sent.size()) {}
  CollectiveSpan(Track track, const char *name, const std::string &group,
                 const ArrayRef &sent)
      : CollectiveSpan(track, name, group, &sent, 1) {}

private:
  CollectiveSpan(Track track, const char *name, const std::string &group,
                 const ArrayRef *sent, size_t count);
  TimelineSpan span_;
};

// Sums each array, times `scale`, over the transport's ranks (divided by
// their number with `division`).
// An array whose pointer is nullptr here counts as zeros; an array that is
// nullptr on every rank is skipped and stays untouched, as nnabla skips
// arrays that are still zeroing everywhere. Which arrays were written
// anywhere travels with the first message, so skipping costs no extra call
// (and, without a materializer, not at all).
Status all_reduce_list(Transport &transport, ArrayMemory &memory,
                       std::vector<ArrayRef> &arrays, bool division,
                       float scale, bool fuse, Materializer materialize);

// Sums each array into rank `root` (the mean with `division`); the arrays
// of the other ranks stay unchanged.
Status reduce_list(Transport &transport, ArrayMemory &memory,
                   const std::vector<ArrayRef> &arrays, int root, bool division,
                   bool fuse);

// Copies rank `root`'s arrays into every other rank's.
Status bcast_list(Transport &transport, ArrayMemory &memory,
                  const std::vector<ArrayRef> &arrays, int root, bool fuse);

// Rank r's `send` lands in recv[r]; or, with one `recv` array of
// size() * send.count elements, in its r-th block (with one rank, both
// readings agree).
Status all_gather(Transport &transport, ArrayMemory &memory,
                  const ArrayRef &send, const std::vector<ArrayRef> &recv);

// Rank r's `send`, of `counts[r]` elements, lands in recv[r]; or, with one
// `recv` array of the counts' sum, after those of the ranks before r.
// Every rank passes the same `counts`.
Status all_gatherv(Transport &transport, ArrayMemory &memory,
                   const ArrayRef &send, const std::vector<size_t> &counts,
                   const std::vector<ArrayRef> &recv);

// `send` holds `send_counts[s]` elements for each rank s, back to back in
// rank order; rank s receives them in its `recv`, after those of the ranks
// before this one. `recv_counts[r]` is what rank r sends here.
Status alltoall(Transport &transport, const ArrayRef &send,
                const std::vector<size_t> &send_counts, const ArrayRef &recv,
                const std::vector<size_t> &recv_counts);

// Rank r receives the sum (the mean with `division`) of every rank's
// send[r]; or, with one `send` array, of its r-th block.
Status reduce_scatter(Transport &transport, ArrayMemory &memory,
                      const std::vector<ArrayRef> &send, const ArrayRef &recv,
                      bool division);

} // namespace nncomm
