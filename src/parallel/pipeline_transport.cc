#include "pipeline_transport.h"

#include <ATen/ATen.h>

#include "chorus/core/clock.h"
#include "chorus/core/error.h"

namespace chorus::parallel::detail {
namespace {

// Transfers of micro-batch m use tags 2m and 2m + 1; the header a tag no micro-batch reaches.
constexpr int kHeaderTag = 1 << 30;
// Header: dtype, number of dimensions, then the dimensions.
constexpr int kMaxDims = 8;
constexpr int kHeaderSlots = 2 + kMaxDims;

int tagOf(int micro_batch, bool gradient) { return 2 * micro_batch + (gradient ? 1 : 0); }

}  // namespace

at::ScalarType gradientWireType(at::ScalarType activation) {
  return activation == at::kHalf ? at::kFloat : activation;
}

StageLink::StageLink(std::shared_ptr<comm::Communicator> communicator, int previous, int next,
                     std::chrono::milliseconds timeout, at::Device device)
    : communicator_(std::move(communicator)), previous_(previous), next_(next), device_(device) {
  options_.timeout = timeout;
}

void StageLink::beginStep(std::vector<std::int64_t> sizes) {
  if (!receives_.empty() || !sends_.empty())
    CHORUS_THROW(CommError, "pipeline stage: a step began with transfers of the last one pending");
  sizes_ = std::move(sizes);
  header_sent_ = false;
  header_known_ = false;
  sent_layouts_.clear();
  wait_seconds_ = 0;
}

void StageLink::send(const at::Tensor& tensor, int peer, int tag) {
  comm::OpOptions options = options_;
  options.tag = tag;
  at::Tensor payload = tensor.contiguous();
  comm::Work work = communicator_->send(payload, peer, options);
  sends_.push_back(Transfer{std::move(payload), std::move(work)});
  reapSends();
}

void StageLink::sendActivation(int micro_batch, const at::Tensor& output) {
  if (next_ < 0) CHORUS_THROW(ConfigError, "the last pipeline stage has no next stage");
  if (!header_sent_) {
    CHORUS_CHECK_CONFIG(output.dim() >= 1 && output.dim() <= kMaxDims,
                        "a pipeline activation needs 1 to ", kMaxDims, " dimensions, got ",
                        output.sizes());
    at::Tensor header = at::zeros({kHeaderSlots}, at::kLong);
    header[0] = static_cast<std::int64_t>(output.scalar_type());
    header[1] = output.dim();
    for (int d = 0; d < output.dim(); ++d) header[2 + d] = output.size(d);
    send(header, next_, kHeaderTag);
    header_sent_ = true;
  }
  sent_layouts_[micro_batch] = Layout{output.sizes().vec(), output.scalar_type()};
  send(output.detach(), next_, tagOf(micro_batch, false));
}

void StageLink::sendGradient(int micro_batch, const at::Tensor& gradient) {
  if (previous_ < 0) CHORUS_THROW(ConfigError, "the first pipeline stage has no previous stage");
  if (!header_known_)
    CHORUS_THROW(ConfigError, "pipeline stage: gradient of micro-batch ", micro_batch,
                 " sent before its activation arrived");
  send(gradient.detach().to(gradientWireType(activation_dtype_)), previous_,
       tagOf(micro_batch, true));
}

void StageLink::receiveHeader() {
  at::Tensor header = at::empty({kHeaderSlots}, at::kLong);
  comm::OpOptions options = options_;
  options.tag = kHeaderTag;
  comm::Work work = communicator_->recv(header, previous_, options);
  wait(work);
  activation_dtype_ = static_cast<at::ScalarType>(header[0].item<std::int64_t>());
  const std::int64_t dims = header[1].item<std::int64_t>();
  if (dims < 1 || dims > kMaxDims)
    CHORUS_THROW(ProtocolError, "pipeline header from rank ", previous_, " has ", dims,
                 " dimensions");
  activation_shape_.assign(dims, 0);
  for (std::int64_t d = 0; d < dims; ++d) activation_shape_[d] = header[2 + d].item<std::int64_t>();
  header_known_ = true;
}

void StageLink::post(int micro_batch, bool gradient) {
  const auto key = std::make_pair(micro_batch, gradient);
  if (receives_.count(key) > 0) return;
  at::Tensor buffer;
  if (gradient) {
    const auto layout = sent_layouts_.find(micro_batch);
    if (layout == sent_layouts_.end())
      CHORUS_THROW(ConfigError, "pipeline stage: gradient of micro-batch ", micro_batch,
                   " expected before its activation was sent");
    buffer = at::empty(
        layout->second.shape,
        at::TensorOptions().dtype(gradientWireType(layout->second.dtype)).device(device_));
    sent_layouts_.erase(layout);
  } else {
    std::vector<std::int64_t> shape = activation_shape_;
    shape[0] = sizes_.at(micro_batch);
    buffer = at::empty(shape, at::TensorOptions().dtype(activation_dtype_).device(device_));
  }
  comm::OpOptions options = options_;
  options.tag = tagOf(micro_batch, gradient);
  comm::Work work = communicator_->recv(buffer, gradient ? next_ : previous_, options);
  receives_.emplace(key, Transfer{std::move(buffer), std::move(work)});
}

void StageLink::postActivation(int micro_batch) {
  if (previous_ >= 0 && header_known_) post(micro_batch, false);
}

void StageLink::postGradient(int micro_batch) {
  if (next_ >= 0 && sent_layouts_.count(micro_batch) > 0) post(micro_batch, true);
}

at::Tensor StageLink::receive(int micro_batch, bool gradient) {
  if (!gradient && !header_known_) receiveHeader();
  post(micro_batch, gradient);
  auto found = receives_.find(std::make_pair(micro_batch, gradient));
  Transfer transfer = std::move(found->second);
  receives_.erase(found);
  wait(transfer.work);
  return transfer.tensor;
}

at::Tensor StageLink::receiveActivation(int micro_batch) {
  if (previous_ < 0) CHORUS_THROW(ConfigError, "the first pipeline stage has no previous stage");
  return receive(micro_batch, false);
}

at::Tensor StageLink::receiveGradient(int micro_batch) {
  if (next_ < 0) CHORUS_THROW(ConfigError, "the last pipeline stage has no next stage");
  return receive(micro_batch, true);
}

void StageLink::wait(comm::Work& work) {
  Stopwatch clock;
  work.wait();
  wait_seconds_ += clock.seconds();
}

void StageLink::reapSends() {
  // Finished sends release their tensors at once, so memory does not grow over a long step.
  std::vector<Transfer> pending;
  for (Transfer& transfer : sends_) {
    if (transfer.work.isCompleted())
      transfer.work.wait();  // rethrows a failure, returns at once otherwise
    else
      pending.push_back(std::move(transfer));
  }
  sends_ = std::move(pending);
}

void StageLink::finishStep() {
  for (Transfer& transfer : sends_) wait(transfer.work);
  sends_.clear();
  if (!receives_.empty())
    CHORUS_THROW(CommError, "pipeline stage: ", receives_.size(),
                 " receives posted but never consumed in this step");
}

}  // namespace chorus::parallel::detail
