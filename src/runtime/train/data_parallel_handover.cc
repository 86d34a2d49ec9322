// The data-parallel engine's part of elastic recovery: the member the new generation starts from
// hands over what every replica shares (the model, the optimizer state, the skipped steps) and
// the members' shares and balancer state (its knowledge of the survivors kept, nothing yet of a
// joiner); each rank keeps its own loss scale and codec memory. Under ZeRO the parameters and
// the optimizer state are not in it: they come back from the slices' replicas.
#include <ATen/ATen.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_archive.h"
#include "chorus/core/error.h"
#include "chorus/plan/survivors.h"
#include "job/balancer_settings.h"
#include "train/data_parallel_engine.h"

namespace chorus::runtime {
namespace {

constexpr const char* kHeader = "handover/header";
constexpr const char* kOptimizer = "handover/optimizer";
const std::string kModelPrefix = "handover/model/";

at::Tensor textTensor(const std::string& text) {
  at::Tensor tensor = at::empty({static_cast<std::int64_t>(text.size())}, at::kByte);
  if (!text.empty()) std::memcpy(tensor.data_ptr(), text.data(), text.size());
  return tensor;
}

std::string tensorText(const at::Tensor& tensor) {
  const at::Tensor bytes = tensor.contiguous();
  return std::string(static_cast<const char*>(bytes.data_ptr()), bytes.numel());
}

}  // namespace

std::string DataParallelEngine::handover(const std::vector<int>& kept,
                                         const std::vector<std::int64_t>& next_shares) {
  const nlohmann::json header = {{"shares", next_shares},
                                 {"balancer", balancerStateToJson(plan::survivorBalancerState(
                                                  balancer_->exportState(), kept, next_shares))},
                                 {"skipped_steps", skipped_steps_}};
  torch::serialize::OutputArchive archive;
  archive.write(kHeader, textTensor(header.dump()));
  torch::NoGradGuard no_grad;
  // ZeRO's parameters and optimizer state come from the slices and their replicas
  // (zero_replicas.h), not from one member.
  if (!zero_)
    for (const auto& item : model_->named_parameters())
      archive.write(kModelPrefix + item.key(), item.value().detach().cpu());
  for (const auto& item : model_->named_buffers())
    archive.write(kModelPrefix + item.key(), item.value().detach().cpu(), true);
  if (!zero_) {
    torch::serialize::OutputArchive optimizer_archive;
    optimizer_->save(optimizer_archive);
    archive.write(kOptimizer, optimizer_archive);
  }
  return archiveBytes(archive);
}

LocalCarry DataParallelEngine::localCarry() const {
  LocalCarry carry;
  if (scaler_) carry.loss_scale = scaler_->state();
  if (codec_) carry.codec = codec_->state();
  return carry;
}

void DataParallelEngine::adopt(const std::string& bytes, const LocalCarry& carry) {
  auto archive = archiveOf(bytes);
  at::Tensor header_text;
  archive.read(kHeader, header_text);
  const nlohmann::json header = nlohmann::json::parse(tensorText(header_text));
  {
    torch::NoGradGuard no_grad;
    if (!zero_)
      for (auto& item : model_->named_parameters()) {
        at::Tensor value;
        archive.read(kModelPrefix + item.key(), value);
        item.value().copy_(value);
      }
    for (auto& item : model_->named_buffers()) {
      at::Tensor value;
      archive.read(kModelPrefix + item.key(), value, true);
      item.value().copy_(value);
    }
  }
  if (!zero_) {
    torch::serialize::InputArchive optimizer_archive;
    archive.read(kOptimizer, optimizer_archive);
    optimizer_->load(optimizer_archive);
  }
  skipped_steps_ = header.at("skipped_steps").get<std::int64_t>();
  balancer_->importState(balancerStateFromJson(header.at("balancer")));
  if (!fixed_shares_.empty()) fixed_shares_ = header.at("shares").get<std::vector<std::int64_t>>();
  if (scaler_ && carry.loss_scale) scaler_->loadState(*carry.loss_scale);
  if (codec_ && !carry.codec.empty()) codec_->loadState(carry.codec);
}

}  // namespace chorus::runtime
