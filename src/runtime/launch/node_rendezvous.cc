#include "launch/node_rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sstream>
#include <thread>

#include "chorus/comm/store/job_secret.h"
#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "chorus/runtime/launch/agent.h"

namespace chorus::runtime {
namespace {

constexpr const char* kFailureKey = "job/failure";

std::string nodeKey(int node) { return "agents/" + std::to_string(node); }
std::string doneKey(int node) { return "done/" + std::to_string(node); }
std::string beatKey(int node) { return "agents/beat/" + std::to_string(node); }

constexpr const char* kLaunchInfoKey = "agents/launch";
constexpr const char* kJoiningNodesKey = "agents/joining";
std::string joiningKey(int node) { return "agents/joining/" + std::to_string(node); }
std::string admittedKey(int node) { return "agents/admitted/" + std::to_string(node); }

// Nodes that took a joining node rank so far (some may not have announced themselves yet).
int joiningNodes(comm::Store& store) { return static_cast<int>(store.add(kJoiningNodesKey, 0)); }

std::vector<int> absentNodes(comm::Store& store, int nnodes, std::string (*key)(int)) {
  std::vector<int> absent;
  for (int node = 0; node < nnodes; ++node)
    if (!store.check({key(node)})) absent.push_back(node);
  return absent;
}

}  // namespace

NodeSlot joinNodes(comm::Store& store, int node_rank, int nnodes,
                   const std::vector<DeviceSpec>& local_devices,
                   std::chrono::milliseconds timeout) {
  store.setString(nodeKey(node_rank), toString(local_devices));
  const Deadline deadline = Deadline::after(timeout);
  NodeSlot slot;
  for (int node = 0; node < nnodes; ++node) {
    try {
      const std::vector<DeviceSpec> devices =
          parseDeviceSpecs(store.getString(nodeKey(node), deadline.remaining()));
      slot.local_sizes.push_back(static_cast<int>(devices.size()));
      slot.devices.insert(slot.devices.end(), devices.begin(), devices.end());
      slot.node_of_rank.insert(slot.node_of_rank.end(), devices.size(), node);
    } catch (const TimeoutError&) {
      const std::vector<int> absent = absentNodes(store, nnodes, nodeKey);
      CHORUS_THROW(TimeoutError, "rendezvous: nodes ", joinInts(absent), " of ", nnodes,
                   " did not join within ", timeout.count() / 1000, " s");
    }
  }
  for (int node = 0; node < nnodes; ++node) {
    if (node < node_rank) slot.rank_offset += slot.local_sizes[node];
    slot.world_size += slot.local_sizes[node];
  }
  return slot;
}

void reportJobFailure(comm::Store& store, const std::string& message) {
  store.compareSet(kFailureKey, {}, comm::toBytes(message));
}

std::optional<std::string> jobFailure(comm::Store& store) {
  if (!store.check({kFailureKey})) return std::nullopt;
  return store.getString(kFailureKey, std::chrono::milliseconds(5000));
}

void reportNodeDone(comm::Store& store, int node_rank) { store.setString(doneKey(node_rank), "1"); }

void awaitNodesDone(comm::Store& store, int nnodes, std::chrono::milliseconds timeout) {
  std::vector<std::string> keys;
  for (int node = 0; node < nnodes; ++node) keys.push_back(doneKey(node));
  try {
    store.wait(keys, timeout);
  } catch (const TimeoutError&) {
    CHORUS_THROW(TimeoutError, "nodes ", joinInts(absentNodes(store, nnodes, doneKey)),
                 " did not finish within ", timeout.count() / 1000, " s of this node");
  }
}

void beatNode(comm::Store& store, int node_rank, Clock::time_point& last) {
  const Clock::time_point now = Clock::now();
  if (now - last < kNodeBeatInterval) return;
  store.add(beatKey(node_rank), 1);
  last = now;
}

std::vector<int> awaitNodesDoneOrGone(comm::Store& store, int nnodes,
                                      std::chrono::milliseconds lease,
                                      const std::function<void()>& each_round) {
  struct Seen {
    std::int64_t beats = -1;
    Clock::time_point since = Clock::now();
  };
  std::vector<Seen> seen;
  std::vector<int> gone;
  std::vector<bool> settled;
  for (int waiting = nnodes; waiting > 0;) {
    if (each_round) each_round();
    const int nodes = nnodes + joiningNodes(store);
    seen.resize(static_cast<size_t>(nodes));
    settled.resize(static_cast<size_t>(nodes), false);
    waiting = 0;
    for (int node = 0; node < nodes; ++node) {
      if (settled[node]) continue;
      if (store.check({doneKey(node)})) {
        settled[node] = true;
        continue;
      }
      const std::int64_t beats = store.add(beatKey(node), 0);
      if (beats != seen[node].beats) seen[node] = {beats, Clock::now()};
      if (Clock::now() - seen[node].since >= lease) {
        settled[node] = true;
        gone.push_back(node);
        logWarn("chorus run: node ", node, " is neither done nor heard from for ",
                lease.count() / 1000.0, " s: lost, not waiting for it");
        continue;
      }
      ++waiting;
    }
    if (waiting > 0) std::this_thread::sleep_for(kNodeBeatInterval / 4);
  }
  return gone;
}

void publishLaunchInfo(comm::Store& store, const LaunchInfo& info) {
  store.setString(kLaunchInfoKey,
                  detail::concat(info.world_size, " ", info.nnodes, " ", info.comm_timeout.count(),
                                 " ", info.cpu_transport));
}

LaunchInfo launchInfo(comm::Store& store, const std::string& endpoint) {
  if (!store.check({kLaunchInfoKey}))
    CHORUS_THROW(ConfigError, "chorus run --join: the job at ", endpoint,
                 " does not take new nodes: it is not elastic (--elastic, elastic.enabled), or its "
                 "nodes have not all started yet");
  LaunchInfo info;
  std::istringstream text(store.getString(kLaunchInfoKey, std::chrono::milliseconds(5000)));
  long long timeout_ms = 0;
  text >> info.world_size >> info.nnodes >> timeout_ms >> info.cpu_transport;
  info.comm_timeout = std::chrono::milliseconds(timeout_ms);
  return info;
}

int announceJoiningNode(comm::Store& store, const LaunchInfo& launch,
                        const std::vector<DeviceSpec>& devices, int max_restarts) {
  const int node = launch.nnodes + static_cast<int>(store.add(kJoiningNodesKey, 1)) - 1;
  store.setString(nodeKey(node), toString(devices));
  store.setString(joiningKey(node),
                  std::to_string(devices.size()) + " " + std::to_string(max_restarts));
  return node;
}

void awaitNodeAdmitted(comm::Store& store, int node, std::chrono::milliseconds timeout) {
  try {
    store.wait({admittedKey(node)}, timeout);
  } catch (const TimeoutError&) {
    CHORUS_THROW(TimeoutError, "chorus run --join: no agent of the job admitted this node (node ",
                 node, ") within ", timeout.count() / 1000,
                 " s; is the job still running, and is node 0's agent (with --rdzv-backend etcd: "
                 "any agent) still supervising?");
  }
}

void admitJoiningNodes(comm::Store& store, const LaunchInfo& launch,
                       const std::function<void(int connections)>& make_room) {
  const int joining = joiningNodes(store);
  for (int node = launch.nnodes; node < launch.nnodes + joining; ++node) {
    // A node that took its rank but has not announced its devices yet waits for the next call.
    if (store.check({admittedKey(node)}) || !store.check({joiningKey(node)})) continue;
    std::istringstream text(store.getString(joiningKey(node), std::chrono::milliseconds(5000)));
    int workers = 0, restarts = 0;
    text >> workers >> restarts;
    make_room(1 + kConnectionsPerWorker * workers * (1 + restarts));
    // With the store in etcd every agent admits (node 0 may be gone): the one whose mark is
    // written logs it.
    const comm::Bytes mark = comm::toBytes(comm::toHex(comm::randomBytes(8)));
    if (store.compareSet(admittedKey(node), {}, mark) != mark) continue;
    logInfo("chorus run: node ", node, " joins the running job with ",
            store.getString(nodeKey(node), std::chrono::milliseconds(5000)));
  }
}

int drawMemberId(comm::Store& store, int world_size) {
  return world_size + static_cast<int>(store.add(kElasticJoinedKey, 1)) - 1;
}

std::string localAddressToward(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found)
    CHORUS_THROW(ConfigError, "cannot resolve rendezvous host '", host, "'");
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  // Connecting a datagram socket sends nothing; it only asks the kernel to pick the route.
  const bool routed = fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0;
  freeaddrinfo(found);
  sockaddr_in local{};
  socklen_t length = sizeof local;
  const bool named = routed && getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0;
  if (fd >= 0) close(fd);
  if (!named) CHORUS_THROW(CommError, "no route from this host to rendezvous host '", host, "'");
  char text[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &local.sin_addr, text, sizeof text);
  return text;
}

}  // namespace chorus::runtime
