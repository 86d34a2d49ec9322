#include "chorus/parallel/zero.h"

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>

#include "chorus/core/error.h"
#include "chorus/plan/balancer.h"

namespace chorus::parallel {
namespace {

// Calls visit(parameter, offset in the parameter, offset in [begin, end), count) for every
// parameter (in `order`) that overlaps [begin, end) of the flat space.
template <typename Visit>
void forEachOverlap(const std::vector<at::Tensor>& parameters, const std::vector<int>& order,
                    std::int64_t begin, std::int64_t end, Visit visit) {
  std::int64_t position = 0;
  for (int index : order) {
    const std::int64_t numel = parameters[index].numel();
    const std::int64_t from = std::max(begin, position), to = std::min(end, position + numel);
    if (from < to) visit(index, from - position, from - begin, to - from);
    position += numel;
    if (position >= end) return;
  }
}

std::int64_t totalElements(const std::vector<at::Tensor>& parameters) {
  std::int64_t total = 0;
  for (const at::Tensor& parameter : parameters) total += parameter.numel();
  return total;
}

}  // namespace

std::vector<std::int64_t> shardBounds(std::int64_t elements, const std::vector<double>& fractions) {
  CHORUS_CHECK_CONFIG(!fractions.empty(), "ZeRO: no shard fractions");
  // The balancer's proportional split (largest remainder): the sizes sum to `elements` exactly.
  std::vector<std::int64_t> bounds{0};
  for (std::int64_t size : plan::proportionalShares(elements, fractions))
    bounds.push_back(bounds.back() + size);
  return bounds;
}

std::vector<int> flatOrder(const std::vector<std::vector<int>>& bucket_layout) {
  std::vector<int> order;
  for (const auto& bucket : bucket_layout) order.insert(order.end(), bucket.begin(), bucket.end());
  return order;
}

ZeroOptimizer::ZeroOptimizer(int stage, std::vector<at::Tensor> parameters, std::vector<int> order,
                             std::vector<std::int64_t> bounds,
                             std::shared_ptr<comm::Communicator> communicator,
                             const MakeOptimizer& make, bool redundant)
    : stage_(stage),
      parameters_(std::move(parameters)),
      order_(std::move(order)),
      bounds_(std::move(bounds)),
      communicator_(std::move(communicator)),
      rank_(communicator_->rank()) {
  CHORUS_CHECK_CONFIG(stage_ >= 1 && stage_ <= 3, "ZeRO: stage ", stage_,
                      " is not one of 1, 2 and 3");
  CHORUS_CHECK_CONFIG(order_.size() == parameters_.size(), "ZeRO: the flat order lists ",
                      order_.size(), " of ", parameters_.size(), " parameters");
  CHORUS_CHECK_CONFIG(static_cast<int>(bounds_.size()) == communicator_->size() + 1 &&
                          bounds_.front() == 0 && bounds_.back() == totalElements(parameters_) &&
                          std::is_sorted(bounds_.begin(), bounds_.end()),
                      "ZeRO: shard bounds do not split the ", totalElements(parameters_),
                      " parameters over ", communicator_->size(), " ranks");
  for (const at::Tensor& parameter : parameters_)
    CHORUS_CHECK_CONFIG(parameter.scalar_type() == at::kFloat && parameter.is_contiguous(),
                        "ZeRO: parameters must be contiguous fp32 (master weights)");
  initSlice(own_, bounds_[rank_], bounds_[rank_ + 1], make);
  if (redundant && communicator_->size() > 1) {
    replica_ = std::make_unique<Slice>();
    initSlice(*replica_, bounds_[successor()], bounds_[successor() + 1], make);
  }
}

void ZeroOptimizer::initSlice(Slice& slice, std::int64_t begin, std::int64_t end,
                              const MakeOptimizer& make) {
  slice.begin = begin;
  slice.end = end;
  slice.master = at::empty({end - begin}, at::kFloat);
  loadMasterOf(slice, [&](int index) { return parameters_[index].detach(); });
  slice.master.set_requires_grad(true);
  slice.gradient = at::zeros_like(slice.master.detach());
  slice.master.mutable_grad() = slice.gradient;
  slice.optimizer = make({slice.master});
}

void ZeroOptimizer::loadMasterFromParameters() {
  loadMaster([&](int index) { return parameters_[index].detach(); });
}

void ZeroOptimizer::loadMaster(const std::function<at::Tensor(int index)>& value_of) {
  loadMasterOf(own_, value_of);
  if (replica_) loadMasterOf(*replica_, value_of);
}

void ZeroOptimizer::loadMasterOf(Slice& slice,
                                 const std::function<at::Tensor(int index)>& value_of) {
  at::NoGradGuard no_grad;
  forEachOverlap(
      parameters_, order_, slice.begin, slice.end,
      [&](int index, std::int64_t from, std::int64_t at, std::int64_t count) {
        const at::Tensor value = value_of(index);
        CHORUS_CHECK_CONFIG(value.numel() == parameters_[index].numel(), "ZeRO: ", value.numel(),
                            " values for parameter ", index, " of ", parameters_[index].numel());
        slice.master.narrow(0, at, count).copy_(value.reshape({-1}).narrow(0, from, count));
      });
}

at::Tensor ZeroOptimizer::gatherWhole() const {
  std::vector<std::int64_t> counts;
  for (size_t r = 0; r + 1 < bounds_.size(); ++r) counts.push_back(bounds_[r + 1] - bounds_[r]);
  at::Tensor whole = at::empty({bounds_.back()}, at::kFloat);
  at::Tensor mine = own_.master.detach();
  communicator_->allGatherV(mine, whole, counts).wait();
  return whole;
}

void ZeroOptimizer::takeGradientSlice() {
  takeGradientOf(own_);
  if (replica_) takeGradientOf(*replica_);
}

void ZeroOptimizer::takeGradientOf(Slice& slice) {
  at::NoGradGuard no_grad;
  forEachOverlap(parameters_, order_, slice.begin, slice.end,
                 [&](int index, std::int64_t from, std::int64_t at, std::int64_t count) {
                   at::Tensor slot = slice.gradient.narrow(0, at, count);
                   const at::Tensor& grad = parameters_[index].grad();
                   if (grad.defined())
                     slot.copy_(grad.reshape({-1}).narrow(0, from, count));
                   else
                     slot.zero_();
                 });
}

void ZeroOptimizer::exchangeReplicaGradients() {
  if (!replica_) return;
  const int ranks = communicator_->size();
  const int predecessor = (rank_ + ranks - 1) % ranks;
  std::vector<std::int64_t> send(ranks, 0), receive(ranks, 0);
  send[predecessor] = own_.end - own_.begin;
  receive[successor()] = replica_->end - replica_->begin;
  // Two ranks are each other's predecessor and successor: one exchange each way still.
  communicator_->allToAll(own_.gradient, replica_->gradient, send, receive).wait();
}

void ZeroOptimizer::stepSlices() {
  for (Slice* slice : {&own_, replica_.get()}) {
    if (slice == nullptr) continue;
    slice->master.mutable_grad() = slice->gradient;  // an optimizer's zero_grad may have unset it
    slice->optimizer->step();
  }
}

void ZeroOptimizer::gatherParameters() {
  if (stage_ >= 3) return;  // each layer is gathered from the slices when it runs
  at::NoGradGuard no_grad;
  const at::Tensor flat = gatherWhole();
  std::int64_t position = 0;
  for (int index : order_) {
    at::Tensor parameter = parameters_[index].detach();
    parameter.view({-1}).copy_(flat.narrow(0, position, parameter.numel()));
    position += parameter.numel();
  }
}

void ZeroOptimizer::step() {
  stepSlices();
  gatherParameters();
}

void ZeroOptimizer::clearGradients() {
  for (at::Tensor& parameter : parameters_) parameter.mutable_grad().reset();
}

std::map<std::string, at::Tensor> ZeroOptimizer::sliceState() const { return stateOf(own_); }

std::map<std::string, at::Tensor> ZeroOptimizer::replicaState() const { return stateOf(*replica_); }

std::map<std::string, at::Tensor> ZeroOptimizer::stateOf(const Slice& slice) const {
  std::map<std::string, at::Tensor> state;
  const auto found = slice.optimizer->state().find(slice.master.unsafeGetTensorImpl());
  if (found == slice.optimizer->state().end()) return state;
  if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(found->second.get())) {
    if (sgd->momentum_buffer().defined())
      state["momentum_buffer"] = sgd->momentum_buffer().detach().clone();
  } else if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(found->second.get())) {
    state["exp_avg"] = adamw->exp_avg().detach().clone();
    state["exp_avg_sq"] = adamw->exp_avg_sq().detach().clone();
    state["step"] = at::tensor({static_cast<double>(adamw->step())}, at::kDouble);
  } else {
    CHORUS_THROW(CheckpointError, "ZeRO: cannot save this optimizer's state (SGD and AdamW only)");
  }
  return state;
}

void ZeroOptimizer::loadWholeState(const std::map<std::string, at::Tensor>& whole) {
  for (Slice* slice : {&own_, replica_.get()}) {
    if (slice == nullptr) continue;
    std::map<std::string, at::Tensor> slices;
    for (const auto& [name, tensor] : whole) {
      if (name == "step") {
        slices[name] = tensor;
        continue;
      }
      if (tensor.numel() != bounds_.back())
        CHORUS_THROW(CheckpointError, "ZeRO: the saved optimizer state has no whole '", name,
                     "' of ", bounds_.back(), " elements");
      slices[name] = tensor.narrow(0, slice->begin, slice->end - slice->begin);
    }
    loadStateOf(*slice, slices);
  }
}

void ZeroOptimizer::loadMasterSlice(const at::Tensor& slice) {
  CHORUS_CHECK_CONFIG(slice.numel() == end() - begin(), "ZeRO: a slice of ", slice.numel(),
                      " parameter elements for one of ", end() - begin());
  at::NoGradGuard no_grad;
  own_.master.copy_(slice.reshape({-1}));
}

void ZeroOptimizer::loadReplicaMasterSlice(const at::Tensor& slice) {
  CHORUS_CHECK_CONFIG(slice.numel() == replicaEnd() - replicaBegin(), "ZeRO: a replica of ",
                      slice.numel(), " parameter elements for one of ",
                      replicaEnd() - replicaBegin());
  at::NoGradGuard no_grad;
  replica_->master.copy_(slice.reshape({-1}));
}

void ZeroOptimizer::loadSliceState(const std::map<std::string, at::Tensor>& slices) {
  loadStateOf(own_, slices);
}

void ZeroOptimizer::loadReplicaState(const std::map<std::string, at::Tensor>& slices) {
  loadStateOf(*replica_, slices);
}

void ZeroOptimizer::loadStateOf(Slice& target, const std::map<std::string, at::Tensor>& slices) {
  auto& states = target.optimizer->state();
  void* key = target.master.unsafeGetTensorImpl();
  if (slices.empty()) {
    states.erase(key);
    return;
  }
  const std::int64_t length = target.end - target.begin;
  const auto slice = [&](const char* name) {
    const auto found = slices.find(name);
    if (found == slices.end() || found->second.numel() != length)
      CHORUS_THROW(CheckpointError, "ZeRO: the saved optimizer state has no '", name,
                   "' for this rank's slice of ", length, " elements");
    return found->second.reshape({-1}).clone();
  };
  if (slices.count("momentum_buffer") > 0) {
    auto state = std::make_unique<torch::optim::SGDParamState>();
    state->momentum_buffer(slice("momentum_buffer"));
    states[key] = std::move(state);
    return;
  }
  auto state = std::make_unique<torch::optim::AdamWParamState>();
  state->exp_avg(slice("exp_avg"));
  state->exp_avg_sq(slice("exp_avg_sq"));
  const auto step = slices.find("step");
  if (step == slices.end())
    CHORUS_THROW(CheckpointError, "ZeRO: the saved AdamW state has no step");
  state->step(static_cast<std::int64_t>(step->second.item<double>()));
  states[key] = std::move(state);
}

}  // namespace chorus::parallel
