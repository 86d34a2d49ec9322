// Communication costs: the alpha-beta model of point-to-point transfers and all-reduce on a
// cluster's links, flat ring and hierarchical, with gradient compression and bucketed overlap with
// the backward pass.
//
// A transfer of S bytes costs alpha + beta * S. A flat ring all-reduce over n devices costs
// 2(n-1) alpha + 2(n-1)/n * S * beta_bottleneck (Patarasuk & Yuan, "Bandwidth optimal all-reduce
// algorithms for clusters of workstations", JPDC 2009); a ring that leaves a node crosses the
// network once per step, at the node's network bandwidth. The hierarchical form reduce-scatters
// inside each node, all-reduces between nodes (each node sending its whole S through its NICs) and
// all-gathers inside the node again, as Horovod's hierarchical all-reduce and NCCL's tree/ring mix
// do. Compression shrinks only the bytes that cross the network.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "chorus/plan/cluster.h"
#include "chorus/plan/plan.h"

namespace chorus::plan {

// seconds(bytes) = latency + per_byte * bytes. Value type.
struct LinearCost {
  double latency = 0;
  double per_byte = 0;
  double seconds(double bytes) const { return latency + per_byte * bytes; }
};

// A point-to-point transfer between two cluster devices.
LinearCost p2pCost(const Cluster& cluster, int from, int to);

// An all-reduce of S bytes (the per-device buffer) over `group` (cluster device ids) with a priced
// `algorithm` (plan.h: kFlat, kHierarchical; ConfigError for the others).
// `network_ratio` scales the bytes that cross nodes (compression; 1 = none). An empty or
// one-device group costs nothing.
LinearCost allReduceCost(const Cluster& cluster, const std::vector<int>& group,
                         AllReduceAlgorithm algorithm, double network_ratio = 1);

// Size of a compressed gradient element over the uncompressed one: fp16 and bf16 carry 2 bytes,
// int8 1 (plus a negligible scale per bucket); never more than 1. ConfigError for a codec that is
// not priced (plan.h).
double compressionRatio(CodecKind codec, int element_bytes);

// A gradient all-reduce of `element_bytes`-byte elements over `group` with `codec` where it
// crosses nodes: allReduceCost at the codec's ratio, plus `codec_seconds_per_byte` (encoding and
// decoding, per byte of the uncompressed buffer; CostOptions::codec_seconds_per_byte) when the
// codec is lossy and the group spans nodes.
LinearCost gradientAllReduceCost(const Cluster& cluster, const std::vector<int>& group,
                                 AllReduceAlgorithm algorithm, CodecKind codec, int element_bytes,
                                 double codec_seconds_per_byte = 0);

// Gradient synchronization split into buckets that start as the backward pass produces them
// (PyTorch DDP: 25 MiB buckets). `total` is all buckets back to back, `last` the final bucket,
// which cannot overlap with anything.
struct BucketedAllReduce {
  double total = 0;
  double last = 0;
  int buckets = 0;
};
inline BucketedAllReduce bucketedAllReduce(const LinearCost& cost, double bytes,
                                           double bucket_bytes) {
  BucketedAllReduce sync;
  if (bytes <= 0 || (cost.latency == 0 && cost.per_byte == 0)) return sync;
  sync.buckets = std::max(1, static_cast<int>(std::ceil(bytes / bucket_bytes)));
  sync.total = sync.buckets * cost.latency + cost.per_byte * bytes;
  sync.last = cost.latency + cost.per_byte * bytes / sync.buckets;
  return sync;
}

// Seconds of synchronization left after a backward pass of `backward_seconds` during which the
// buckets were produced evenly: bucket k is ready at (k+1)/n of the backward, so the all-reduce
// ends at max(backward + last, backward/n + total).
inline double exposedSeconds(const BucketedAllReduce& sync, double backward_seconds) {
  if (sync.buckets == 0) return 0;
  const double first_ready = backward_seconds / sync.buckets;
  const double end = std::max(backward_seconds + sync.last, first_ready + sync.total);
  return end - backward_seconds;
}

}  // namespace chorus::plan
