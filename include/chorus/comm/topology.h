// Topology: which ranks of a group sit close together, and how fast the links between them are.
//
// Hierarchical collectives need two facts about a group: its partition into "groups" of ranks that
// share a fast link (the ranks of one host, of one vendor's devices, or an explicit list such as a
// cluster file's nodes), and the class of link between any two ranks. Each group's leader is its
// lowest rank. Groups are ordered by their lowest rank and list their members ascending, so every
// rank that builds a Topology from the same input gets the same value.
//
// A Topology is built from per-rank descriptors (exchanged through a Communicator by discover(),
// or given), or from explicit groups.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace chorus::comm {

class Communicator;

// Kinds of links, fastest first. kSharedMemory: two CPU workers of one host; kNvlink: two GPUs of
// one vendor joined by NVLink/xGMI; kPcie: devices of one host talking through host memory;
// kNetwork: different hosts.
enum class LinkClass { kSharedMemory, kNvlink, kPcie, kNetwork };

const char* toString(LinkClass link);               // "shm", "nvlink", "pcie", "network"
LinkClass parseLinkClass(const std::string& text);  // throws ConfigError

// Speed of one class of link. Value type.
struct LinkSpeed {
  double bandwidth = 0;  // bytes per second, per direction
  double latency = 0;    // seconds per message
};

// Nominal speeds per class (conservative figures: DDR memcpy, NVLink 3, PCIe 4 x16, 10 GbE);
// used unless measured or configured ones are given.
std::map<LinkClass, LinkSpeed> defaultLinkSpeeds();

// What one rank says about itself. Value type.
struct RankDescriptor {
  // Identifies the host (hostname, or anything equal exactly for ranks of one host).
  std::string host_id;
  // "cpu", "nvidia", "amd", ... Ranks of one host and one GPU vendor are joined by
  // `gpu_link`; CPU ranks of one host by shared memory.
  std::string vendor = "cpu";
  // Link between GPUs of one vendor on one host. Default: kPcie (NVLink must be declared; it
  // cannot be inferred from a descriptor).
  LinkClass gpu_link = LinkClass::kPcie;
  // The physical GPU this rank computes on, e.g. its PCI address (device::physicalGpuId); empty
  // for a CPU rank (the default).
  // Two ranks of one host that name the same GPU (emulated devices sharing one card) cannot join
  // one NCCL communicator, which refuses two ranks on one device: each becomes a group of its own.
  std::string device;

  // "host|vendor|link|device" (no '|' allowed in the fields), for the exchange.
  std::string encode() const;
  static RankDescriptor decode(const std::string& text);
};

// How discover()/fromDescriptors() partition the ranks. Whatever the grouping, a GPU rank that
// shares its GPU with another rank of its host is a group of its own (RankDescriptor::device).
enum class GroupBy {
  kHost,           // one group per host
  kVendor,         // one group per vendor (across hosts)
  kHostAndVendor,  // one group per (host, vendor)
};

const char* toString(GroupBy by);  // "host", "vendor", "host+vendor"
GroupBy parseGroupBy(const std::string& text);

// A partition of ranks 0..size-1 into groups, with link classes. Value type; immutable once built.
class Topology {
 public:
  // Exchanges descriptors over `comm` (collective: every member calls it, in the same order as
  // its other collectives) and groups them by `by`. Bounded by the communicator's deadline.
  static Topology discover(Communicator& comm, const RankDescriptor& self, GroupBy by,
                           std::map<LinkClass, LinkSpeed> speeds = defaultLinkSpeeds());
  // From every rank's descriptor (index = rank).
  static Topology fromDescriptors(const std::vector<RankDescriptor>& ranks, GroupBy by,
                                  std::map<LinkClass, LinkSpeed> speeds = defaultLinkSpeeds());
  // Explicit groups, e.g. from a cluster file: every rank in 0..size-1 exactly once. Ranks of one
  // group are joined by `intra`, ranks of different groups by `inter`. Throws ConfigError.
  static Topology fromGroups(std::vector<std::vector<int>> groups,
                             LinkClass intra = LinkClass::kPcie,
                             LinkClass inter = LinkClass::kNetwork,
                             std::map<LinkClass, LinkSpeed> speeds = defaultLinkSpeeds());
  // Every rank its own group (the flat topology).
  static Topology singletons(int size);

  int size() const { return static_cast<int>(group_of_.size()); }
  int numGroups() const { return static_cast<int>(groups_.size()); }
  const std::vector<std::vector<int>>& groups() const { return groups_; }
  const std::vector<int>& group(int index) const { return groups_.at(index); }
  int groupOf(int rank) const { return group_of_.at(rank); }
  // Position of `rank` within its group (0 for the leader).
  int localIndex(int rank) const { return local_index_.at(rank); }
  int leaderOf(int group) const { return groups_.at(group).front(); }
  std::vector<int> leaders() const;
  int largestGroup() const;
  // True when no group has more than one rank or there is only one group: hierarchy cannot help.
  bool isFlat() const { return numGroups() <= 1 || largestGroup() <= 1; }
  // Whether one native collective (NCCL, RCCL, Gloo or shm) can span every rank: all ranks of one
  // vendor ("cpu" counts as one) and no GPU shared by two ranks. When not, device-resident tensors
  // must cross between groups through host memory (the bridge, hierarchical_all_reduce.h).
  // Topologies from explicit groups (fromGroups, singletons) know no vendors and are native.
  bool native() const { return native_; }
  // The vendor of `rank` as its descriptor said ("cpu" for topologies from explicit groups).
  const std::string& vendorOf(int rank) const;

  LinkClass linkBetween(int a, int b) const;
  // The slowest link inside group `index` (kSharedMemory for a single rank), and among leaders.
  LinkClass intraLink(int index) const;
  LinkClass interLink() const;
  const LinkSpeed& speed(LinkClass link) const;

  // One line for logs: "6 ranks in 3 groups {0,1,2} {3,4} {5}; intra shm, inter network".
  std::string describe() const;
  // The same as a JSON object (groups, leaders, links with their speeds).
  std::string toJson() const;

 private:
  Topology() = default;
  void index();

  std::vector<std::vector<int>> groups_;
  std::vector<int> group_of_;
  std::vector<int> local_index_;
  // links_[a * size + b]: the class between ranks a and b.
  std::vector<LinkClass> links_;
  std::map<LinkClass, LinkSpeed> speeds_;
  std::vector<std::string> vendors_;  // by rank; all "cpu" for explicit groups
  bool native_ = true;
};

}  // namespace chorus::comm
