#include "launch/node_rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"

namespace chorus::runtime {
namespace {

constexpr const char* kFailureKey = "job/failure";

std::string nodeKey(int node) { return "agents/" + std::to_string(node); }
std::string doneKey(int node) { return "done/" + std::to_string(node); }
std::string beatKey(int node) { return "agents/beat/" + std::to_string(node); }

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
                                      std::chrono::milliseconds lease) {
  struct Seen {
    std::int64_t beats = -1;
    Clock::time_point since = Clock::now();
  };
  std::vector<Seen> seen(static_cast<size_t>(nnodes));
  std::vector<int> gone;
  std::vector<bool> settled(static_cast<size_t>(nnodes), false);
  for (int waiting = nnodes; waiting > 0;) {
    waiting = 0;
    for (int node = 0; node < nnodes; ++node) {
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
