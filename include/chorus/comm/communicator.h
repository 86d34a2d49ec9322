// The communicator: collectives and point-to-point transfers among the ranks of a group, with a
// deadline on every operation.
//
// It runs over libtorch's c10d process groups, chosen at run time by the tensor's device: Gloo for
// CPU tensors, NCCL for CUDA tensors (when this build has NCCL). The process groups rendezvous
// through our own Store, so they inherit the job secret. When every member runs on one host, CPU
// collectives go through shared memory instead of Gloo (CommOptions::cpu_transport; docs/comm.md).
//
// Every operation gets a sequence number; all ranks of a group must issue the same operations in
// the same order (as with MPI and c10d). Each rank publishes the sequence number of the operation
// it last entered; when an operation times out, the error names the ranks whose published number is
// behind, i.e. the ranks that never arrived.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "chorus/comm/comm_stats.h"
#include "chorus/comm/store/store.h"
#include "chorus/comm/work.h"

namespace c10d {
class Work;
}

namespace chorus::comm {

enum class ReduceOp { kSum, kAvg, kMax, kMin };

const char* toString(ReduceOp op);

struct CommOptions {
  // Deadline of each operation and of the initial connection. Default: 60 s.
  std::chrono::milliseconds timeout{60000};
  // Name of the group, used in errors and as the store namespace. Default: "world".
  std::string name = "world";
  // Address the transport binds to. Default: "127.0.0.1" (one host); the launcher passes the
  // address of the interface that reaches the rendezvous host for multi-host jobs.
  std::string bind_address = "127.0.0.1";
  // Identifies this rank's host, for per-host subgroups. Default: "" (the caller must set it
  // before calling splitByHost).
  std::string host_id;
  // How often a rank publishes its progress (the last operation it entered). Default: 100 ms.
  std::chrono::milliseconds progress_interval{100};
  // Global rank of each member, for error messages; empty means the group is the world.
  std::vector<int> global_ranks;
  // Transport of CPU collectives: "auto" (shared memory when every member runs on this host and
  // can map the segment, else Gloo), "gloo", or "shm" (shared memory, and create() fails when it
  // cannot be used). Operations and types the shared-memory path lacks (send/recv, reductions of
  // other types) always use Gloo. Subgroups inherit it. Default: "auto".
  std::string cpu_transport = "auto";
  // Bytes of each of the two chunk buffers per rank of the shared-memory transport; larger
  // tensors move in several chunks. A positive multiple of 64. Default: 1 MiB.
  std::size_t shm_chunk_bytes = std::size_t{1} << 20;
};

// Per-call options.
struct OpOptions {
  // Overrides CommOptions::timeout for this call. Default: zero, meaning the group's timeout.
  std::chrono::milliseconds timeout{0};
  // Tag that matches a send with its recv. Default: 0.
  int tag = 0;
};

class Backends;

// A group of ranks. Owns its process groups and its progress publisher thread. Operations may be
// issued from one thread at a time (the order of issue is the order all ranks must agree on);
// the returned Work handles may be waited from any thread. Non-copyable; share it through
// std::shared_ptr (subgroups keep their parent's store alive).
class Communicator {
 public:
  // Joins the group: every member calls create() with the same store and size and its own rank.
  // Blocks until all members arrived or the timeout passed (TimeoutError naming the absent ranks).
  static std::shared_ptr<Communicator> create(std::shared_ptr<Store> store, int rank, int size,
                                              CommOptions options = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return options_.name; }
  // The global rank of group member `rank`.
  int globalRank(int rank) const;

  // In place: every rank ends with the reduction of all ranks' `tensor`.
  Work allReduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum, OpOptions options = {});
  // In place: every rank ends with `root`'s tensor.
  Work broadcast(at::Tensor& tensor, int root, OpOptions options = {});
  // `output` (numel = size × input.numel, contiguous) receives every rank's input, in rank order.
  Work allGather(const at::Tensor& input, at::Tensor& output, OpOptions options = {});
  // Uneven: rank i contributes counts[i] elements; `output` has sum(counts) elements.
  Work allGatherV(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& counts,
                  OpOptions options = {});
  // `input` (numel = size × output.numel): rank i receives the reduction of chunk i.
  Work reduceScatter(const at::Tensor& input, at::Tensor& output, ReduceOp op = ReduceOp::kSum,
                     OpOptions options = {});
  // Uneven: chunk i has counts[i] elements; `input` has sum(counts), `output` counts[rank].
  Work reduceScatterV(const at::Tensor& input, at::Tensor& output,
                      const std::vector<int64_t>& counts, ReduceOp op = ReduceOp::kSum,
                      OpOptions options = {});
  // Rank i sends send_counts[j] elements of `input` (in rank order) to rank j and receives
  // recv_counts[j] elements from rank j into `output`. Equal counts give the plain all-to-all.
  Work allToAll(const at::Tensor& input, at::Tensor& output,
                const std::vector<int64_t>& send_counts, const std::vector<int64_t>& recv_counts,
                OpOptions options = {});
  Work send(const at::Tensor& tensor, int dst, OpOptions options = {});
  Work recv(at::Tensor& tensor, int src, OpOptions options = {});
  Work barrier(OpOptions options = {});

  // A subgroup of `ranks` (group ranks, ascending, containing this rank). Only the members call
  // it, each with the same ranks and name.
  std::shared_ptr<Communicator> subgroup(const std::vector<int>& ranks, const std::string& name);

  // The transport that carries this group's CPU collectives: "shm" or "gloo".
  const char* cpuTransport() const;

  // Per-host groups (collective: every rank of this group calls it). `local` holds the ranks
  // with this rank's CommOptions::host_id; `leaders` the lowest rank of each host, and is null on
  // the other ranks.
  struct HostGroups {
    std::shared_ptr<Communicator> local;
    std::shared_ptr<Communicator> leaders;
    std::vector<std::vector<int>> hosts;  // group ranks of each host, hosts ordered by lowest rank
  };
  HostGroups splitByHost();

  // Totals per operation kind (bytes, seconds, failures).
  std::map<std::string, OpStats> stats() const;
  // True after an operation failed; every further operation throws CommError.
  bool broken() const;
  // Breaks the group and its subgroups from any thread: every later operation throws CommError
  // quoting `why`; shared-memory operations already waiting give up within a few ms, Gloo sends
  // and receives in flight are aborted. Elastic recovery calls it when a member is lost, so that
  // survivors blocked on it come out. A wait on a Gloo collective gives up within 50 ms too, but
  // the collective (libtorch's Gloo cannot interrupt it) runs on in its process group until its
  // deadline or until its peer's connection drops; the group then keeps that process group alive
  // when destroyed, rather than block on its threads.
  void abort(const std::string& why);

 private:
  Communicator(std::shared_ptr<Store> store, int rank, int size, CommOptions options);

  // Starts operation `name`: assigns its sequence number and deadline, records progress.
  // Point-to-point operations (peer >= 0) are numbered apart from collectives, since the ranks
  // of a group agree on the order of collectives only.
  std::shared_ptr<Work::State> begin(const char* name, std::uint64_t bytes,
                                     const OpOptions& options, int peer = -1);
  // Finishes issuing: attaches the transport's work (may be null) and returns the handle.
  Work issue(std::shared_ptr<Work::State> state, c10::intrusive_ptr<c10d::Work> work);
  void checkPeer(int peer) const;
  std::chrono::milliseconds timeoutOf(const OpOptions& options) const;

  std::shared_ptr<Store> store_;        // the job's store, shared with subgroups
  std::shared_ptr<Store> group_store_;  // this group's namespace in it
  int rank_;
  int size_;
  CommOptions options_;
  long long next_sequence_ = 0;
  long long next_p2p_sequence_ = 0;
  int splits_ = 0;
  std::shared_ptr<struct GroupContext> group_;
  std::unique_ptr<Backends> backends_;
  // The subgroups made from this group, which abort() breaks too.
  std::mutex children_mutex_;
  std::vector<std::weak_ptr<Communicator>> children_;
};

}  // namespace chorus::comm
