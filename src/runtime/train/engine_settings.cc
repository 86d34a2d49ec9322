#include "train/engine_settings.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>

#include <ATen/ATen.h>

#include "chorus/device/discovery.h"

namespace chorus::runtime {

parallel::ReducerOptions reducerBuckets(const plan::CommPlan& comm) {
  parallel::ReducerOptions options;
  // At least one byte: a positive bucket_mb below a byte still means "as small as it gets".
  const auto bytesOf = [](double mib) {
    return std::max<std::int64_t>(1, static_cast<std::int64_t>(mib * (1 << 20)));
  };
  options.bucket_bytes = bytesOf(comm.bucket_mb);
  options.first_bucket_bytes = bytesOf(comm.first_bucket_mb);
  options.min_buckets = comm.min_buckets;
  options.overlap = comm.overlap;
  return options;
}

std::shared_ptr<parallel::GradientCodec> planCodec(const plan::CommPlan& comm) {
  if (comm.codec.kind == CodecKind::kNone) return nullptr;
  return parallel::makeCodec(comm.codec);
}

parallel::LossScalerOptions lossScalerOptions(const PrecisionSection& section, DeviceKind kind,
                                              const std::string& compute_capability) {
  const auto& chosen = kind == DeviceKind::kCuda ? section.loss_scale_cuda : section.loss_scale_cpu;
  parallel::LossScalerOptions options;
  options.init_scale = chosen.init;
  const bool before_ampere = !compute_capability.empty() && std::stod(compute_capability) < 8.0;
  if (kind == DeviceKind::kCuda && before_ampere && !chosen.init_given) options.init_scale = 4096;
  options.growth_factor = chosen.growth;
  options.backoff_factor = chosen.backoff;
  options.growth_interval = chosen.interval;
  return options;
}

std::string cudaComputeCapability(int index) {
  for (const device::DeviceInfo& info : device::discoverDevices())
    if (info.kind == DeviceKind::kCuda && info.index == index) return info.compute_capability;
  return "";
}

void writeScalerState(torch::serialize::OutputArchive& archive,
                      const parallel::DynamicLossScaler& scaler) {
  const parallel::LossScalerState state = scaler.state();
  archive.write("loss_scale",
                at::tensor({state.scale, static_cast<double>(state.clean_steps)}, at::kDouble));
}

void readScalerState(torch::serialize::InputArchive& archive, parallel::DynamicLossScaler& scaler) {
  at::Tensor saved;
  if (!archive.try_read("loss_scale", saved)) return;
  scaler.loadState({saved[0].item<double>(), static_cast<std::int64_t>(saved[1].item<double>())});
}

void writeCodecState(torch::serialize::OutputArchive& archive,
                     const parallel::GradientCodec& codec) {
  for (const auto& [key, value] : codec.state()) archive.write("codec/" + key, value.clone());
}

void readCodecState(torch::serialize::InputArchive& archive, parallel::GradientCodec& codec) {
  std::map<std::string, at::Tensor> state;
  for (const auto& key : archive.keys()) {
    if (key.rfind("codec/", 0) != 0) continue;
    at::Tensor value;
    archive.read(key, value);
    state[key.substr(6)] = value;
  }
  codec.loadState(state);
}

}  // namespace chorus::runtime
