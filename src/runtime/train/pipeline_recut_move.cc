// A move of the pipeline's cut (pipeline_recut.h): the layers that change stage travel, with
// their optimizer state, from the rank that trained them to the one that takes them, and every
// rank rebuilds its engine and optimizer over its new stage.
//
// Wire format, per group of consecutive layers that go from stage a to stage b of a replica
// (every rank derives the same groups from the two cuts): a header of int64 — the optimizer's
// kind (0 none, 1 SGD, 2 AdamW), then per parameter whether it has state, its AdamW step and
// whether it has max_exp_avg_sq — then one flat tensor of the parameters' values followed by
// their state tensors, parameter by parameter. The receiver knows the parameters' shapes: every
// rank builds the whole model (and holds the values of its stage's layers only).
#include <ATen/ATen.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include "chorus/core/error.h"
#include "chorus/parallel/storage_bytes.h"
#include "train/pipeline_recut.h"
#include "train/pipeline_stage_engine.h"

namespace chorus::runtime {
namespace {

// Above any activation (2m) or gradient (2m + 1) tag of a step.
constexpr int kTagBase = 1 << 24;

enum Kind : std::int64_t { kNone = 0, kSgd = 1, kAdamW = 2 };

Kind kindOf(torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<torch::optim::SGD*>(&optimizer)) return kSgd;
  if (dynamic_cast<torch::optim::AdamW*>(&optimizer)) return kAdamW;
  CHORUS_THROW(ConfigError, "recut: the optimizer's state cannot be moved (SGD or AdamW only)");
}

int stageOf(const std::vector<int>& cuts, int layer) {
  int s = 0;
  while (cuts[s + 1] <= layer) ++s;
  return s;
}

// Consecutive layers [first, last) that go from stage `from` to stage `to`.
struct Group {
  int first, last, from, to;
};

std::vector<Group> movingGroups(const std::vector<int>& from, const std::vector<int>& to) {
  std::vector<Group> groups;
  for (int l = 0; l < from.back(); ++l) {
    const int a = stageOf(from, l), b = stageOf(to, l);
    if (a == b) continue;
    if (!groups.empty() && groups.back().last == l && groups.back().from == a &&
        groups.back().to == b)
      ++groups.back().last;
    else
      groups.push_back({l, l + 1, a, b});
  }
  return groups;
}

std::vector<at::Tensor> groupParameters(model::ZooModel& model, const Group& group) {
  std::vector<at::Tensor> parameters;
  for (int l = group.first; l < group.last; ++l)
    for (const at::Tensor& parameter : model.layerParameters(l))
      if (parameter.requires_grad()) parameters.push_back(parameter);
  return parameters;
}

// The state tensors of `state` in wire order (empty when there is none).
std::vector<at::Tensor> stateTensors(torch::optim::OptimizerParamState* state, Kind kind) {
  if (state == nullptr) return {};
  if (kind == kSgd) {
    const auto& sgd = static_cast<torch::optim::SGDParamState&>(*state);
    if (!sgd.momentum_buffer().defined()) return {};
    return {sgd.momentum_buffer()};
  }
  const auto& adamw = static_cast<torch::optim::AdamWParamState&>(*state);
  std::vector<at::Tensor> tensors{adamw.exp_avg(), adamw.exp_avg_sq()};
  if (adamw.max_exp_avg_sq().defined()) tensors.push_back(adamw.max_exp_avg_sq());
  return tensors;
}

torch::optim::OptimizerParamState* stateOf(torch::optim::Optimizer& optimizer,
                                           const at::Tensor& parameter) {
  auto& states = optimizer.state();
  const auto found = states.find(parameter.unsafeGetTensorImpl());
  return found == states.end() ? nullptr : found->second.get();
}

void send(PipelineStageEngine& s, const Group& group, int index, std::vector<comm::Work>& works,
          std::vector<at::Tensor>& keep) {
  torch::NoGradGuard no_grad;
  const Kind kind = kindOf(*s.optimizer);
  const std::vector<at::Tensor> parameters = groupParameters(*s.model, group);
  if (parameters.empty()) return;  // nothing to carry (the receiver knows it too)
  std::vector<std::int64_t> header{kind};
  std::vector<at::Tensor> flat;
  for (at::Tensor parameter : parameters) {
    torch::optim::OptimizerParamState* state = stateOf(*s.optimizer, parameter);
    const std::vector<at::Tensor> tensors = stateTensors(state, kind);
    const bool adamw = kind == kAdamW && !tensors.empty();
    header.push_back(tensors.empty() ? 0 : 1);
    header.push_back(adamw ? static_cast<torch::optim::AdamWParamState*>(state)->step() : 0);
    header.push_back(adamw && tensors.size() == 3 ? 1 : 0);
    flat.push_back(parameter.detach().reshape({-1}));
    for (const at::Tensor& tensor : tensors) flat.push_back(tensor.detach().reshape({-1}));
    // Trained elsewhere from now on: its gradient is not needed here.
    parameter.mutable_grad() = at::Tensor();
  }
  keep.push_back(at::tensor(header, at::kLong));
  keep.push_back(at::cat(flat).contiguous());
  const parallel::StagePosition me = s.position();
  const int peer = s.engine->layout().rankOf(me.replica, group.to);
  comm::OpOptions options;
  options.timeout = s.options.timeout;
  options.tag = kTagBase + 2 * index;
  works.push_back(s.worker->world()->send(keep[keep.size() - 2], peer, options));
  options.tag = kTagBase + 2 * index + 1;
  works.push_back(s.worker->world()->send(keep.back(), peer, options));
}

void receive(PipelineStageEngine& s, const Group& group, int index, ReceivedStates& received) {
  torch::NoGradGuard no_grad;
  const Kind kind = kindOf(*s.optimizer);
  const std::vector<at::Tensor> parameters = groupParameters(*s.model, group);
  if (parameters.empty()) return;
  const parallel::StagePosition me = s.position();
  const int peer = s.engine->layout().rankOf(me.replica, group.from);
  comm::OpOptions options;
  options.timeout = s.options.timeout;
  options.tag = kTagBase + 2 * index;
  at::Tensor header = at::empty({1 + 3 * static_cast<std::int64_t>(parameters.size())}, at::kLong);
  s.worker->world()->recv(header, peer, options).wait();
  const auto h = header.accessor<std::int64_t, 1>();
  CHORUS_CHECK_CONFIG(h[0] == kind, "recut: rank ", peer, " sent optimizer state of kind ", h[0],
                      ", this rank's is ", static_cast<std::int64_t>(kind));
  std::int64_t elements = 0;
  std::vector<int> counts;  // state tensors per parameter
  for (std::size_t p = 0; p < parameters.size(); ++p) {
    const int count = h[1 + 3 * p] == 0 ? 0 : kind == kSgd ? 1 : 2 + (h[3 + 3 * p] ? 1 : 0);
    counts.push_back(count);
    elements += parameters[p].numel() * (1 + count);
  }
  at::Tensor flat = at::empty({elements}, parameters.front().options().requires_grad(false));
  options.tag = kTagBase + 2 * index + 1;
  s.worker->world()->recv(flat, peer, options).wait();
  std::int64_t offset = 0;
  const auto next = [&](const at::Tensor& like) {
    at::Tensor part = flat.narrow(0, offset, like.numel()).view_as(like).clone();
    offset += like.numel();
    return part;
  };
  for (std::size_t p = 0; p < parameters.size(); ++p) {
    at::Tensor parameter = parameters[p];
    // A layer of another stage until now: this rank held its shape only.
    if (parallel::storageBytesDropped(parameter)) parallel::allocateStorageBytes(parameter);
    parameter.copy_(next(parameter));
    const void* key = parameter.unsafeGetTensorImpl();
    if (counts[p] == 0) continue;
    if (kind == kSgd) {
      auto state = std::make_unique<torch::optim::SGDParamState>();
      state->momentum_buffer(next(parameter));
      received[key] = std::move(state);
    } else {
      auto state = std::make_unique<torch::optim::AdamWParamState>();
      state->step(h[2 + 3 * p]);
      state->exp_avg(next(parameter));
      state->exp_avg_sq(next(parameter));
      if (counts[p] == 3) state->max_exp_avg_sq(next(parameter));
      received[key] = std::move(state);
    }
  }
}

}  // namespace

ReceivedStates exchangeLayers(PipelineStageEngine& s, const std::vector<int>& from,
                              const std::vector<int>& to) {
  const std::vector<Group> groups = movingGroups(from, to);
  const int me = s.position().stage;
  std::vector<comm::Work> works;
  std::vector<at::Tensor> keep;  // alive until the sends finished
  for (std::size_t g = 0; g < groups.size(); ++g)
    if (groups[g].from == me) send(s, groups[g], static_cast<int>(g), works, keep);
  ReceivedStates received;
  for (std::size_t g = 0; g < groups.size(); ++g)
    if (groups[g].to == me) receive(s, groups[g], static_cast<int>(g), received);
  for (comm::Work& work : works) work.wait();
  return received;
}

void rebuildStage(PipelineStageEngine& s, const std::vector<int>& cuts, ReceivedStates received) {
  // The old engine goes first: its reducer's destructor clears the parameters' gradient hooks,
  // which would take the new reducer's off the layers both hold. Its stage group and codec
  // engine live on in the resources.
  const parallel::PipelineResources resources = s.engineResources(s.engine.get());
  std::unique_ptr<torch::optim::Optimizer> old_optimizer = std::move(s.optimizer);
  s.engine.reset();
  s.engine = std::make_unique<parallel::PipelineEngine>(s.model, s.options, cuts, resources);
  s.holdStageLayersOnly();
  s.stage_cuts = cuts;
  s.attachUnscaler();
  s.optimizer = makeOptimizer(s.job.optimizer, s.engine->parameters());
  auto& states = s.optimizer->state();
  auto& old_states = old_optimizer->state();
  for (const at::Tensor& parameter : s.engine->parameters()) {
    void* key = parameter.unsafeGetTensorImpl();
    if (auto kept = old_states.find(key); kept != old_states.end())
      states[key] = std::move(kept->second);
    else if (auto got = received.find(key); got != received.end())
      states[key] = std::move(got->second);
  }
}

}  // namespace chorus::runtime
