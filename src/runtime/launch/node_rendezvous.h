// Private to runtime: how the agents of a job find each other and number the ranks.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "chorus/comm/store/store.h"
#include "chorus/core/clock.h"
#include "chorus/core/device_spec.h"

namespace chorus::runtime {

// Where this node's workers sit in the job. Value type.
struct NodeSlot {
  int rank_offset = 0;              // global rank of this node's local rank 0
  int world_size = 0;               // workers in the whole job
  std::vector<int> local_sizes;     // workers per node, by node rank
  std::vector<DeviceSpec> devices;  // every rank's device, in rank order
  std::vector<int> node_of_rank;    // the node rank of every rank
};

// Publishes this node's devices (one worker each) and waits for every node's (TimeoutError naming
// the absent nodes). Ranks are numbered node by node in node-rank order.
NodeSlot joinNodes(comm::Store& store, int node_rank, int nnodes,
                   const std::vector<DeviceSpec>& local_devices, std::chrono::milliseconds timeout);

// The job-wide failure flag: the first agent to report a failure wins; all agents poll it.
void reportJobFailure(comm::Store& store, const std::string& message);
std::optional<std::string> jobFailure(comm::Store& store);

// End-of-job handshake, so node 0 keeps the store up until every agent is done with it.
void reportNodeDone(comm::Store& store, int node_rank);
void awaitNodesDone(comm::Store& store, int nnodes, std::chrono::milliseconds timeout);

// Elastic jobs of several nodes, where node 0 keeps the store up without a deadline while other
// nodes' survivors train: each agent beats while it supervises (a counter in the store, at most
// once per kNodeBeatInterval), so that node 0 can tell a node that is gone (its agent killed, its
// link down) from one that still works.
constexpr std::chrono::milliseconds kNodeBeatInterval{1000};
// How long node 0 waits for a node that is not done and does not beat before it gives up on it.
constexpr std::chrono::milliseconds kNodeLease{10000};

// Beats for `node_rank` if kNodeBeatInterval passed since `last` (updated). Throws CommError
// when the store cannot be reached.
void beatNode(comm::Store& store, int node_rank, Clock::time_point& last);

// Waits until every node is done, or gone: not done and no beat seen for `lease` (measured from
// this call for a node never seen beating). Nodes that joined the running job count too, as many
// as have announced themselves by each round; `each_round` (may be empty) runs once per round
// (node 0 admits joining nodes there). Returns the nodes given up as gone, logged.
std::vector<int> awaitNodesDoneOrGone(comm::Store& store, int nnodes,
                                      std::chrono::milliseconds lease = kNodeLease,
                                      const std::function<void()>& each_round = {});

// Nodes joining a running elastic job (`chorus run --join`). Node 0 publishes what a joining
// node must know of the launch once every launch node arrived; a joining node's agent reads it,
// takes the next node rank (launch nodes and up, never reused), announces its devices and
// restarts, and waits until node 0 has admitted it (made room for its connections in the store)
// before it starts workers.
struct LaunchInfo {
  int world_size = 0;  // the launch world size: joined workers' member ids start here
  int nnodes = 0;
  // The workers' communication deadline and CPU transport, which joined workers must share.
  std::chrono::milliseconds comm_timeout{0};
  std::string cpu_transport;
};
void publishLaunchInfo(comm::Store& store, const LaunchInfo& info);
// What node 0 published; throws ConfigError when there is none (the job is not elastic, or has
// not started yet).
LaunchInfo launchInfo(comm::Store& store, const std::string& endpoint);
// Returns the joining node's rank.
int announceJoiningNode(comm::Store& store, const LaunchInfo& launch,
                        const std::vector<DeviceSpec>& devices, int max_restarts);
// Throws TimeoutError when node 0 did not admit `node` within `timeout`.
void awaitNodeAdmitted(comm::Store& store, int node, std::chrono::milliseconds timeout);

// Node 0's side (every agent's when the store is in etcd; the first to mark a node admitted logs
// it): admits every node that announced itself and is not admitted yet, calling
// `make_room(connections)` before each with the store connections it needs (its agent, and
// kConnectionsPerWorker per worker and per replacement it may start). A node whose announcement
// is not complete yet is admitted by a later call.
void admitJoiningNodes(comm::Store& store, const LaunchInfo& launch,
                       const std::function<void(int connections)>& make_room);

// A new member id for a worker that joins the running elastic job (a replacement, or a worker
// of a joining node), drawn from kElasticJoinedKey: `world_size` (the launch's) + n - 1 for the
// job's n-th. Throws CommError when the store cannot be reached.
int drawMemberId(comm::Store& store, int world_size);

// A worker's own store connection and its elastic monitor's (Worker::openStoreConnection).
constexpr int kConnectionsPerWorker = 2;

// The local address this host uses to reach `host` (no packet is sent), for binding transports.
std::string localAddressToward(const std::string& host, int port);

}  // namespace chorus::runtime
