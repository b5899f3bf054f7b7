#include "nncomm/collectives/group.hpp"

#include <algorithm>
#include <cstdio>

#include "nncomm/core/fingerprint.hpp"
#include "nncomm/core/wait.hpp"
#include "nncomm/cuda/cuda_devices.hpp"

namespace nncomm {

namespace {

// `one` followed by `more`: every array of a call, for its device checks;
// none on the host, which has none to make.
std::vector<ArrayRef> joined(const Placement &where, const ArrayRef &one,
                             const std::vector<ArrayRef> &more) {
  if (!where.on_device)
    return {};
  std::vector<ArrayRef> all{one};
  all.insert(all.end(), more.begin(), more.end());
  return all;
}

} // namespace

Status check_on_device(const std::vector<ArrayRef> &arrays, int device) {
  for (const ArrayRef &a : arrays) {
    if (a.count == 0)
      continue;
    int here = 0;
    NNCOMM_RETURN_IF_ERROR(cuda_device_of(a.ptr, &here));
    if (device < 0)
      device = here;
    if (here != device) {
      char address[32];
      std::snprintf(address, sizeof address, "%p", a.ptr);
      return Status::InvalidArgument(
          std::string("a GPU array of this call (at ") + address +
          ") is on CUDA device " + std::to_string(here) +
          ", but the call communicates on device " + std::to_string(device) +
          " (the group's, where its first GPU collective was, or the "
          "call's first array's); a group's GPU arrays must all be on one "
          "device");
    }
  }
  return Status::Ok();
}

// Takes the group's turn for the rest of the scope, or returns.
#define NNCOMM_IN_TURN()                                                       \
  CollectiveQueue::Turn _nncomm_turn(queue_);                                  \
  NNCOMM_RETURN_IF_ERROR(_nncomm_turn.status())

Status Group::Create(MPI_Comm comm, std::unique_ptr<Group> *out) {
  std::unique_ptr<MpiTransport> transport;
  NNCOMM_RETURN_IF_ERROR(MpiTransport::Create(comm, &transport));
  out->reset(new Group(std::move(transport), "world"));
  return Status::Ok();
}

Status Group::create_subgroup(const std::vector<int> &ranks,
                              const std::string &name,
                              std::unique_ptr<Group> *out) {
  NNCOMM_IN_TURN();
  OperationLabel label("new_group of %zu ranks", ranks.size());
  // MPI_Comm_create_group has no nonblocking form, and ranks that pass it
  // different members (ranks computed from the rank) would wait in it for
  // each other until the job is killed: every rank first agrees on the
  // group (a bounded wait), its name too, so that groups made in another
  // order fail here rather than at their first collective.
  Fingerprint group;
  group.add(name.c_str());
  for (int r : ranks)
    group.add(static_cast<uint64_t>(r));
  bool same = false;
  NNCOMM_RETURN_IF_ERROR(transport_->agree(group.value(), &same));
  if (!same) {
    return Status::InvalidArgument(
        "new_group '" + name + "': the ranks passed different groups, or "
        "another rank's arguments were refused (this rank: " +
        rank_list(ranks) + "); every rank makes the same groups, named "
        "alike, with the same ranks, in the same order");
  }
  if (Join::open()) {
    // A rank that left took part in the agreement: every rank knows it left.
    for (int r : ranks) {
      const int world_rank = transport_->world_ranks()[r];
      if (Join::left(world_rank)) {
        return Status::InvalidArgument(
            "world rank " + std::to_string(world_rank) +
            " left comm.join() (its data ended): groups with it cannot be "
            "made until every rank has left the join");
      }
    }
  }
  if (std::find(ranks.begin(), ranks.end(), rank()) == ranks.end())
    return Status::Ok();
  std::unique_ptr<MpiTransport> transport;
  NNCOMM_RETURN_IF_ERROR(
      MpiTransport::CreateGroup(*transport_, ranks, &transport));
  out->reset(new Group(std::move(transport), name));
  return Status::Ok();
}

Status Group::open_join(bool throw_early) {
  NNCOMM_IN_TURN();
  return Join::Open(*transport_, throw_early);
}

Status Group::count_training(int *training) {
  NNCOMM_IN_TURN();
  return Join::Count(*transport_, training);
}

Status Group::duplicate_transport(std::unique_ptr<MpiTransport> *out,
                                  const char *role) {
  NNCOMM_IN_TURN();
  return transport_->Duplicate(out, role);
}

Status Group::duplicate(Track track, const char *role,
                        std::unique_ptr<Group> *out) {
  std::unique_ptr<MpiTransport> own;
  NNCOMM_RETURN_IF_ERROR(duplicate_transport(&own, role));
  out->reset(new Group(std::move(own), name_, track));
  return Status::Ok();
}

Status Group::create_engine(const Placement &where,
                            const std::vector<ArrayRef> &gradients,
                            size_t num_tensors, int poll_us,
                            std::unique_ptr<Engine> *out) {
  DevicePath *path = nullptr;
  if (where.on_device)
    NNCOMM_RETURN_IF_ERROR(device_path(gradients, &path));
  std::unique_ptr<MpiTransport> own;
  NNCOMM_RETURN_IF_ERROR(duplicate_transport(&own));
  if (path != nullptr) {
    return path->create_engine(std::move(own), where.stream, num_tensors,
                               poll_us, out);
  }
  std::unique_ptr<BucketRunner> runner(
      new BucketRunner(*own, std::unique_ptr<ArrayMemory>(new HostArrays)));
  out->reset(
      new Engine(std::move(own), std::move(runner), num_tensors, poll_us));
  return Status::Ok();
}

Status Group::device_path(const std::vector<ArrayRef> &arrays,
                          DevicePath **out) {
  std::lock_guard<std::mutex> lock(device_mutex_);
  if (!device_) {
    const void *on = nullptr;
    for (const ArrayRef &a : arrays) {
      if (a.count != 0) {
        on = a.ptr;
        break;
      }
    }
    std::unique_ptr<MpiTransport> host;
    NNCOMM_RETURN_IF_ERROR(duplicate_transport(&host));
    NNCOMM_RETURN_IF_ERROR(DevicePath::Open(std::move(host), on, &device_));
    advice_ = device_->advice();
    has_advice_ = !advice_.empty();
  }
  *out = device_.get();
  return Status::Ok();
}

Status Group::check_placed(const std::vector<ArrayRef> &arrays) {
  std::lock_guard<std::mutex> lock(device_mutex_);
  return check_on_device(arrays, device_ ? device_->device() : -1);
}

const char *Group::device_transport() {
  std::lock_guard<std::mutex> lock(device_mutex_);
  return device_ ? device_->transport_name() : "mpi";
}

size_t Group::bucket_floor_bytes() {
  std::lock_guard<std::mutex> lock(device_mutex_);
  return device_ ? device_->bucket_floor_bytes() : 0;
}

std::string Group::take_advice() {
  std::lock_guard<std::mutex> lock(device_mutex_);
  std::string advice;
  advice.swap(advice_);
  has_advice_ = false;
  return advice;
}

template <typename Sent, typename Body>
Status Group::run(const Placement &where, const char *op, const Sent &sent,
                  const std::vector<ArrayRef> &arrays,
                  const Body &collective) {
  if (!where.on_device) {
    NNCOMM_IN_TURN();
    CollectiveSpan traced(track_, op, name_, sent);
    return collective(*transport_, memory_);
  }
  DevicePath *path = nullptr;
  NNCOMM_RETURN_IF_ERROR(device_path(arrays, &path));
  return path->run(where.stream, arrays,
                   [&](Transport &t, ArrayMemory &m) {
    CollectiveSpan traced(track_, op, name_, sent);
    return collective(t, m);
  });
}

Status Group::barrier() {
  NNCOMM_IN_TURN();
  return transport_->barrier();
}

Status Group::agree(uint64_t value, bool *same, const char *what) {
  NNCOMM_IN_TURN();
  OperationLabel label(what);
  return transport_->agree(value, same);
}

Status Group::unite(uint64_t *words, size_t count, const char *what) {
  NNCOMM_IN_TURN();
  OperationLabel label(what);
  return transport_->unite(words, count);
}

Status Group::allgather(const void *send, void *recv, size_t count,
                        DType dt) {
  NNCOMM_IN_TURN();
  return transport_->allgather(send, recv, count, dt);
}

Status Group::all_reduce(const Placement &where,
                         std::vector<ArrayRef> &arrays, bool division,
                         float scale, bool fuse, Materializer materialize) {
  return run(where, "all_reduce", arrays, arrays,
             [&](Transport &t, ArrayMemory &m) {
    return all_reduce_list(t, m, arrays, division, scale, fuse, materialize);
  });
}

Status Group::reduce(const Placement &where,
                     const std::vector<ArrayRef> &arrays, int root,
                     bool division, bool fuse) {
  return run(where, "reduce", arrays, arrays,
             [&](Transport &t, ArrayMemory &m) {
    return reduce_list(t, m, arrays, root, division, fuse);
  });
}

Status Group::bcast(const Placement &where,
                    const std::vector<ArrayRef> &arrays, int root, bool fuse) {
  return run(where, "bcast", arrays, arrays,
             [&](Transport &t, ArrayMemory &m) {
    return bcast_list(t, m, arrays, root, fuse);
  });
}

Status Group::all_gather(const Placement &where, const ArrayRef &send,
                         const std::vector<ArrayRef> &recv) {
  return run(where, "all_gather", send, joined(where, send, recv),
             [&](Transport &t, ArrayMemory &m) {
    return nncomm::all_gather(t, m, send, recv);
  });
}

Status Group::all_gatherv(const Placement &where, const ArrayRef &send,
                          const std::vector<size_t> &counts,
                          const std::vector<ArrayRef> &recv) {
  return run(where, "all_gather", send, joined(where, send, recv),
             [&](Transport &t, ArrayMemory &m) {
    return nncomm::all_gatherv(t, m, send, counts, recv);
  });
}

Status Group::alltoall(const Placement &where, const ArrayRef &send,
                       const std::vector<size_t> &send_counts,
                       const ArrayRef &recv,
                       const std::vector<size_t> &recv_counts) {
  return run(where, "alltoall", send, joined(where, send, {recv}),
             [&](Transport &t, ArrayMemory &) {
    return nncomm::alltoall(t, send, send_counts, recv, recv_counts);
  });
}

Status Group::reduce_scatter(const Placement &where,
                             const std::vector<ArrayRef> &send,
                             const ArrayRef &recv, bool division) {
  return run(where, "reduce_scatter", send, joined(where, recv, send),
             [&](Transport &t, ArrayMemory &m) {
    return nncomm::reduce_scatter(t, m, send, recv, division);
  });
}

} // namespace nncomm
