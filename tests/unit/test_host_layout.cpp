// The two-level all-reduce's pure logic (host_layout.hpp): which layouts
// of ranks on hosts it runs on under each NNCOMM_HIERARCHICAL, and how a
// piece is split into the shards the ranks of a host reduce across hosts.
#include <string>
#include <vector>

#include "check.hpp"
#include "nncomm/transports/host_layout.hpp"

using namespace nncomm;
using Mode = config::Hierarchical;

namespace {

// Whether `host_of` runs in two levels under `mode`, and why not where
// the setting asked for them.
std::string decided(const std::vector<int> &host_of, Mode mode) {
  std::string why_flat;
  const bool on = HostLayout::of(host_of).two_level(mode, &why_flat);
  return (on ? "two levels" : "flat") + why_flat;
}

} // namespace

TEST(host_layout_counts_hosts_and_equal_ranks_per_host) {
  const HostLayout two_by_two = HostLayout::of({0, 0, 2, 2});
  CHECK_EQ(two_by_two.hosts, 2);
  CHECK_EQ(two_by_two.ranks_per_host, 2);
  CHECK(two_by_two.blocked);
  // Hosts need not hold consecutive ranks.
  const HostLayout interleaved = HostLayout::of({0, 1, 0, 1, 0, 1});
  CHECK_EQ(interleaved.hosts, 2);
  CHECK_EQ(interleaved.ranks_per_host, 3);
  CHECK(!interleaved.blocked);
  // Consecutive, but not in blocks of the ranks per host.
  CHECK(!HostLayout::of({0, 1, 1, 0}).blocked);
  CHECK(HostLayout::of({4, 4, 0, 0, 2, 2}).blocked);
  CHECK_EQ(HostLayout::of({0, 0, 2}).ranks_per_host, 0);
  CHECK(!HostLayout::of({0, 0, 2}).blocked);
  CHECK_EQ(HostLayout::of({5}).hosts, 1);
}

TEST(host_layout_decides_two_levels_as_the_setting_says) {
  const std::vector<int> two_by_two = {0, 0, 2, 2};
  const std::vector<int> alternating = {0, 2, 0, 2};
  const std::vector<int> one_host = {0, 0, 0, 0};
  const std::vector<int> one_per_host = {0, 1, 2};
  const std::vector<int> unequal = {0, 0, 2};
  // In blocks, flat unless asked for.
  CHECK_EQ(decided(two_by_two, Mode::kAuto), "flat");
  CHECK_EQ(decided(two_by_two, Mode::kOn), "two levels");
  CHECK_EQ(decided(two_by_two, Mode::kOff), "flat");
  CHECK_EQ(decided(alternating, Mode::kAuto), "two levels");
  CHECK_EQ(decided(alternating, Mode::kOn), "two levels");
  CHECK_EQ(decided(alternating, Mode::kOff), "flat");
  for (Mode mode : {Mode::kAuto, Mode::kOn, Mode::kOff}) {
    CHECK_EQ(decided(one_host, mode), "flat");
    CHECK_EQ(decided(one_per_host, mode), "flat");
  }
  CHECK_EQ(decided(unequal, Mode::kAuto), "flat");
  CHECK_EQ(decided(unequal, Mode::kOff), "flat");
  // Only where the setting asked for two levels does it say why not.
  const std::string noted = decided(unequal, Mode::kOn);
  CHECK_CONTAINS(noted, "flatNNCOMM_HIERARCHICAL=1");
  CHECK_CONTAINS(noted, "different numbers of its ranks");
}

TEST(split_shards_covers_every_element_once_longest_first) {
  for (size_t count : {0, 1, 2, 3, 7, 8, 1000, 1001}) {
    for (int parts : {1, 2, 3, 4}) {
      std::vector<int> counts, offsets;
      split_shards(count, parts, &counts, &offsets);
      CHECK_EQ(counts.size(), static_cast<size_t>(parts));
      size_t next = 0;
      for (int i = 0; i < parts; ++i) {
        CHECK_EQ(static_cast<size_t>(offsets[i]), next);
        // Within one element of each other, the longer ones first.
        CHECK(counts[i] == counts[0] || counts[i] == counts[0] - 1);
        if (i > 0)
          CHECK(counts[i] <= counts[i - 1]);
        next += counts[i];
      }
      CHECK_EQ(next, count);
    }
  }
}
