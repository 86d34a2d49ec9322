#include "chorus/comm/topology.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "chorus/comm/communicator.h"
#include "chorus/core/error.h"
#include "chorus/core/name_table.h"

namespace chorus::comm {
namespace {

constexpr char kSeparator = '|';

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, separator)) parts.push_back(part);
  if (!text.empty() && text.back() == separator) parts.emplace_back();
  return parts;
}

// Ranks of each distinct key, keys ordered by their lowest rank.
std::vector<std::vector<int>> groupByKey(const std::vector<std::string>& keys) {
  std::vector<std::vector<int>> groups;
  std::map<std::string, size_t> index_of;
  for (int rank = 0; rank < static_cast<int>(keys.size()); ++rank) {
    auto found = index_of.find(keys[rank]);
    if (found == index_of.end()) {
      found = index_of.emplace(keys[rank], groups.size()).first;
      groups.emplace_back();
    }
    groups[found->second].push_back(rank);
  }
  return groups;
}

// The GPU ranks that name the same GPU of their host as another rank.
std::set<int> ranksSharingAGpu(const std::vector<RankDescriptor>& ranks) {
  std::map<std::string, std::vector<int>> by_gpu;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r)
    if (!ranks[r].device.empty())
      by_gpu[ranks[r].host_id + kSeparator + ranks[r].device].push_back(r);
  std::set<int> sharing;
  for (const auto& [gpu, members] : by_gpu)
    if (members.size() > 1) sharing.insert(members.begin(), members.end());
  return sharing;
}

LinkClass descriptorLink(const RankDescriptor& a, const RankDescriptor& b) {
  if (a.host_id != b.host_id) return LinkClass::kNetwork;
  if (a.vendor == "cpu" && b.vendor == "cpu") return LinkClass::kSharedMemory;
  if (a.vendor == b.vendor)
    return a.gpu_link == LinkClass::kNvlink && b.gpu_link == LinkClass::kNvlink ? LinkClass::kNvlink
                                                                                : LinkClass::kPcie;
  return LinkClass::kPcie;  // different vendors on one host meet in host memory
}

// The slower of two links: higher enum value, since the classes are ordered fastest first.
LinkClass slower(LinkClass a, LinkClass b) { return std::max(a, b); }

constexpr NamedValue<LinkClass> kLinkClassNames[] = {{LinkClass::kSharedMemory, "shm"},
                                                     {LinkClass::kNvlink, "nvlink"},
                                                     {LinkClass::kPcie, "pcie"},
                                                     {LinkClass::kNetwork, "network"}};

constexpr NamedValue<GroupBy> kGroupByNames[] = {{GroupBy::kHost, "host"},
                                                 {GroupBy::kVendor, "vendor"},
                                                 {GroupBy::kHostAndVendor, "host+vendor"}};

}  // namespace

const char* toString(LinkClass link) { return nameOf(kLinkClassNames, link); }

LinkClass parseLinkClass(const std::string& text) {
  return parseNamed(kLinkClassNames, text, "link class");
}

std::map<LinkClass, LinkSpeed> defaultLinkSpeeds() {
  return {
      {LinkClass::kSharedMemory, {10e9, 1e-6}},
      {LinkClass::kNvlink, {150e9, 5e-6}},
      {LinkClass::kPcie, {12e9, 10e-6}},
      {LinkClass::kNetwork, {1.25e9, 50e-6}},
  };
}

std::string RankDescriptor::encode() const {
  for (const std::string* field : {&host_id, &vendor, &device})
    if (field->find(kSeparator) != std::string::npos)
      CHORUS_THROW(ConfigError, "rank descriptor field '", *field, "' contains '", kSeparator, "'");
  return host_id + kSeparator + vendor + kSeparator + toString(gpu_link) + kSeparator + device;
}

RankDescriptor RankDescriptor::decode(const std::string& text) {
  const auto parts = split(text, kSeparator);
  if (parts.size() != 4) CHORUS_THROW(ProtocolError, "malformed rank descriptor '", text, "'");
  RankDescriptor descriptor;
  descriptor.host_id = parts[0];
  descriptor.vendor = parts[1];
  descriptor.gpu_link = parseLinkClass(parts[2]);
  descriptor.device = parts[3];
  return descriptor;
}

const char* toString(GroupBy by) { return nameOf(kGroupByNames, by); }

GroupBy parseGroupBy(const std::string& text) {
  return parseNamed(kGroupByNames, text, "grouping");
}

Topology Topology::discover(Communicator& comm, const RankDescriptor& self, GroupBy by,
                            std::map<LinkClass, LinkSpeed> speeds) {
  // Two gathers: the lengths, then the text of every rank (uneven).
  const std::string mine = self.encode();
  at::Tensor length = at::full({1}, static_cast<int64_t>(mine.size()), at::kLong);
  at::Tensor lengths = at::empty({comm.size()}, at::kLong);
  comm.allGather(length, lengths).wait();
  std::vector<int64_t> counts(lengths.data_ptr<int64_t>(),
                              lengths.data_ptr<int64_t>() + comm.size());
  at::Tensor text = at::empty({static_cast<int64_t>(mine.size())}, at::kByte);
  std::copy(mine.begin(), mine.end(), text.data_ptr<uint8_t>());
  int64_t total = 0;
  for (int64_t count : counts) total += count;
  at::Tensor all = at::empty({total}, at::kByte);
  comm.allGatherV(text, all, counts).wait();
  std::vector<RankDescriptor> ranks;
  const char* bytes = reinterpret_cast<const char*>(all.data_ptr<uint8_t>());
  int64_t offset = 0;
  for (int64_t count : counts) {
    ranks.push_back(RankDescriptor::decode(std::string(bytes + offset, count)));
    offset += count;
  }
  return fromDescriptors(ranks, by, std::move(speeds));
}

Topology Topology::fromDescriptors(const std::vector<RankDescriptor>& ranks, GroupBy by,
                                   std::map<LinkClass, LinkSpeed> speeds) {
  if (ranks.empty()) CHORUS_THROW(ConfigError, "topology: no ranks");
  std::vector<std::string> keys;
  const std::set<int> sharing = ranksSharingAGpu(ranks);
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    const RankDescriptor& rank = ranks[r];
    if (sharing.count(r))
      keys.push_back(std::string(1, kSeparator) + std::to_string(r));  // no other key starts so
    else if (by == GroupBy::kHost)
      keys.push_back(rank.host_id);
    else if (by == GroupBy::kVendor)
      keys.push_back(rank.vendor);
    else
      keys.push_back(rank.host_id + kSeparator + rank.vendor);
  }
  Topology topology;
  topology.groups_ = groupByKey(keys);
  for (const auto& rank : ranks) {
    topology.vendors_.push_back(rank.vendor);
    if (rank.vendor != ranks.front().vendor) topology.native_ = false;
  }
  if (!sharing.empty()) topology.native_ = false;
  topology.speeds_ = std::move(speeds);
  const size_t size = ranks.size();
  topology.links_.resize(size * size);
  for (size_t a = 0; a < size; ++a)
    for (size_t b = 0; b < size; ++b)
      topology.links_[a * size + b] =
          a == b ? LinkClass::kSharedMemory : descriptorLink(ranks[a], ranks[b]);
  topology.index();
  return topology;
}

Topology Topology::fromGroups(std::vector<std::vector<int>> groups, LinkClass intra,
                              LinkClass inter, std::map<LinkClass, LinkSpeed> speeds) {
  int size = 0;
  for (auto& group : groups) {
    if (group.empty()) CHORUS_THROW(ConfigError, "topology: empty group");
    std::sort(group.begin(), group.end());
    size += static_cast<int>(group.size());
  }
  std::vector<int> seen(size, 0);
  for (const auto& group : groups)
    for (int rank : group) {
      if (rank < 0 || rank >= size || seen[rank]++)
        CHORUS_THROW(ConfigError, "topology: groups must hold every rank 0..", size - 1,
                     " exactly once (rank ", rank, ")");
    }
  std::sort(groups.begin(), groups.end(),
            [](const auto& a, const auto& b) { return a.front() < b.front(); });
  Topology topology;
  topology.groups_ = std::move(groups);
  topology.speeds_ = std::move(speeds);
  topology.vendors_.assign(size, "cpu");
  topology.group_of_.assign(size, 0);
  for (size_t g = 0; g < topology.groups_.size(); ++g)
    for (int rank : topology.groups_[g]) topology.group_of_[rank] = static_cast<int>(g);
  topology.links_.resize(static_cast<size_t>(size) * size);
  for (int a = 0; a < size; ++a)
    for (int b = 0; b < size; ++b)
      topology.links_[a * size + b] = a == b ? LinkClass::kSharedMemory
                                      : topology.group_of_[a] == topology.group_of_[b] ? intra
                                                                                       : inter;
  topology.index();
  return topology;
}

Topology Topology::singletons(int size) {
  if (size < 1) CHORUS_THROW(ConfigError, "topology: size must be >= 1");
  std::vector<std::vector<int>> groups;
  for (int rank = 0; rank < size; ++rank) groups.push_back({rank});
  return fromGroups(std::move(groups));
}

void Topology::index() {
  int size = 0;
  for (const auto& group : groups_) size += static_cast<int>(group.size());
  group_of_.assign(size, 0);
  local_index_.assign(size, 0);
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t i = 0; i < groups_[g].size(); ++i) {
      group_of_[groups_[g][i]] = static_cast<int>(g);
      local_index_[groups_[g][i]] = static_cast<int>(i);
    }
}

std::vector<int> Topology::leaders() const {
  std::vector<int> leaders;
  for (const auto& group : groups_) leaders.push_back(group.front());
  return leaders;
}

const std::string& Topology::vendorOf(int rank) const {
  if (rank < 0 || rank >= size())
    CHORUS_THROW(ConfigError, "topology: rank ", rank, " out of range");
  return vendors_[rank];
}

int Topology::largestGroup() const {
  size_t largest = 0;
  for (const auto& group : groups_) largest = std::max(largest, group.size());
  return static_cast<int>(largest);
}

LinkClass Topology::linkBetween(int a, int b) const {
  const int n = size();
  if (a < 0 || b < 0 || a >= n || b >= n)
    CHORUS_THROW(ConfigError, "topology: rank out of range (", a, ", ", b, ")");
  return links_[static_cast<size_t>(a) * n + b];
}

LinkClass Topology::intraLink(int index) const {
  LinkClass link = LinkClass::kSharedMemory;
  for (int a : group(index))
    for (int b : group(index)) link = slower(link, linkBetween(a, b));
  return link;
}

LinkClass Topology::interLink() const {
  LinkClass link = LinkClass::kSharedMemory;
  for (int a : leaders())
    for (int b : leaders()) link = slower(link, linkBetween(a, b));
  return link;
}

const LinkSpeed& Topology::speed(LinkClass link) const {
  auto found = speeds_.find(link);
  if (found == speeds_.end())
    CHORUS_THROW(ConfigError, "topology: no speed for link class ", toString(link));
  return found->second;
}

std::string Topology::describe() const {
  std::ostringstream out;
  out << size() << " ranks in " << numGroups() << " groups";
  for (const auto& group : groups_) out << " {" << joinInts(group, ",") << "}";
  out << "; intra";
  for (int g = 0; g < numGroups(); ++g) out << (g ? "," : " ") << toString(intraLink(g));
  out << ", inter " << toString(interLink());
  if (!native_) out << "; bridged through host memory";
  return out.str();
}

std::string Topology::toJson() const {
  std::ostringstream out;
  out << "{\"size\": " << size() << ", \"groups\": [";
  for (int g = 0; g < numGroups(); ++g)
    out << (g ? ", " : "") << "{\"ranks\": [" << joinInts(group(g), ", ")
        << "], \"leader\": " << leaderOf(g) << ", \"link\": \"" << toString(intraLink(g)) << "\"}";
  out << "], \"inter_link\": \"" << toString(interLink())
      << "\", \"native\": " << (native_ ? "true" : "false") << ", \"speeds\": {";
  bool first = true;
  for (const auto& [link, speed] : speeds_) {
    out << (first ? "" : ", ") << "\"" << toString(link)
        << "\": {\"bandwidth\": " << speed.bandwidth << ", \"latency\": " << speed.latency << "}";
    first = false;
  }
  out << "}}";
  return out.str();
}

}  // namespace chorus::comm
