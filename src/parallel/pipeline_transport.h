// Private to the parallel layer: the point-to-point link of one pipeline stage to its neighbours.
//
// Activations go forward to the next stage's rank, gradients back to the previous one, each as an
// asynchronous send or receive with the operation's deadline. Tags make every transfer of a step
// distinct (activation m: 2m, its gradient: 2m + 1), so a receive can be posted early and matches
// exactly its send. The receiver learns the activation's shape and dtype from a small header sent
// with the first activation of each step (every micro-batch of a step has the same trailing
// dimensions; its first dimension is the micro-batch size both sides know); a gradient has the
// shape of the activation it belongs to, and its format (gradientWireType).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "chorus/comm/communicator.h"

namespace chorus::parallel::detail {

// The format a gradient crosses in, given its activation's: the same, except fp32 for an fp16
// activation. Why: gradients cross unscaled (each fp16 stage scales only its own backward,
// precision.h), and small unscaled gradients flush to zero in fp16's range; bf16 has fp32's range.
at::ScalarType gradientWireType(at::ScalarType activation);

// One stage's transfers. Used by the stage's thread only (the communicator's rule: one issuing
// thread). Non-copyable. Tensors being sent or received are kept alive until their Work finished.
class StageLink {
 public:
  // `previous` / `next`: ranks of the neighbouring stages in `communicator`, -1 for none.
  // Received activations and gradients are allocated on `device` (the stage's parameters').
  StageLink(std::shared_ptr<comm::Communicator> communicator, int previous, int next,
            std::chrono::milliseconds timeout, at::Device device);
  StageLink(const StageLink&) = delete;
  StageLink& operator=(const StageLink&) = delete;

  // Starts a step whose micro-batches have `sizes` samples; forgets the previous step's shapes.
  void beginStep(std::vector<std::int64_t> sizes);

  // To the next stage; `output` is copied only if not contiguous.
  void sendActivation(int micro_batch, const at::Tensor& output);
  // Posts the receive of micro-batch m's activation if its shape is known and it is not posted.
  void postActivation(int micro_batch);
  // Blocks until micro-batch m's activation from the previous stage arrived.
  at::Tensor receiveActivation(int micro_batch);

  // To the previous stage, in gradientWireType() of the activation received for micro-batch m.
  void sendGradient(int micro_batch, const at::Tensor& gradient);
  // Posts the receive of micro-batch m's gradient if its activation was sent and it is not posted.
  void postGradient(int micro_batch);
  at::Tensor receiveGradient(int micro_batch);

  // Waits for every send of the step (their receivers consumed them).
  void finishStep();

  // Seconds spent blocked in receives and sends since beginStep().
  double waitSeconds() const { return wait_seconds_; }

 private:
  struct Transfer {
    // The tensor on the wire, alive until the transfer finished.
    at::Tensor tensor;
    comm::Work work;
  };
  void send(const at::Tensor& tensor, int peer, int tag);
  void post(int micro_batch, bool gradient);
  at::Tensor receive(int micro_batch, bool gradient);
  void receiveHeader();
  void wait(comm::Work& work);
  void reapSends();

  std::shared_ptr<comm::Communicator> communicator_;
  int previous_;
  int next_;
  comm::OpOptions options_;
  at::Device device_;
  std::vector<std::int64_t> sizes_;
  bool header_sent_ = false;
  // The activation layout of this step, once known: dtype and full shape of micro-batch 0.
  bool header_known_ = false;
  at::ScalarType activation_dtype_ = at::kFloat;
  std::vector<std::int64_t> activation_shape_;
  // Shapes and dtypes of the activations this stage sent, for the gradients coming back.
  struct Layout {
    std::vector<std::int64_t> shape;
    at::ScalarType dtype;
  };
  std::map<int, Layout> sent_layouts_;
  std::map<std::pair<int, bool>, Transfer> receives_;  // (micro-batch, gradient?) -> posted
  std::vector<Transfer> sends_;
  double wait_seconds_ = 0;
};

}  // namespace chorus::parallel::detail
