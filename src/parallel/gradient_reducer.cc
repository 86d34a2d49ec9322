#include "chorus/parallel/gradient_reducer.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "chorus/core/clock.h"
#include "chorus/core/error.h"

namespace chorus::parallel {

struct GradientReducer::Bucket {
  int index = 0;
  std::vector<int> parameters;  // indices into parameters_
  std::int64_t elements = 0;
  std::int64_t flat_begin = 0;  // where the bucket starts in the launch-order flat space
  at::Tensor flat;              // the bucket's gradients, contiguous, for one all-reduce
  int pending = 0;              // parameters whose gradient is not final yet (this step)
  bool launched = false;
  comm::Work work;
  // A compressed reduce-scatter's decoding, once `work` finished (GradientCodec::Scatter).
  std::function<void()> complete;
};

namespace {

// Calls back after AccumulateGrad wrote a parameter's .grad: the gradient of this backward pass is
// then final for that parameter.
class ReadyHook : public torch::autograd::PostAccumulateGradHook {
 public:
  explicit ReadyHook(std::function<void()> ready) : ready_(std::move(ready)) {}
  void operator()(const torch::autograd::Variable&) override { ready_(); }

 private:
  std::function<void()> ready_;
};

}  // namespace

std::vector<std::vector<int>> bucketLayoutOf(const std::vector<at::Tensor>& parameters,
                                             const ReducerOptions& options) {
  if (options.first_bucket_bytes < 1 || options.bucket_bytes < 1 || options.min_buckets < 1 ||
      options.min_bucket_bytes < 1)
    CHORUS_THROW(ConfigError, "gradient reducer: bucket sizes and min_buckets must be positive");
  std::int64_t total_bytes = 0;
  for (const at::Tensor& parameter : parameters) total_bytes += parameter.numel() * 4;
  // ReducerOptions has the rule and its why.
  const std::int64_t spread = std::max(options.min_bucket_bytes, total_bytes / options.min_buckets);
  std::vector<std::vector<int>> layout;
  const auto capOf = [&](size_t bucket) {
    const std::int64_t cap = std::min(options.bucket_bytes, spread);
    return bucket == 0 ? std::min(options.first_bucket_bytes, cap) : cap;
  };
  // Buckets in reverse registration order: backward produces the last layers' gradients first,
  // so the first bucket fills first and its all-reduce overlaps the rest of backward.
  std::vector<int> current;
  std::int64_t current_bytes = 0;
  for (int index = static_cast<int>(parameters.size()) - 1; index >= 0; --index) {
    const std::int64_t bytes = parameters[index].numel() * 4;
    if (!current.empty() && current_bytes + bytes > capOf(layout.size())) {
      layout.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(index);
    current_bytes += bytes;
  }
  if (!current.empty()) layout.push_back(std::move(current));
  return layout;
}

GradientReducer::GradientReducer(std::vector<at::Tensor> parameters,
                                 std::shared_ptr<comm::Communicator> communicator,
                                 ReducerOptions options)
    : parameters_(std::move(parameters)),
      communicator_(std::move(communicator)),
      options_(options),
      bucket_of_(parameters_.size(), -1) {
  for (int index = 0; index < static_cast<int>(parameters_.size()); ++index)
    if (parameters_[index].scalar_type() != at::kFloat)
      CHORUS_THROW(ConfigError, "gradient reducer: parameter ", index,
                   " is not float32 (master weights are fp32)");
  for (const std::vector<int>& members : bucketLayoutOf(parameters_, options_)) {
    auto bucket = std::make_unique<Bucket>();
    for (int index : members) {
      bucket_of_[index] = static_cast<int>(buckets_.size());
      bucket->parameters.push_back(index);
      bucket->elements += parameters_[index].numel();
    }
    buckets_.push_back(std::move(bucket));
  }
  bucket_device_ = chooseBucketDevice();
  std::int64_t flat_begin = 0;
  for (size_t index = 0; index < buckets_.size(); ++index) {
    buckets_[index]->index = static_cast<int>(index);
    // ZeRO-2's buckets exist only from their release to the end of the step (release()).
    if (!scattering()) buckets_[index]->flat = newBucket(buckets_[index]->elements).zero_();
    buckets_[index]->flat_begin = flat_begin;
    flat_begin += buckets_[index]->elements;
  }
  if (scattering()) checkScatter(flat_begin);
  engine_ = options_.hierarchical;
  if (!engine_ && options_.codec && !scattering() && !alone()) {
    // One-rank groups make every rank a leader: the codec then runs among all ranks, on the
    // engine's own group and helper thread.
    comm::HierarchicalOptions engine_options;
    engine_options.name = "reducer.codec";
    engine_ = std::make_shared<comm::HierarchicalAllReduce>(
        communicator_, comm::Topology::singletons(communicator_->size()), engine_options);
  }
  for (size_t index = 0; index < parameters_.size(); ++index) {
    const int parameter = static_cast<int>(index);
    torch::autograd::impl::set_post_acc_grad_hooks(
        parameters_[index],
        std::make_unique<ReadyHook>([this, parameter] { onGradientReady(parameter); }));
  }
}

void GradientReducer::checkScatter(std::int64_t elements) const {
  const auto& bounds = options_.scatter_bounds;
  const int rank = communicator_->rank();
  if (options_.hierarchical)
    CHORUS_THROW(ConfigError,
                 "gradient reducer: a reduce-scatter (ZeRO stage 2) is flat; it takes no "
                 "hierarchy");
  if (options_.codec && !options_.codec->compressesReduceScatter())
    CHORUS_THROW(ConfigError, "gradient reducer: codec ", options_.codec->name(),
                 " cannot compress a reduce-scatter (ZeRO stage 2 and 3 take fp16 or bf16)");
  if (static_cast<int>(bounds.size()) != communicator_->size() + 1 || bounds.front() != 0 ||
      bounds.back() != elements || !std::is_sorted(bounds.begin(), bounds.end()))
    CHORUS_THROW(ConfigError, "gradient reducer: scatter bounds do not split the ", elements,
                 " gradient elements over ", communicator_->size(), " ranks");
  const at::Tensor& output = options_.scatter_output;
  if (!output.defined() || output.scalar_type() != at::kFloat || !output.is_contiguous() ||
      output.numel() != bounds[rank + 1] - bounds[rank])
    CHORUS_THROW(ConfigError,
                 "gradient reducer: the scatter output must be a contiguous fp32 "
                 "tensor of this rank's ",
                 bounds[rank + 1] - bounds[rank], " elements");
}

at::Device GradientReducer::chooseBucketDevice() const {
  for (const at::Tensor& parameter : parameters_)
    if (parameter.device() != parameters_.front().device())
      CHORUS_THROW(ConfigError, "gradient reducer: parameters on ", parameters_.front().device(),
                   " and on ", parameter.device(), "; one rank's parameters live on one device");
  if (scattering() && options_.scatter_output.defined()) return options_.scatter_output.device();
  if (!options_.device_buckets || parameters_.empty()) return at::kCPU;
  return parameters_.front().device();
}

at::Tensor GradientReducer::newBucket(std::int64_t elements) const {
  return at::empty({elements}, at::TensorOptions().dtype(at::kFloat).device(bucket_device_));
}

GradientReducer::~GradientReducer() {
  for (auto& parameter : parameters_)
    torch::autograd::impl::set_post_acc_grad_hooks(parameter, nullptr);
}

int GradientReducer::numBuckets() const { return static_cast<int>(buckets_.size()); }

std::vector<std::vector<int>> GradientReducer::bucketLayout() const {
  std::vector<std::vector<int>> layout;
  for (const auto& bucket : buckets_) layout.push_back(bucket->parameters);
  return layout;
}

void GradientReducer::armForFinalBackward() {
  for (auto& bucket : buckets_) {
    bucket->pending = static_cast<int>(bucket->parameters.size());
    bucket->launched = false;
  }
  next_to_launch_ = 0;
  held_.clear();
  timings_.clear();
  armed_ = true;
}

void GradientReducer::onGradientReady(int parameter) {
  if (!armed_ || !options_.overlap) return;
  Bucket& bucket = *buckets_[bucket_of_[parameter]];
  if (--bucket.pending == 0) launchReadyBuckets();
}

void GradientReducer::launchReadyBuckets() {
  while (next_to_launch_ < numBuckets() && buckets_[next_to_launch_]->pending == 0)
    release(*buckets_[next_to_launch_++]);
}

bool GradientReducer::launchNextHeld() {
  if (held_.empty()) return false;
  const int index = held_.front();
  held_.pop_front();
  launch(*buckets_[index]);
  return true;
}

int GradientReducer::heldBuckets() const { return static_cast<int>(held_.size()); }

void GradientReducer::release(Bucket& bucket) {
  noteCompletions();
  // A world of one sends nothing: the gradients stay where backward wrote them (finish() scales
  // them in place), so the copies into and out of the bucket are saved.
  if (alone()) {
    if (options_.hold_launch && options_.hold_launch(bucket.index))
      held_.push_back(bucket.index);
    else
      launch(bucket);
    return;
  }
  if (!bucket.flat.defined()) bucket.flat = newBucket(bucket.elements);
  std::int64_t offset = 0;
  for (int index : bucket.parameters) {
    const at::Tensor& parameter = parameters_[index];
    at::Tensor slot = bucket.flat.narrow(0, offset, parameter.numel());
    const at::Tensor& grad = parameter.grad();
    if (grad.defined())
      slot.copy_(grad.reshape({-1}));
    else
      slot.zero_();  // unused parameter, or no backward on this rank: contributes zero
    offset += parameter.numel();
  }
  // ZeRO stage 2 keeps no whole gradient: the bucket holds what the reduce-scatter needs.
  if (scattering())
    for (int index : bucket.parameters) parameters_[index].mutable_grad().reset();
  if (options_.hold_launch && options_.hold_launch(bucket.index))
    held_.push_back(bucket.index);
  else
    launch(bucket);
}

void GradientReducer::noteCompletions() {
  const auto now = std::chrono::steady_clock::now();
  for (BucketTiming& timing : timings_)
    if (timing.completed < timing.launched && buckets_[timing.bucket]->work.isCompleted())
      timing.completed = now;
}

void GradientReducer::launch(Bucket& bucket) {
  noteCompletions();
  bucket.launched = true;
  // A world of one: the sum over its ranks is the bucket as it is, and nothing crosses a link
  // for a codec to compress; a plain PyTorch loop runs no collective either.
  if (alone()) {
    bucket.work = comm::Work();
    return;
  }
  timings_.push_back({bucket.index, std::chrono::steady_clock::now(), {}});
  if (scattering()) {
    launchScatter(bucket);
    return;
  }
  if (!engine_) {
    bucket.work = communicator_->allReduce(bucket.flat, comm::ReduceOp::kSum);
    return;
  }
  comm::LeaderReduce leader_reduce;
  if (options_.codec) {
    FlatLayout layout;
    std::int64_t offset = 0;
    for (int index : bucket.parameters) {
      layout.entries.push_back(
          {"param" + std::to_string(index), offset, parameters_[index].sizes().vec()});
      offset += parameters_[index].numel();
    }
    leader_reduce = [codec = options_.codec, key = "bucket" + std::to_string(bucket.index), layout](
                        at::Tensor& tensor, comm::Communicator& leaders) {
      codec->allReduce(key, tensor, layout, leaders);
      // An overflow somewhere (the step will be skipped) must not live on in the codec's memory.
      if (!at::isfinite(tensor).all().item<bool>()) codec->forget(key, layout);
    };
  }
  bucket.work = engine_->allReduce(bucket.flat, comm::ReduceOp::kSum, std::move(leader_reduce));
}

void GradientReducer::launchScatter(Bucket& bucket) {
  const auto& bounds = options_.scatter_bounds;
  const std::int64_t first = bucket.flat_begin, last = first + bucket.elements;
  std::vector<std::int64_t> counts;
  for (size_t r = 0; r + 1 < bounds.size(); ++r)
    counts.push_back(
        std::max<std::int64_t>(0, std::min(last, bounds[r + 1]) - std::max(first, bounds[r])));
  const int rank = communicator_->rank();
  const std::int64_t start = counts[rank] > 0 ? std::max(first, bounds[rank]) - bounds[rank] : 0;
  at::Tensor mine = options_.scatter_output.narrow(0, start, counts[rank]);
  if (options_.codec) {
    GradientCodec::Scatter scatter = options_.codec->reduceScatter(
        "bucket" + std::to_string(bucket.index), bucket.flat, mine, counts, *communicator_);
    bucket.work = std::move(scatter.work);
    bucket.complete = std::move(scatter.complete);
    return;
  }
  bucket.work = communicator_->reduceScatterV(bucket.flat, mine, counts, comm::ReduceOp::kSum);
}

ReduceTiming GradientReducer::finish(std::int64_t global_batch) {
  if (global_batch < 1) CHORUS_THROW(ConfigError, "gradient reducer: global batch must be >= 1");
  if (!armed_) armForFinalBackward();
  while (launchNextHeld()) {
  }
  for (auto& bucket : buckets_) bucket->pending = 0;
  launchReadyBuckets();
  while (launchNextHeld()) {
  }
  ReduceTiming timing;
  Stopwatch clock;
  noteCompletions();
  for (BucketTiming& launched : timings_) {
    Bucket& bucket = *buckets_[launched.bucket];
    bucket.work.wait();
    if (bucket.complete) {
      bucket.complete();
      bucket.complete = nullptr;
    }
    if (launched.completed < launched.launched)
      launched.completed = std::chrono::steady_clock::now();
  }
  timing.wait_seconds = clock.seconds();
  timing.buckets = numBuckets();
  if (alone()) {
    scaleInPlace(1.0 / static_cast<double>(global_batch));
    armed_ = false;
    return timing;
  }
  writeGradients(1.0 / static_cast<double>(global_batch));
  if (scattering())
    for (auto& bucket : buckets_) {
      bucket->work = comm::Work();  // it may hold the bucket
      bucket->flat = at::Tensor();
    }
  armed_ = false;
  return timing;
}

void GradientReducer::writeGradients(double scale) {
  if (scattering()) {
    options_.scatter_output.mul_(scale);
    return;
  }
  for (auto& bucket : buckets_) {
    bucket->flat.mul_(scale);
    std::int64_t offset = 0;
    for (int index : bucket->parameters) {
      at::Tensor& parameter = parameters_[index];
      at::Tensor averaged =
          bucket->flat.narrow(0, offset, parameter.numel()).view(parameter.sizes());
      if (parameter.grad().defined())
        parameter.mutable_grad().copy_(averaged);
      else  // on the parameter's device, wherever the bucket lives
        parameter.mutable_grad() = at::empty_like(parameter).copy_(averaged);
      offset += parameter.numel();
    }
  }
}

void GradientReducer::scaleInPlace(double scale) {
  std::vector<at::Tensor> grads;
  for (at::Tensor& parameter : parameters_) {
    // An unused parameter, or no backward on this rank, contributes zero (as a bucket would).
    if (!parameter.grad().defined()) parameter.mutable_grad() = at::zeros_like(parameter);
    grads.push_back(parameter.mutable_grad());
  }
  // One fused pass scales them and notes a non-finite value (GradScaler's unscale kernel).
  const auto options = parameters_.front().options();
  found_inf_ = at::zeros({1}, options);
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, at::full({1}, scale, options));
}

bool GradientReducer::gradientsFinite() const {
  if (scattering()) return at::isfinite(options_.scatter_output).all().item<bool>();
  if (alone() && found_inf_.defined()) return found_inf_.item<float>() == 0.0f;
  // One fused pass over every bucket and one read: a check and a read per bucket cost 1.2-1.9 ms
  // a step on a CPU for 3-5 MiB of gradients (bench/single_device.py, 2026-12-04).
  std::vector<at::Tensor> flats;
  for (const auto& bucket : buckets_) flats.push_back(bucket->flat);
  if (flats.empty()) return true;
  at::Tensor found = at::zeros({1}, flats.front().options());
  at::_amp_foreach_non_finite_check_and_unscale_(flats, found,
                                                 at::ones({1}, flats.front().options()));
  return found.item<float>() == 0.0f;
}

void GradientReducer::finishLocal(std::int64_t local_batch) {
  if (scattering())
    CHORUS_THROW(ConfigError, "gradient reducer: local SGD does not combine with a scatter");
  if (local_batch < 0) CHORUS_THROW(ConfigError, "gradient reducer: local batch must be >= 0");
  for (auto& bucket : buckets_) {
    std::int64_t offset = 0;
    for (int index : bucket->parameters) {
      const at::Tensor& grad = parameters_[index].grad();
      at::Tensor slot = bucket->flat.narrow(0, offset, parameters_[index].numel());
      if (grad.defined())
        slot.copy_(grad.reshape({-1}));
      else
        slot.zero_();
      offset += parameters_[index].numel();
    }
  }
  writeGradients(local_batch > 0 ? 1.0 / static_cast<double>(local_batch) : 0.0);
  armed_ = false;
}

void GradientReducer::averageParameters(double weight) {
  if (scattering())
    CHORUS_THROW(ConfigError, "gradient reducer: local SGD does not combine with a scatter");
  if (!(weight >= 0)) CHORUS_THROW(ConfigError, "gradient reducer: weight must be >= 0");
  at::Tensor total = at::full({1}, weight, at::kDouble);
  communicator_->allReduce(total).wait();
  const double sum = total.item<double>();
  if (!(sum > 0)) CHORUS_THROW(ConfigError, "gradient reducer: the ranks' weights sum to zero");
  for (auto& bucket : buckets_) {
    std::int64_t offset = 0;
    for (int index : bucket->parameters) {
      bucket->flat.narrow(0, offset, parameters_[index].numel())
          .copy_(parameters_[index].detach().reshape({-1}))
          .mul_(weight);
      offset += parameters_[index].numel();
    }
    // Through the engine when there is one: a world without a native collective needs its bridge.
    if (engine_)
      engine_->allReduce(bucket->flat).wait();
    else
      communicator_->allReduce(bucket->flat).wait();
    bucket->flat.div_(sum);
    offset = 0;
    for (int index : bucket->parameters) {
      at::Tensor parameter = parameters_[index].detach();
      parameter.copy_(bucket->flat.narrow(0, offset, parameter.numel()).view(parameter.sizes()));
      offset += parameter.numel();
    }
  }
}

}  // namespace chorus::parallel
