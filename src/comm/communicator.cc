#include "chorus/comm/communicator.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

#include "backend.h"
#include "chorus/comm/store/prefix_store.h"
#include "chorus/core/error.h"
#include "chorus/core/name_table.h"
#include "shm/shm_kernels.h"
#include "shm/shm_transport.h"
#include "work_state.h"

namespace chorus::comm {
namespace {

c10d::ReduceOp toC10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // Gloo has no AVG: we sum and divide when the work finishes.
      return c10d::ReduceOp::SUM;
  }
  return c10d::ReduceOp::SUM;
}

void requireContiguous(const at::Tensor& tensor, const char* what) {
  if (!tensor.is_contiguous()) CHORUS_THROW(ConfigError, what, ": tensors must be contiguous");
}

void requireNumel(const at::Tensor& tensor, int64_t expected, const char* what, const char* name) {
  if (tensor.numel() != expected)
    CHORUS_THROW(ConfigError, what, ": ", name, " has ", tensor.numel(), " elements, expected ",
                 expected);
}

void requireAverageable(const at::Tensor& tensor, ReduceOp op, const char* what) {
  if (op == ReduceOp::kAvg && !at::isFloatingType(tensor.scalar_type()))
    CHORUS_THROW(ConfigError, what, ": an average needs a floating-point tensor");
}

// What the shared-memory transport needs to know of an operation: its name, number and deadline.
ShmWaitContext ticketOf(const Work::State& state) {
  ShmWaitContext ticket;
  ticket.operation = state.operation;
  ticket.sequence = state.sequence;
  ticket.deadline = state.deadline;
  ticket.timeout = state.timeout;
  return ticket;
}

int64_t sumOf(const std::vector<int64_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), int64_t{0});
}

// Reduces `stacked` (size × n) along its first dimension into `output`.
void reduceRows(const at::Tensor& stacked, at::Tensor& output, ReduceOp op, int size) {
  at::Tensor flat = output.view({-1});
  switch (op) {
    case ReduceOp::kSum:
      flat.copy_(stacked.sum(0));
      break;
    case ReduceOp::kAvg:
      flat.copy_(stacked.sum(0).div_(size));
      break;
    case ReduceOp::kMax:
      flat.copy_(std::get<0>(stacked.max(0)));
      break;
    case ReduceOp::kMin:
      flat.copy_(std::get<0>(stacked.min(0)));
      break;
  }
}

constexpr NamedValue<ReduceOp> kReduceOpNames[] = {{ReduceOp::kSum, "sum"},
                                                   {ReduceOp::kAvg, "avg"},
                                                   {ReduceOp::kMax, "max"},
                                                   {ReduceOp::kMin, "min"}};

}  // namespace

const char* toString(ReduceOp op) { return nameOf(kReduceOpNames, op); }

std::shared_ptr<Communicator> Communicator::create(std::shared_ptr<Store> store, int rank, int size,
                                                   CommOptions options) {
  if (size < 1 || rank < 0 || rank >= size)
    CHORUS_THROW(ConfigError, "communicator: rank ", rank, " is outside a group of size ", size);
  return std::shared_ptr<Communicator>(
      new Communicator(std::move(store), rank, size, std::move(options)));
}

Communicator::Communicator(std::shared_ptr<Store> store, int rank, int size, CommOptions options)
    : store_(std::move(store)),
      group_store_(std::make_shared<PrefixStore>("comm/" + options.name, store_)),
      rank_(rank),
      size_(size),
      options_(std::move(options)),
      group_(std::make_shared<GroupContext>()) {
  group_->name = options_.name;
  group_->global_ranks = options_.global_ranks;
  group_->stats = std::make_shared<CommStats>();
  // Arrival keys first: if someone never comes, the error can say who.
  group_store_->setString("joined/" + std::to_string(rank_), "1");
  std::vector<std::string> keys;
  for (int peer = 0; peer < size_; ++peer) keys.push_back("joined/" + std::to_string(peer));
  try {
    group_store_->wait(keys, options_.timeout);
  } catch (const TimeoutError&) {
    std::vector<int> global;
    for (int peer = 0; peer < size_; ++peer)
      if (!group_store_->check({keys[peer]})) global.push_back(globalRank(peer));
    throw TimeoutError(
        detail::concat("joining group '", options_.name, "' timed out after ",
                       options_.timeout.count(), " ms; ranks not arrived: ", joinInts(global)),
        __FILE__, __LINE__, "join", -1, global);
  }
  group_->progress =
      std::make_shared<ProgressBoard>(group_store_, rank_, size_, options_.progress_interval);
  try {
    backends_ = std::make_unique<Backends>(group_store_, rank_, size_, options_, group_);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& error) {
    std::rethrow_exception(group_->translate(error, "connect", -1, options_.timeout));
  }
}

Communicator::~Communicator() = default;

int Communicator::globalRank(int rank) const {
  return options_.global_ranks.empty() ? rank : options_.global_ranks.at(rank);
}

std::map<std::string, OpStats> Communicator::stats() const { return group_->stats->snapshot(); }

bool Communicator::broken() const { return group_->broken.load(); }

void Communicator::abort(const std::string& why) {
  group_->markBroken(why);
  group_->aborted.store(true);
  group_->abortTransfers();
  std::vector<std::shared_ptr<Communicator>> children;
  {
    std::lock_guard<std::mutex> lock(children_mutex_);
    for (const auto& weak : children_)
      if (auto child = weak.lock()) children.push_back(std::move(child));
  }
  for (const auto& child : children) child->abort(why);
}

const char* Communicator::cpuTransport() const { return backends_->shm() ? "shm" : "gloo"; }

std::chrono::milliseconds Communicator::timeoutOf(const OpOptions& options) const {
  return options.timeout.count() > 0 ? options.timeout : options_.timeout;
}

void Communicator::checkPeer(int peer) const {
  if (peer < 0 || peer >= size_ || peer == rank_)
    CHORUS_THROW(ConfigError, "group '", options_.name, "': rank ", peer, " is not a peer of rank ",
                 rank_, " in a group of size ", size_);
}

std::shared_ptr<Work::State> Communicator::begin(const char* name, std::uint64_t bytes,
                                                 const OpOptions& options, int peer) {
  if (group_->broken.load()) {
    std::lock_guard<std::mutex> lock(group_->failure_mutex);
    CHORUS_THROW(CommError, name, " on group '", options_.name,
                 "': the group is broken by an earlier failure: ", group_->failure);
  }
  auto state = std::make_shared<Work::State>();
  state->group = group_;
  state->operation = name;
  state->peer = peer;
  state->sequence = peer >= 0 ? next_p2p_sequence_++ : next_sequence_++;
  state->bytes = bytes;
  state->timeout = timeoutOf(options);
  state->deadline = Deadline::after(state->timeout);
  if (peer < 0) group_->progress->enter(state->sequence);
  return state;
}

Work Communicator::issue(std::shared_ptr<Work::State> state, c10::intrusive_ptr<c10d::Work> work) {
  state->work = std::move(work);
  return Work(std::move(state));
}

Work Communicator::allReduce(at::Tensor& tensor, ReduceOp op, OpOptions options) {
  requireContiguous(tensor, "all_reduce");
  requireAverageable(tensor, op, "all_reduce");
  auto state = begin("all_reduce", tensor.nbytes(), options);
  if (tensor.numel() == 0) return issue(state, nullptr);
  ShmTransport* shm = backends_->shmFor(tensor);
  if (shm && shmReducible(tensor.scalar_type()))
    return issue(state, shm->allReduce(ticketOf(*state), tensor, op));
  if (op == ReduceOp::kAvg) state->finish = [tensor, size = size_]() mutable { tensor.div_(size); };
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions c10d_options;
  c10d_options.reduceOp = toC10d(op);
  c10d_options.timeout = state->timeout;
  return issue(state, backends_->forTensor(tensor).allreduce(tensors, c10d_options));
}

Work Communicator::broadcast(at::Tensor& tensor, int root, OpOptions options) {
  requireContiguous(tensor, "broadcast");
  if (root < 0 || root >= size_)
    CHORUS_THROW(ConfigError, "broadcast: root ", root, " out of range");
  auto state = begin("broadcast", tensor.nbytes(), options);
  if (tensor.numel() == 0 || size_ == 1) return issue(state, nullptr);
  if (ShmTransport* shm = backends_->shmFor(tensor))
    return issue(state, shm->broadcast(ticketOf(*state), tensor, root));
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions c10d_options;
  c10d_options.rootRank = root;
  c10d_options.timeout = state->timeout;
  return issue(state, backends_->forTensor(tensor).broadcast(tensors, c10d_options));
}

Work Communicator::allGather(const at::Tensor& input, at::Tensor& output, OpOptions options) {
  requireContiguous(input, "all_gather");
  requireContiguous(output, "all_gather");
  requireNumel(output, input.numel() * size_, "all_gather", "output");
  auto state = begin("all_gather", input.nbytes(), options);
  if (input.numel() == 0) return issue(state, nullptr);
  const int64_t n = input.numel();
  if (ShmTransport* shm = backends_->shmFor(input))
    return issue(state,
                 shm->allGatherV(ticketOf(*state), input, output, std::vector<int64_t>(size_, n)));
  at::Tensor flat = output.view({-1});
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int peer = 0; peer < size_; ++peer) outputs[0].push_back(flat.narrow(0, peer * n, n));
  std::vector<at::Tensor> inputs{input.view({-1})};
  c10d::AllgatherOptions c10d_options;
  c10d_options.timeout = state->timeout;
  return issue(state, backends_->forTensor(input).allgather(outputs, inputs, c10d_options));
}

Work Communicator::allGatherV(const at::Tensor& input, at::Tensor& output,
                              const std::vector<int64_t>& counts, OpOptions options) {
  requireContiguous(input, "all_gather_v");
  requireContiguous(output, "all_gather_v");
  if (static_cast<int>(counts.size()) != size_)
    CHORUS_THROW(ConfigError, "all_gather_v: ", counts.size(), " counts for ", size_, " ranks");
  requireNumel(input, counts[rank_], "all_gather_v", "input");
  requireNumel(output, sumOf(counts), "all_gather_v", "output");
  auto state = begin("all_gather_v", input.nbytes(), options);
  const int64_t widest = *std::max_element(counts.begin(), counts.end());
  if (widest == 0) return issue(state, nullptr);
  if (ShmTransport* shm = backends_->shmFor(input))
    return issue(state, shm->allGatherV(ticketOf(*state), input, output, counts));
  // Gloo's all-gather needs equal sizes: pad each contribution to the widest, unpack on finish.
  at::Tensor padded = at::zeros({widest}, input.options());
  padded.narrow(0, 0, counts[rank_]).copy_(input.view({-1}));
  at::Tensor gathered = at::empty({widest * size_}, input.options());
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int peer = 0; peer < size_; ++peer)
    outputs[0].push_back(gathered.narrow(0, peer * widest, widest));
  std::vector<at::Tensor> inputs{padded};
  state->finish = [gathered, output, counts, widest]() mutable {
    at::Tensor flat = output.view({-1});
    int64_t offset = 0;
    for (size_t peer = 0; peer < counts.size(); ++peer) {
      flat.narrow(0, offset, counts[peer]).copy_(gathered.narrow(0, peer * widest, counts[peer]));
      offset += counts[peer];
    }
  };
  c10d::AllgatherOptions c10d_options;
  c10d_options.timeout = state->timeout;
  return issue(state, backends_->forTensor(input).allgather(outputs, inputs, c10d_options));
}

Work Communicator::reduceScatter(const at::Tensor& input, at::Tensor& output, ReduceOp op,
                                 OpOptions options) {
  requireNumel(input, output.numel() * size_, "reduce_scatter", "input");
  return reduceScatterV(input, output, std::vector<int64_t>(size_, output.numel()), op, options);
}

Work Communicator::reduceScatterV(const at::Tensor& input, at::Tensor& output,
                                  const std::vector<int64_t>& counts, ReduceOp op,
                                  OpOptions options) {
  requireContiguous(input, "reduce_scatter");
  requireContiguous(output, "reduce_scatter");
  requireAverageable(input, op, "reduce_scatter");
  if (static_cast<int>(counts.size()) != size_)
    CHORUS_THROW(ConfigError, "reduce_scatter: ", counts.size(), " counts for ", size_, " ranks");
  requireNumel(input, sumOf(counts), "reduce_scatter", "input");
  requireNumel(output, counts[rank_], "reduce_scatter", "output");
  auto state = begin("reduce_scatter", input.nbytes(), options);
  if (sumOf(counts) == 0) return issue(state, nullptr);
  ShmTransport* shm = backends_->shmFor(input);
  if (shm && shmReducible(input.scalar_type()))
    return issue(state, shm->reduceScatterV(ticketOf(*state), input, output, counts, op));
  // An all-to-all moves chunk j of every rank to rank j ((n-1)/n of the data, the optimum); the
  // rank then reduces the n chunks it received, in rank order, so the result is deterministic.
  const int64_t mine = counts[rank_];
  at::Tensor received = at::empty({mine * size_}, input.options());
  std::vector<int64_t> send_splits(counts);
  std::vector<int64_t> recv_splits(size_, mine);
  at::Tensor flat_input = input.view({-1});
  state->finish = [received, output, op, mine, size = size_]() mutable {
    if (mine > 0) reduceRows(received.view({size, mine}), output, op, size);
  };
  c10d::AllToAllOptions c10d_options;
  c10d_options.timeout = state->timeout;
  return issue(state, backends_->forTensor(input).alltoall_base(received, flat_input, recv_splits,
                                                                send_splits, c10d_options));
}

Work Communicator::allToAll(const at::Tensor& input, at::Tensor& output,
                            const std::vector<int64_t>& send_counts,
                            const std::vector<int64_t>& recv_counts, OpOptions options) {
  requireContiguous(input, "all_to_all");
  requireContiguous(output, "all_to_all");
  if (static_cast<int>(send_counts.size()) != size_ ||
      static_cast<int>(recv_counts.size()) != size_)
    CHORUS_THROW(ConfigError, "all_to_all: need one send and one receive count per rank");
  requireNumel(input, sumOf(send_counts), "all_to_all", "input");
  requireNumel(output, sumOf(recv_counts), "all_to_all", "output");
  auto state = begin("all_to_all", input.nbytes(), options);
  if (ShmTransport* shm = backends_->shmFor(input))
    return issue(state, shm->allToAll(ticketOf(*state), input, output, send_counts, recv_counts));
  at::Tensor flat_input = input.view({-1});
  at::Tensor flat_output = output.view({-1});
  std::vector<int64_t> send_splits(send_counts);
  std::vector<int64_t> recv_splits(recv_counts);
  c10d::AllToAllOptions c10d_options;
  c10d_options.timeout = state->timeout;
  return issue(state, backends_->forTensor(input).alltoall_base(
                          flat_output, flat_input, recv_splits, send_splits, c10d_options));
}

Work Communicator::send(const at::Tensor& tensor, int dst, OpOptions options) {
  requireContiguous(tensor, "send");
  checkPeer(dst);
  auto state = begin("send", tensor.nbytes(), options, dst);
  if (tensor.numel() == 0) return issue(state, nullptr);
  std::vector<at::Tensor> tensors{tensor};
  auto work = backends_->forTensor(tensor).send(tensors, dst, options.tag);
  group_->trackTransfer(work);
  return issue(state, std::move(work));
}

Work Communicator::recv(at::Tensor& tensor, int src, OpOptions options) {
  requireContiguous(tensor, "recv");
  checkPeer(src);
  auto state = begin("recv", tensor.nbytes(), options, src);
  if (tensor.numel() == 0) return issue(state, nullptr);
  std::vector<at::Tensor> tensors{tensor};
  auto work = backends_->forTensor(tensor).recv(tensors, src, options.tag);
  group_->trackTransfer(work);
  return issue(state, std::move(work));
}

Work Communicator::barrier(OpOptions options) {
  auto state = begin("barrier", 0, options);
  if (ShmTransport* shm = backends_->shm()) return issue(state, shm->barrier(ticketOf(*state)));
  c10d::BarrierOptions c10d_options;
  c10d_options.timeout = state->timeout;
  return issue(state, backends_->cpu().barrier(c10d_options));
}

}  // namespace chorus::comm
