#include "chorus/runtime/job/memory_calibration.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <mutex>

#include "chorus/core/error.h"
#include "chorus/device/memory_meter.h"
#include "chorus/model/zoo_model.h"
#include "job/trained_model.h"

namespace chorus::runtime {
namespace {

// Two batch sizes: their difference per sample is the layer's per-sample figure, and what does
// not grow with the batch (parameter gradients, kernels' fixed scratch) cancels out.
constexpr std::int64_t kSmall = 2;
constexpr std::int64_t kLarge = 6;

// What layer `l` holds after its forward pass, and the peak of its backward pass above that, on
// `samples` samples.
struct LayerBytes {
  double kept = 0;
  double backward = 0;
};

LayerBytes measureLayer(model::ZooModel& model, std::int64_t l, const SyntheticBatch& sample) {
  const bool last = l + 1 == model.numLayers();
  at::Tensor input = sample.inputs;  // the batch's: ModelProfile::input_bytes counts it
  if (l > 0) {
    // The previous layer's output: counted there, so made before the account is entered.
    torch::NoGradGuard no_grad;
    input = model.forwardRange(0, l, sample.inputs).requires_grad_();
  }
  auto account = std::make_shared<device::MemoryAccount>();
  LayerBytes bytes;
  {
    device::MemoryAccount::Scope scope(account);
    at::Tensor output = model.forwardRange(l, l + 1, input);
    // Below the last layer the gradient of the output comes from the layer above: the product's
    // backward allocates it as that layer's would, and the engine frees it once used (a gradient
    // passed to backward() would stay alive through the whole pass).
    const at::Tensor root = last ? model.lossSum(output, sample.targets) : output.mul(1.0).sum();
    bytes.kept = static_cast<double>(account->bytesInUse());
    account->resetPeak();
    root.backward();
    bytes.backward = static_cast<double>(account->peakBytes()) - bytes.kept;
  }
  model.zero_grad(/*set_to_none=*/true);
  return bytes;
}

}  // namespace

plan::ModelProfile calibratedProfile(const model::ModelConfig& config, std::uint64_t seed,
                                     const std::string& name) {
  // One measurement at a time: a meter installed here is the process's only one.
  static std::mutex measuring;
  const std::lock_guard<std::mutex> lock(measuring);
  std::shared_ptr<device::MemoryMeter> meter;
  try {
    meter = device::MemoryMeter::install();
  } catch (const DeviceError&) {
    // Already installed (a test measuring its ranks): accounts charge through that one.
  }
  const GeneratorGuard generator;
  const auto model = model::makeModel(config, seed);
  model->train();
  const SyntheticBatch small = syntheticBatch(config, kSmall),
                       large = syntheticBatch(config, kLarge);
  const std::vector<model::LayerProfile> layers = model->profile();
  plan::ModelProfile profile;
  profile.name = name;
  profile.activation_element_bytes = 4;  // measured in fp32
  profile.input_bytes = static_cast<double>(small.inputs.nbytes()) / kSmall;
  profile.target_bytes = static_cast<double>(small.targets.nbytes()) / kSmall;
  const double samples = static_cast<double>(kLarge - kSmall);
  for (std::int64_t l = 0; l < model->numLayers(); ++l) {
    const LayerBytes a = measureLayer(*model, l, small), b = measureLayer(*model, l, large);
    plan::LayerProfile layer;
    layer.name = layers[l].name;
    layer.params = static_cast<double>(layers[l].parameters);
    layer.forward_flops = layers[l].forward_flops;
    layer.output_bytes = static_cast<double>(layers[l].activation_bytes);
    layer.activation_bytes = std::max(0.0, (b.kept - a.kept) / samples);
    layer.workspace_bytes = std::max(0.0, (b.backward - a.backward) / samples);
    profile.layers.push_back(layer);
  }
  profile.validate();
  return profile;
}

SyntheticBatch syntheticBatch(const model::ModelConfig& config, std::int64_t samples) {
  if (config.kind == "gpt")
    return {at::zeros({samples, config.context}, at::kLong),
            at::zeros({samples, config.context}, at::kLong)};
  std::vector<std::int64_t> shape{samples};
  shape.insert(shape.end(), config.input_shape.begin(), config.input_shape.end());
  return {at::zeros(shape, at::kFloat), at::zeros({samples}, at::kLong)};
}

GeneratorGuard::GeneratorGuard() : generator_(at::detail::getDefaultCPUGenerator()) {
  std::lock_guard<std::mutex> lock(generator_.mutex());
  state_ = generator_.get_state();
}

GeneratorGuard::~GeneratorGuard() {
  std::lock_guard<std::mutex> lock(generator_.mutex());
  generator_.set_state(state_);
}

double optimizerStateBytes(const OptimizerSection& optimizer) {
  if (optimizer.name == "adamw") return 8;  // m, v
  return optimizer.momentum > 0 ? 4 : 0;    // the momentum buffer
}

namespace {

bool anyBudget(const std::vector<DeviceSpec>& devices) {
  for (const DeviceSpec& device : devices)
    if (device.memory_budget) return true;
  return false;
}

plan::ModelProfile jobMemoryProfile(const JobConfig& job) {
  return calibratedProfile(trainedModelConfig(job), job.seed, job.model.kind);
}

plan::MemoryOptions jobMemoryOptions(const JobConfig& job) {
  return plan::MemoryOptions{optimizerStateBytes(job.optimizer)};
}

}  // namespace

plan::MemoryModel jobMemoryModel(const JobConfig& job) {
  return plan::MemoryModel(jobMemoryProfile(job), jobMemoryOptions(job));
}

std::shared_ptr<const plan::MemoryModel> memoryModelForBudgets(
    const JobConfig& job, const std::vector<DeviceSpec>& devices) {
  if (!anyBudget(devices)) return nullptr;
  return std::make_shared<const plan::MemoryModel>(jobMemoryModel(job));
}

void attachMemoryProfile(plan::Plan& plan, const JobConfig& job,
                         const std::vector<DeviceSpec>& devices) {
  if (!plan.memory_profile && anyBudget(devices)) plan.memory_profile = jobMemoryProfile(job);
}

plan::MemoryModel planMemoryModel(const JobConfig& job, const plan::Plan& plan) {
  if (plan.memory_profile) return plan::MemoryModel(*plan.memory_profile, jobMemoryOptions(job));
  return jobMemoryModel(job);
}

std::shared_ptr<const plan::MemoryModel> planMemoryModelForBudgets(
    const JobConfig& job, const plan::Plan& plan, const std::vector<DeviceSpec>& devices) {
  if (!anyBudget(devices)) return nullptr;
  return std::make_shared<const plan::MemoryModel>(planMemoryModel(job, plan));
}

}  // namespace chorus::runtime
