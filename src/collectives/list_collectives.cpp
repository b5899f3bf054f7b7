#include "nncomm/collectives/list_collectives.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "nncomm/core/bucket_plan.hpp"
#include "nncomm/observability/config.hpp"
#include "nncomm/core/fingerprint.hpp"
#include "nncomm/host/elementwise.hpp"
#include "nncomm/core/pack.hpp"
#include "nncomm/core/wait.hpp"

namespace nncomm {

namespace {

// Messages start on cache-line boundaries inside the fusion buffer.
size_t align_up(size_t bytes) { return (bytes + 63) & ~size_t(63); }

// One fused message: the arrays of one dtype, packed back to back
// (pack.hpp lays them out).
struct Message {
  DType dtype;
  size_t byte_offset = 0;     // inside the fusion buffer
  size_t count = 0;           // elements, trailing flags included
  std::vector<size_t> arrays; // positions in the caller's list
  // One array, which packing would only copy: it is sent where it lies,
  // in the message's turn (sent_in_place()); the flags, if the message
  // carries them, travel alone just before it.
  bool lone = false;
};

struct FusionPlan {
  std::vector<Message> messages;
  std::vector<size_t> direct; // arrays sent where they lie
  std::vector<size_t> empty;  // arrays of no elements: nothing to send
  size_t bytes = 0;
};

// A message of one array carrying the zeroing flags is lone only from this
// size on: the flags then need a message of their own, whose round trip
// (about 1.5 us at 2 ranks on shared memory, on the 2-core CI machine)
// costs more than copying smaller arrays into the buffer and back.
constexpr size_t kFlagsAloneBytes = 16 << 10;

// Splits `arrays` into fused messages, one per dtype, and arrays sent where
// they lie (all of them without `fuse`), as the bucket planner does for
// gradients, with buckets of unbounded size; arrays of no elements are
// listed apart (the planner leaves them out). With `flags`, the message of
// the first array's dtype goes first and ends with one flag element per
// array; it exists even when no array is fused into it.
FusionPlan make_fusion_plan(const std::vector<TensorSpec> &specs, bool fuse,
                            bool flags) {
  std::vector<size_t> order;
  FusionPlan plan;
  for (size_t i = 0; i < specs.size(); ++i) {
    order.push_back(i);
    if (specs[i].count == 0)
      plan.empty.push_back(i);
  }
  for (Bucket &b : plan_buckets(specs, order, SIZE_MAX, /*keep_dtype=*/true,
                                DType::kFloat32,
                                fuse ? config::direct_bytes() : 0)) {
    if (b.direct) {
      plan.direct.push_back(b.tensors[0]);
      continue;
    }
    Message m;
    m.dtype = b.dtype;
    m.count = b.count;
    m.arrays = std::move(b.tensors);
    m.lone = m.arrays.size() == 1;
    plan.messages.push_back(std::move(m));
  }
  if (flags && !specs.empty()) {
    const DType first = specs[0].dtype;
    auto it =
        std::find_if(plan.messages.begin(), plan.messages.end(),
                     [first](const Message &m) { return m.dtype == first; });
    if (it == plan.messages.end()) {
      Message m;
      m.dtype = first;
      plan.messages.insert(plan.messages.begin(), std::move(m));
    } else {
      std::rotate(plan.messages.begin(), it, it + 1);
    }
    Message &flagged = plan.messages[0];
    flagged.lone = flagged.lone && flagged.count * dtype_size(flagged.dtype) >=
                                       kFlagsAloneBytes;
    flagged.count += specs.size();
  }
  for (Message &m : plan.messages) {
    m.byte_offset = plan.bytes;
    plan.bytes += align_up(m.count * dtype_size(m.dtype));
  }
  return plan;
}

// make_fusion_plan for `arrays`. Training makes the same collectives on the
// same arrays every iteration, so this thread's last plan is kept and
// reused while the arrays' sizes and dtypes and the options are the same:
// planning allocates, and cost a steady-state call more than its MPI
// call's own overhead. Valid until this thread's next call.
const FusionPlan &plan_fusion(const std::vector<ArrayRef> &arrays, bool fuse,
                              bool flags) {
  struct Last {
    std::vector<TensorSpec> specs;
    bool fuse = false;
    bool flags = false;
    bool valid = false;
    FusionPlan plan;
  };
  thread_local Last last;
  bool same = last.valid && last.fuse == fuse && last.flags == flags &&
              last.specs.size() == arrays.size();
  for (size_t i = 0; same && i < arrays.size(); ++i) {
    same = last.specs[i].count == arrays[i].count &&
           last.specs[i].dtype == arrays[i].dtype;
  }
  if (!same) {
    last.valid = false;
    last.specs.clear();
    for (const ArrayRef &a : arrays)
      last.specs.push_back({a.count, a.dtype});
    last.plan = make_fusion_plan(last.specs, fuse, flags);
    last.fuse = fuse;
    last.flags = flags;
    last.valid = true;
  }
  return last.plan;
}

// The working memory of this thread's list collectives, kept from call to
// call as the plan is, so that a steady-state call allocates none (four
// allocations were 4 % of a one-float all_reduce's instructions). Each
// member is valid until this thread's next use of it.
struct Scratch {
  std::vector<PackSegment> segments;
  PackTable table;
  std::vector<char> flags;   // the zeroing flags, as the first message has them
  std::vector<char> written; // per array: written on some rank
};

Scratch &scratch() {
  thread_local Scratch s;
  return s;
}

// The layout of message `m` inside `buffer`; an array whose pointer is
// nullptr packs as zeros and is left out when unpacking.
Status message_table(const Message &m, const std::vector<ArrayRef> &arrays,
                     const PackTable **table) {
  Scratch &s = scratch();
  s.segments.clear();
  for (size_t i : m.arrays) {
    s.segments.push_back({arrays[i].ptr, arrays[i].dtype, 0, arrays[i].count});
  }
  *table = &s.table;
  return build_pack_table(s.segments.data(), s.segments.size(), m.dtype,
                          &s.table);
}

Status pack(ArrayMemory &memory, char *buffer, const Message &m,
            const std::vector<ArrayRef> &arrays, float scale) {
  const PackTable *table = nullptr;
  NNCOMM_RETURN_IF_ERROR(message_table(m, arrays, &table));
  return memory.pack(*table, buffer + m.byte_offset, m.dtype, scale);
}

Status unpack(ArrayMemory &memory, const char *buffer, const Message &m,
              const std::vector<ArrayRef> &arrays, int divisor) {
  const PackTable *table = nullptr;
  NNCOMM_RETURN_IF_ERROR(message_table(m, arrays, &table));
  return memory.unpack(*table, buffer + m.byte_offset, m.dtype, divisor);
}

Status reserve_plan(ArrayMemory &memory, const FusionPlan &plan,
                    char **buffer) {
  *buffer = nullptr;
  if (plan.bytes == 0)
    return Status::Ok();
  return memory.reserve(plan.bytes, buffer);
}

// A failure of this rank alone (memory) in a collective the other ranks are
// making: they cannot be told in-band, so the job is aborted (wait.hpp)
// rather than leaving them waiting.
Status fail_alone(Status status) {
  if (!status.ok())
    mark_broken(status.message(), true);
  return status;
}

// Gives a zeroing array real memory once its reduced result must be stored.
Status acquire(ArrayRef &a, size_t index, Materializer materialize) {
  if (a.ptr != nullptr)
    return Status::Ok();
  if (materialize.fn != nullptr)
    a.ptr = materialize.fn(materialize.context, index);
  if (a.ptr == nullptr) {
    return Status::InvalidArgument("nncomm could not get the memory of data[" +
                                   std::to_string(index) + "]");
  }
  return Status::Ok();
}

// Whether message `m` is sent where its one array lies: it is lone, and
// the transport scales it as packing would. The same on every rank.
bool sent_in_place(const Transport &transport, const Message &m, float scale,
                   int divisor) {
  return m.lone && transport.scales_precisely(m.dtype, scale, divisor);
}

// Reduces array `i` where it lies; zeroing here, it is given memory first,
// and its zeros are this rank's share of the sum.
Status all_reduce_in_place(Transport &transport, ArrayMemory &memory,
                           std::vector<ArrayRef> &arrays, size_t i,
                           float scale, int divisor,
                           Materializer materialize) {
  ArrayRef &a = arrays[i];
  if (a.ptr == nullptr) {
    NNCOMM_RETURN_IF_ERROR(fail_alone(acquire(a, i, materialize)));
    NNCOMM_RETURN_IF_ERROR(memory.zero(a.ptr, a.count * dtype_size(a.dtype)));
  }
  return transport.allreduce(a.ptr, a.count, a.dtype, scale, divisor);
}

// What every rank of a collective must agree on.
class CallSignature {
public:
  CallSignature(const char *collective, int root, int options) {
    fingerprint_.add(collective)
        .add(static_cast<uint64_t>(root))
        .add(static_cast<uint64_t>(options));
  }
  // For collectives whose sizes differ between ranks: only the dtype is
  // the same everywhere.
  CallSignature &add_dtype(DType dtype) {
    fingerprint_.add(static_cast<uint64_t>(dtype));
    return *this;
  }
  CallSignature &add_arrays(const std::vector<ArrayRef> &arrays) {
    fingerprint_.add(arrays.size());
    for (const ArrayRef &a : arrays) {
      fingerprint_.add(a.count).add(static_cast<uint64_t>(a.dtype)).add(a.tag);
      bytes_ += a.count * dtype_size(a.dtype);
    }
    return *this;
  }
  uint64_t value() const { return fingerprint_.value(); }
  // What the arrays added hold.
  size_t bytes() const { return bytes_; }

private:
  Fingerprint fingerprint_;
  size_t bytes_ = 0;
};

// Calls moving this much are compared every time: the comparison (one
// 16-byte all-reduce, about 13 µs on 2 ranks of the CI machine) costs 3 %
// or less of them (0.5-2 ms there), and a rank making one while another
// makes a smaller call is then stopped before their data meet (the stall
// reports tell their calls apart).
constexpr size_t kAlwaysComparedBytes = size_t(4) << 20;

// Fails on every rank unless all ranks make the same call, as
// config::check_calls() says (Transport::check_call).
Status check_same_call(Transport &transport,
                       const CallSignature &signature) {
  const config::CallChecks checks = config::check_calls();
  if (checks == config::CallChecks::kOff)
    return Status::Ok();
  return transport.check_call(signature.value(),
                              checks == config::CallChecks::kEvery ||
                                  signature.bytes() >= kAlwaysComparedBytes);
}

// Gathers into the memory's buffer (`gather(buffer)`), laid out as
// `blocks`, then copies block r into recv[r].
template <typename Gather>
Status gather_through_buffer(ArrayMemory &memory, const Blocks &blocks,
                             DType dt, const std::vector<ArrayRef> &recv,
                             Gather gather) {
  const size_t size = dtype_size(dt);
  char *buffer = nullptr;
  NNCOMM_RETURN_IF_ERROR(
      fail_alone(memory.reserve(blocks.extent() * size, &buffer)));
  NNCOMM_RETURN_IF_ERROR(gather(buffer));
  for (size_t r = 0; r < recv.size(); ++r) {
    NNCOMM_RETURN_IF_ERROR(memory.copy(recv[r].ptr,
                                       buffer + blocks.offsets[r] * size,
                                       blocks.counts[r] * size));
  }
  return Status::Ok();
}

} // namespace

CollectiveSpan::CollectiveSpan(Track track, const char *name,
                               const std::string &group,
                               const ArrayRef *sent, size_t count)
    : span_(track, name, count > 0) {
  if (!span_.on())
    return;
  TimelineArgs &args = span_.args();
  args.bytes = 0;
  for (size_t i = 0; i < count; ++i) {
    args.bytes += static_cast<int64_t>(sent[i].count *
                                       dtype_size(sent[i].dtype));
    if (sent[i].dtype != sent[0].dtype)
      args.dtype = "mixed";
  }
  if (args.dtype == nullptr)
    args.dtype = dtype_name(sent[0].dtype);
  args.key = "group";
  args.text = group;
}

Status all_reduce_list(Transport &transport, ArrayMemory &memory,
                       std::vector<ArrayRef> &arrays, bool division,
                       float scale, bool fuse, Materializer materialize) {
  OperationLabel label("all_reduce of %zu arrays", arrays.size());
  // Without a materializer no array can be zeroing, and no flag needs to
  // travel: on a device, reading the flags back would make the host wait
  // for the device. Every rank must decide alike.
  const bool zeroing = materialize.fn != nullptr;
  const int options = division + 2 * fuse + 4 * zeroing;
  NNCOMM_RETURN_IF_ERROR(check_same_call(
      transport, CallSignature("all_reduce", 0, options).add_arrays(arrays)));
  if (arrays.empty())
    return Status::Ok();
  const FusionPlan &plan = plan_fusion(arrays, fuse, /*flags=*/zeroing);
  char *buffer = nullptr;
  NNCOMM_RETURN_IF_ERROR(fail_alone(reserve_plan(memory, plan, &buffer)));
  const int divisor = division ? transport.size() : 1;
  for (const Message &m : plan.messages) {
    if (sent_in_place(transport, m, scale, divisor))
      continue;
    const ScalingSplit s = split_scaling(memory, m.dtype, scale, divisor);
    NNCOMM_RETURN_IF_ERROR(pack(memory, buffer, m, arrays, s.pack_scale));
  }

  std::vector<char> &written = scratch().written;
  written.assign(arrays.size(), true);
  if (zeroing) {
    const Message &first = plan.messages[0];
    // The flags travel in the first message, reduced unscaled: its scaling
    // must be the memory's.
    if (!memory.scales(first.dtype)) {
      return Status::InvalidArgument(
          "all_reduce: arrays that may be zeroing need memory that scales "
          "their dtype");
    }
    char *flags = buffer + first.byte_offset +
                  (first.count - arrays.size()) * dtype_size(first.dtype);
    const size_t flag_size = dtype_size(first.dtype);
    std::vector<char> &host_flags = scratch().flags;
    host_flags.resize(arrays.size() * flag_size);
    for (size_t i = 0; i < arrays.size(); ++i) {
      write_flag(&host_flags[i * flag_size], first.dtype,
                 arrays[i].ptr != nullptr);
    }
    NNCOMM_RETURN_IF_ERROR(
        memory.put(flags, host_flags.data(), host_flags.size()));
    if (sent_in_place(transport, first, scale, divisor)) {
      NNCOMM_RETURN_IF_ERROR(
          transport.allreduce(flags, arrays.size(), first.dtype));
    } else {
      NNCOMM_RETURN_IF_ERROR(transport.allreduce(buffer + first.byte_offset,
                                                 first.count, first.dtype));
    }
    NNCOMM_RETURN_IF_ERROR(
        memory.get(host_flags.data(), flags, host_flags.size()));
    for (size_t i = 0; i < arrays.size(); ++i)
      written[i] = read_flag(&host_flags[i * flag_size], first.dtype);
  }

  for (size_t k = 0; k < plan.messages.size(); ++k) {
    const Message &m = plan.messages[k];
    bool any_written = false;
    for (size_t i : m.arrays)
      any_written = any_written || written[i];
    if (!any_written)
      continue; // the same decision on every rank
    if (sent_in_place(transport, m, scale, divisor)) {
      NNCOMM_RETURN_IF_ERROR(all_reduce_in_place(
          transport, memory, arrays, m.arrays[0], scale, divisor,
          materialize));
      continue;
    }
    const ScalingSplit s = split_scaling(memory, m.dtype, scale, divisor);
    if (k > 0 || !zeroing) { // the first carried the flags, sent above
      NNCOMM_RETURN_IF_ERROR(
          transport.allreduce(buffer + m.byte_offset, m.count, m.dtype,
                              s.reduce_scale, s.reduce_divisor));
    }
    // Arrays written on no rank keep no memory and are left out.
    for (size_t i : m.arrays) {
      if (written[i])
        NNCOMM_RETURN_IF_ERROR(fail_alone(acquire(arrays[i], i, materialize)));
    }
    NNCOMM_RETURN_IF_ERROR(
        unpack(memory, buffer, m, arrays, s.unpack_divisor));
  }

  // Written somewhere, an empty array is no longer zeroing anywhere.
  for (size_t i : plan.empty) {
    if (zeroing && written[i])
      NNCOMM_RETURN_IF_ERROR(fail_alone(acquire(arrays[i], i, materialize)));
  }
  for (size_t i : plan.direct) {
    if (written[i]) {
      NNCOMM_RETURN_IF_ERROR(all_reduce_in_place(transport, memory, arrays, i,
                                                 scale, divisor, materialize));
    }
  }
  return Status::Ok();
}

Status reduce_list(Transport &transport, ArrayMemory &memory,
                   const std::vector<ArrayRef> &arrays, int root, bool division,
                   bool fuse) {
  OperationLabel label("reduce of %zu arrays to group rank %zu",
                       arrays.size(), static_cast<size_t>(root));
  NNCOMM_RETURN_IF_ERROR(check_same_call(
      transport,
      CallSignature("reduce", root, division + 2 * fuse).add_arrays(arrays)));
  const FusionPlan &plan = plan_fusion(arrays, fuse, /*flags=*/false);
  char *buffer = nullptr;
  NNCOMM_RETURN_IF_ERROR(fail_alone(reserve_plan(memory, plan, &buffer)));
  const bool is_root = transport.rank() == root;
  const int divisor = division ? transport.size() : 1;
  for (const Message &m : plan.messages) {
    if (sent_in_place(transport, m, 1.0f, divisor)) {
      const ArrayRef &a = arrays[m.arrays[0]];
      NNCOMM_RETURN_IF_ERROR(
          transport.reduce(a.ptr, a.count, a.dtype, root, divisor));
      continue;
    }
    const ScalingSplit s = split_scaling(memory, m.dtype, 1.0f, divisor);
    NNCOMM_RETURN_IF_ERROR(pack(memory, buffer, m, arrays, 1.0f));
    NNCOMM_RETURN_IF_ERROR(transport.reduce(buffer + m.byte_offset, m.count,
                                            m.dtype, root, s.reduce_divisor));
    if (is_root) {
      NNCOMM_RETURN_IF_ERROR(
          unpack(memory, buffer, m, arrays, s.unpack_divisor));
    }
  }
  for (size_t i : plan.direct) {
    const ArrayRef &a = arrays[i];
    NNCOMM_RETURN_IF_ERROR(
        transport.reduce(a.ptr, a.count, a.dtype, root, divisor));
  }
  return Status::Ok();
}

Status bcast_list(Transport &transport, ArrayMemory &memory,
                  const std::vector<ArrayRef> &arrays, int root, bool fuse) {
  OperationLabel label("bcast of %zu arrays from group rank %zu",
                       arrays.size(), static_cast<size_t>(root));
  NNCOMM_RETURN_IF_ERROR(
      check_same_call(transport,
                      CallSignature("bcast", root, fuse).add_arrays(arrays)));
  const FusionPlan &plan = plan_fusion(arrays, fuse, /*flags=*/false);
  char *buffer = nullptr;
  NNCOMM_RETURN_IF_ERROR(fail_alone(reserve_plan(memory, plan, &buffer)));
  const bool is_root = transport.rank() == root;
  for (const Message &m : plan.messages) {
    if (sent_in_place(transport, m, 1.0f, 1)) {
      const ArrayRef &a = arrays[m.arrays[0]];
      NNCOMM_RETURN_IF_ERROR(transport.bcast(a.ptr, a.count, a.dtype, root));
      continue;
    }
    if (is_root)
      NNCOMM_RETURN_IF_ERROR(pack(memory, buffer, m, arrays, 1.0f));
    NNCOMM_RETURN_IF_ERROR(
        transport.bcast(buffer + m.byte_offset, m.count, m.dtype, root));
    if (!is_root)
      NNCOMM_RETURN_IF_ERROR(unpack(memory, buffer, m, arrays, 1));
  }
  for (size_t i : plan.direct) {
    const ArrayRef &a = arrays[i];
    NNCOMM_RETURN_IF_ERROR(transport.bcast(a.ptr, a.count, a.dtype, root));
  }
  return Status::Ok();
}

Status all_gather(Transport &transport, ArrayMemory &memory,
                  const ArrayRef &send, const std::vector<ArrayRef> &recv) {
  OperationLabel label("all_gather of %zu elements per rank", send.count);
  NNCOMM_RETURN_IF_ERROR(
      check_same_call(transport,
                      CallSignature("all_gather", 0, 0).add_arrays({send})));
  if (recv.size() == 1) {
    return transport.allgather(send.ptr, recv[0].ptr, send.count, send.dtype);
  }
  return gather_through_buffer(
      memory, Blocks::packed(std::vector<size_t>(recv.size(), send.count)),
      send.dtype, recv, [&](char *buffer) {
        return transport.allgather(send.ptr, buffer, send.count, send.dtype);
      });
}

Status all_gatherv(Transport &transport, ArrayMemory &memory,
                   const ArrayRef &send, const std::vector<size_t> &counts,
                   const std::vector<ArrayRef> &recv) {
  OperationLabel label("all_gather of %zu elements from this rank",
                       send.count);
  NNCOMM_RETURN_IF_ERROR(check_same_call(
      transport, CallSignature("all_gatherv", 0, 0).add_dtype(send.dtype)));
  const Blocks blocks = Blocks::packed(counts);
  const auto gather = [&](void *into) {
    return transport.allgatherv(send.ptr, send.count, into, blocks,
                                send.dtype);
  };
  if (recv.size() == 1)
    return gather(recv[0].ptr);
  return gather_through_buffer(memory, blocks, send.dtype, recv, gather);
}

Status alltoall(Transport &transport, const ArrayRef &send,
                const std::vector<size_t> &send_counts, const ArrayRef &recv,
                const std::vector<size_t> &recv_counts) {
  OperationLabel label("alltoall of %zu elements from this rank",
                       send.count);
  NNCOMM_RETURN_IF_ERROR(check_same_call(
      transport, CallSignature("alltoall", 0, 0).add_dtype(send.dtype)));
  return transport.alltoallv(send.ptr, Blocks::packed(send_counts), recv.ptr,
                             Blocks::packed(recv_counts), send.dtype);
}

Status reduce_scatter(Transport &transport, ArrayMemory &memory,
                      const std::vector<ArrayRef> &send, const ArrayRef &recv,
                      bool division) {
  OperationLabel label("reduce_scatter of %zu elements per rank",
                       recv.count);
  NNCOMM_RETURN_IF_ERROR(check_same_call(
      transport,
      CallSignature("reduce_scatter", 0, division).add_arrays({recv})));
  const void *packed = send[0].ptr;
  if (send.size() > 1) {
    const size_t block = recv.count * dtype_size(recv.dtype);
    char *buffer = nullptr;
    NNCOMM_RETURN_IF_ERROR(
        fail_alone(memory.reserve(block * send.size(), &buffer)));
    for (size_t r = 0; r < send.size(); ++r) {
      NNCOMM_RETURN_IF_ERROR(
          memory.copy(buffer + r * block, send[r].ptr, block));
    }
    packed = buffer;
  }
  return transport.reduce_scatter(packed, recv.ptr, recv.count, recv.dtype,
                                  division ? transport.size() : 1);
}

} // namespace nncomm
