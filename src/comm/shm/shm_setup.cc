// Setup of the shared-memory transport: deciding by capability whether a group can use it, and
// creating, mapping and unlinking its segment. See connectShm in shm_transport.h.
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <fstream>
#include <random>

#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "shm/shm_transport.h"
#include "work_state.h"

namespace chorus::comm {
namespace {

// What makes two processes "on one host" for shared memory: the kernel instance (boot id) and the
// host name. Containers on one kernel may still not share /dev/shm; mapping the segment is the
// final test.
std::string machineIdentity() {
  std::string boot_id;
  std::ifstream file("/proc/sys/kernel/random/boot_id");
  std::getline(file, boot_id);
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return boot_id + "/" + host;
}

// "/chorus.<group>.<nonce>": the group name says whose it is, the random nonce keeps concurrent
// jobs (each with its own store, maybe the same group names) apart.
std::string segmentName(const std::string& group) {
  std::string clean;
  for (char c : group.substr(0, 48))
    clean += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '_';
  std::random_device random;
  const unsigned long long nonce =
      (static_cast<unsigned long long>(random()) << 32) ^ static_cast<unsigned long long>(random());
  char suffix[17];
  std::snprintf(suffix, sizeof(suffix), "%016llx", nonce);
  return "/chorus." + clean + "." + suffix;
}

std::string keyOf(const char* what, int rank) {
  return std::string("shm/") + what + "/" + std::to_string(rank);
}

// Members that report a machine, or declare a host, other than this rank's.
std::vector<int> membersElsewhere(Store& store, int rank, int size, const ShmSetup& setup) {
  const std::string mine = machineIdentity() + "/" + setup.host_id;
  const std::chrono::milliseconds timeout = setup.timeout;
  store.setString(keyOf("host", rank), mine);
  std::vector<int> elsewhere;
  for (int peer = 0; peer < size; ++peer)
    if (store.getString(keyOf("host", peer), timeout) != mine) elsewhere.push_back(peer);
  return elsewhere;
}

// Rank 0 creates the segment and publishes its name ("" when it failed); the others map it.
std::unique_ptr<ShmSegment> mapSegment(Store& store, int rank, int size, const ShmSetup& setup,
                                       const std::string& group, std::string& name,
                                       std::string& problem) {
  try {
    if (rank == 0) {
      name = segmentName(group);
      try {
        auto segment = ShmSegment::create(name, size, setup.chunk_bytes);
        store.setString("shm/segment", name);
        return segment;
      } catch (...) {
        store.setString("shm/segment", "");
        throw;
      }
    }
    name = store.getString("shm/segment", setup.timeout);
    if (name.empty()) {
      problem = "rank 0 could not create the segment";
      return nullptr;
    }
    return ShmSegment::open(name, size, setup.chunk_bytes);
  } catch (const CommError& error) {
    problem = error.message();
    return nullptr;
  }
}

}  // namespace

std::unique_ptr<ShmTransport> connectShm(Store& store, int rank, int size, const ShmSetup& setup,
                                         std::shared_ptr<GroupContext> group) {
  const std::vector<int> elsewhere = membersElsewhere(store, rank, size, setup);
  if (!elsewhere.empty()) {
    if (setup.required)
      CHORUS_THROW(ConfigError, "group '", group->name,
                   "': cpu_transport 'shm' needs every member on one host, but ranks ",
                   group->describeRanks(elsewhere),
                   " run on (or declare, CommOptions::host_id) another host than rank ",
                   group->describeRanks({rank}));
    return nullptr;
  }
  std::string name;
  std::string problem;
  std::unique_ptr<ShmTransport> transport;
  if (auto segment = mapSegment(store, rank, size, setup, group->name, name, problem)) {
    try {
      transport = std::make_unique<ShmTransport>(std::move(segment), rank, group);
    } catch (const CommError& error) {
      problem = error.message();
    }
  }
  store.setString(keyOf("mapped", rank), problem.empty() ? "ok" : problem);
  std::vector<std::string> failures;
  for (int peer = 0; peer < size; ++peer) {
    const std::string outcome = store.getString(keyOf("mapped", peer), setup.timeout);
    if (outcome != "ok")
      failures.push_back(detail::concat("rank ", group->describeRanks({peer}), ": ", outcome));
  }
  // Everyone mapped it or gave up: the name is no longer needed, the mappings stay valid.
  if (!name.empty()) ShmSegment::unlink(name);
  if (failures.empty()) return transport;
  transport.reset();
  std::string why;
  for (const std::string& failure : failures) why += (why.empty() ? "" : "; ") + failure;
  if (setup.required)
    CHORUS_THROW(CommError, "group '", group->name, "': shared memory unavailable: ", why);
  logInfo("group '", group->name, "': shared memory unavailable, using Gloo (", why, ")");
  return nullptr;
}

}  // namespace chorus::comm
