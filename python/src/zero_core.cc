// ZeRO for the Python front (zero_core.h): the slices' sizes, the C++ ZeroOptimizer's master
// slice and gradient without its optimizer, and stage 3's whole-module gather.
#include "zero_core.h"

#include <ATen/ATen.h>

#include <cmath>
#include <numeric>
#include <string>

#include "chorus/core/error.h"
#include "chorus/plan/memory_model.h"

namespace chorus::python {
namespace {

// The memory model of a Python module as ZeRO's shards by memory see it: its parameters as one
// layer (stage 3 gathers the whole module at once), no activations (chorus cannot see a Python
// module's; the budgets' tenth spare and what the model leaves unsharded must cover them), the
// optimizer state of AdamW (8 bytes per parameter; SGD's is smaller, so this errs on the safe
// side).
plan::MemoryModel moduleMemory(const std::vector<at::Tensor>& parameters) {
  plan::ModelProfile profile;
  profile.name = "python-module";
  profile.activation_element_bytes = 4;
  plan::LayerProfile layer;
  layer.name = "module";
  for (const at::Tensor& parameter : parameters) layer.params += parameter.numel();
  profile.layers.push_back(layer);
  return plan::MemoryModel(profile);
}

}  // namespace

void checkZeroOptions(const ZeroOptions& options, int world) {
  CHORUS_CHECK_CONFIG(options.stage >= 0 && options.stage <= 3, "zero must be 0, 1, 2 or 3, got ",
                      options.stage);
  const std::string& shards = options.shards;
  CHORUS_CHECK_CONFIG(shards == "memory" || shards == "even" || shards == "list", "shards '",
                      shards, "' is unknown: expected \"memory\", \"even\" or a list of fractions");
  if (shards != "list") return;
  CHORUS_CHECK_CONFIG(static_cast<int>(options.fractions.size()) == world, "shards has ",
                      options.fractions.size(), " fractions for ", world, " ranks");
  double total = 0;
  for (const double fraction : options.fractions) {
    CHORUS_CHECK_CONFIG(std::isfinite(fraction) && fraction >= 0 && fraction <= 1,
                        "every shard fraction must be in [0, 1], got ", fraction);
    total += fraction;
  }
  CHORUS_CHECK_CONFIG(std::abs(total - 1) <= 1e-6, "shard fractions sum to ", total, ", not 1");
}

ZeroCore::ZeroCore(runtime::Worker& worker, std::vector<at::Tensor> parameters,
                   const ZeroOptions& options, parallel::ReducerOptions& reducing)
    : options_(options), parameters_(std::move(parameters)), world_(worker.world()) {
  const int world = world_->size();
  checkZeroOptions(options_, world);
  CHORUS_CHECK_CONFIG(options_.stage >= 1, "ZeroCore: stage 0 shards nothing");
  for (const at::Tensor& parameter : parameters_)
    CHORUS_CHECK_CONFIG(parameter.scalar_type() == at::kFloat && parameter.is_contiguous() &&
                            parameter.device().is_cpu(),
                        "DataParallel(zero=", options_.stage,
                        "): the parameters must be contiguous fp32 CPU tensors (ZeRO's slices "
                        "are fp32 master weights on the host), got ",
                        parameter.scalar_type(), " on ", parameter.device());
  fractions_ = shardFractions(worker, world);
  std::int64_t elements = 0;
  for (const at::Tensor& parameter : parameters_) elements += parameter.numel();
  const std::vector<std::int64_t> bounds = parallel::shardBounds(elements, fractions_);
  // No optimizer of ZeroOptimizer's own: the user's torch.optim steps views of the master slice.
  zero_ = std::make_unique<parallel::ZeroOptimizer>(
      options_.stage, parameters_,
      parallel::flatOrder(parallel::bucketLayoutOf(parameters_, reducing)), bounds, world_,
      [](std::vector<at::Tensor>) { return std::unique_ptr<torch::optim::Optimizer>(); });
  if (options_.stage >= 2) {
    reducing.scatter_bounds = bounds;
    reducing.scatter_output = zero_->gradientSlice();
  }
}

ZeroCore::~ZeroCore() = default;

std::vector<double> ZeroCore::shardFractions(runtime::Worker& worker, int world) const {
  const std::vector<double> even(world, 1.0 / world);
  if (options_.shards == "even") return even;
  if (options_.shards == "list") return options_.fractions;
  // "memory": every rank's budget (0: none), as [zero] sizes the slices of `chorus train`.
  const auto& budget = worker.identity().device.memory_budget;
  at::Tensor mine = at::full({1}, budget ? static_cast<std::int64_t>(*budget) : 0, at::kLong);
  at::Tensor all = at::empty({world}, at::kLong);
  world_->allGather(mine, all).wait();
  std::vector<double> usable;
  std::vector<std::string> names;
  for (int r = 0; r < world; ++r) {
    const std::int64_t bytes = all[r].item<std::int64_t>();
    if (bytes > 0) usable.push_back(0.9 * static_cast<double>(bytes));  // a tenth spare
    names.push_back("rank " + std::to_string(r));
  }
  if (usable.empty()) return even;
  CHORUS_CHECK_CONFIG(static_cast<int>(usable.size()) == world,
                      "shards=\"memory\" needs a "
                      "memory budget on every device or on none (",
                      usable.size(), " of ", world,
                      " have one); give each one (chorus run --devices cpu/2GiB,...), or pass "
                      "shards=\"even\" or a list");
  const plan::MemoryModel memory = moduleMemory(parameters_);
  std::vector<plan::StageMemoryRequest> requests(
      world, plan::zeroShardRequest(1, plan::Dtype::kFp32, options_.stage, world));
  return plan::zeroShardsByMemory(memory, requests, usable, names);
}

void ZeroCore::start() {
  zero_->loadMasterFromParameters();
  if (options_.stage < 3) return;
  std::vector<int> everything(parameters_.size());
  std::iota(everything.begin(), everything.end(), 0);
  // The gathers run outside autograd here, between the reducer's collectives on the world; a
  // group of their own still keeps them apart from buckets a slower device launches late.
  std::vector<int> everyone(world_->size());
  std::iota(everyone.begin(), everyone.end(), 0);
  layers_ = std::make_unique<parallel::ZeroLayers>(
      parameters_, std::vector<std::vector<int>>{everything}, zero_->order(), zero_->bounds(),
      zero_->masterSlice(), world_->subgroup(everyone, "python-zero-gather"));
  gathered_ = false;
}

std::vector<SlicePiece> ZeroCore::pieces() const {
  std::vector<SlicePiece> pieces;
  std::int64_t position = 0;
  const std::int64_t begin = zero_->begin(), end = zero_->end();
  for (const int index : zero_->order()) {
    const std::int64_t numel = parameters_[index].numel();
    const std::int64_t from = std::max(begin, position), to = std::min(end, position + numel);
    if (from < to) pieces.push_back({index, from - position, from - begin, to - from});
    position += numel;
  }
  return pieces;
}

void ZeroCore::gather() {
  if (!layers_ || gathered_) return;
  layers_->gatherAll();
  gathered_ = true;
}

void ZeroCore::release() {
  if (!layers_ || !gathered_) return;
  layers_->release();
  gathered_ = false;
}

void ZeroCore::takeGradients() {
  if (options_.stage == 1) zero_->takeGradientSlice();
  zero_->clearGradients();
}

void ZeroCore::gatherParameters() { zero_->gatherParameters(); }

void ZeroCore::loadMasterFromParameters() {
  CHORUS_CHECK_CONFIG(gathered_, "ZeRO-3: the parameters hold no values outside a step");
  zero_->loadMasterFromParameters();
}

}  // namespace chorus::python
