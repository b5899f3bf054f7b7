#include "nncomm/transports/host_layout.hpp"

#include <map>

namespace nncomm {

HostLayout HostLayout::of(const std::vector<int> &host_of) {
  std::map<int, int> ranks_on;
  for (int host : host_of)
    ++ranks_on[host];
  HostLayout layout;
  layout.hosts = static_cast<int>(ranks_on.size());
  layout.ranks_per_host = ranks_on.empty() ? 0 : ranks_on.begin()->second;
  for (const auto &host : ranks_on) {
    if (host.second != layout.ranks_per_host)
      layout.ranks_per_host = 0;
  }
  const size_t k = static_cast<size_t>(layout.ranks_per_host);
  layout.blocked = k > 0;
  for (size_t r = 0; r < host_of.size() && layout.blocked; ++r)
    layout.blocked = host_of[r] == host_of[r - r % k];
  return layout;
}

bool HostLayout::two_level(config::Hierarchical mode,
                           std::string *why_flat) const {
  if (mode == config::Hierarchical::kOff || hosts < 2)
    return false;
  if (ranks_per_host == 0) {
    if (mode == config::Hierarchical::kOn) {
      *why_flat = "NNCOMM_HIERARCHICAL=1, but the " + std::to_string(hosts) +
                  " hosts of a group hold different numbers of its ranks: "
                  "its all-reduces run flat (the two levels need as many "
                  "ranks on each host)";
    }
    return false;
  }
  return ranks_per_host > 1 &&
         (mode == config::Hierarchical::kOn || !blocked);
}

void split_shards(size_t count, int parts, std::vector<int> *counts,
                  std::vector<int> *offsets) {
  counts->resize(parts);
  offsets->resize(parts);
  const size_t base = count / parts;
  const size_t longer = count % parts;
  size_t offset = 0;
  for (int i = 0; i < parts; ++i) {
    const size_t n = base + (static_cast<size_t>(i) < longer ? 1 : 0);
    (*counts)[i] = static_cast<int>(n);
    (*offsets)[i] = static_cast<int>(offset);
    offset += n;
  }
}

} // namespace nncomm
