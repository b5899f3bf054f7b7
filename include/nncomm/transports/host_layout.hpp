// HostLayout: how a transport's ranks lie on hosts, and what the two-level
// all-reduce (hierarchical_allreduce.hpp) makes of it: whether it runs, and
// which elements of a piece each rank of a host reduces across hosts. Pure
// functions of facts every rank holds alike (the all-gathered host of each
// rank), so every rank decides the same; no MPI, so tests/unit checks them.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "nncomm/observability/config.hpp"

namespace nncomm {

struct HostLayout {
  int hosts = 0;          // distinct hosts
  int ranks_per_host = 0; // the same on every host, else 0
  // Each host's ranks are consecutive (ranks 0..k-1 on one host, k..2k-1
  // on the next, ...): MPICH's flat all-reduce (recursive halving, nearest
  // ranks first) then already sends each element across hosts as seldom
  // as the two levels do (bench/hierarchical_bench.py).
  bool blocked = false;

  // The layout of ranks whose host is `host_of[r]` (any number, equal for
  // ranks that share a host).
  static HostLayout of(const std::vector<int> &host_of);

  // Whether all-reduces run in two levels under `mode`: kAuto where the
  // ranks span several hosts with the same number (> 1) on each, not in
  // blocks (where they are, the two levels cost time and save no bytes);
  // kOn wherever they span several hosts and can, setting `*why_flat`
  // where they cannot (the hosts hold different numbers of ranks); kOff
  // never. One rank per host runs flat under every mode: the two levels
  // would be the flat all-reduce plus two copies.
  bool two_level(config::Hierarchical mode, std::string *why_flat) const;
};

// Splits `count` elements into `parts` shards back to back, the first
// count % parts of them one element longer: shard i is counts[i] elements
// from offsets[i] on. Ints, as MPI's vector collectives take them; the
// caller keeps `count` within INT_MAX.
void split_shards(size_t count, int parts, std::vector<int> *counts,
                  std::vector<int> *offsets);

} // namespace nncomm
