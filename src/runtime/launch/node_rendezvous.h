// Private to runtime: how the agents of a job find each other and number the ranks.
#pragma once

#include <chrono>
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
// this call for a node never seen beating). Returns the nodes given up as gone, logged.
std::vector<int> awaitNodesDoneOrGone(comm::Store& store, int nnodes,
                                      std::chrono::milliseconds lease = kNodeLease);

// The local address this host uses to reach `host` (no packet is sent), for binding transports.
std::string localAddressToward(const std::string& host, int port);

}  // namespace chorus::runtime
