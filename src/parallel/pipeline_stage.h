// Private to the parallel layer: the compute of one pipeline stage, micro-batch by micro-batch.
//
// A stage runs layers [first, last) of a zoo model. Its forward keeps what the backward will need
// (the autograd graph, or with checkpointing only the stage's input or each layer's input), its
// backward back-propagates the next stage's gradient (or, on the last stage, the summed loss) and
// returns the gradient of the stage's input for the previous stage. Parameter gradients
// accumulate in .grad over the micro-batches of a step, as single-process gradient accumulation
// does.
//
// Precision: forwards (and recomputes) run under autocast to the stage's format; an activation
// from another stage is made fp32 before the first layer (a fp32 stage could not take a 16-bit
// one, and each stage then sees what it would see after an fp32 stage), and the one sent on is
// cast to the wire format. Loss scaling: the backward's seed (the loss on the last stage, the
// next stage's gradient elsewhere) is multiplied by the step's scale, so the parameter gradients
// arrive scaled (the caller's GradientUnscaler divides them), and the input gradient handed back
// is divided by it again: gradients cross stages unscaled, each fp16 stage scales its own.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "chorus/model/zoo_model.h"
#include "chorus/parallel/pipeline_layout.h"
#include "chorus/parallel/precision.h"

namespace chorus::parallel::detail {

// The states of the random generators a forward on `device` draws from: the CPU's, and the
// device's own when it is not the CPU (as torch.utils.checkpoint saves them). Value type.
struct RngState {
  at::Tensor cpu;
  at::Tensor device;
  c10::Device where = c10::Device(c10::kCPU);

  static RngState capture(c10::Device device);
  void restore() const;
};

// Used by the stage's thread only. Shares the model with its owner; touches only its layers.
class StageRunner {
 public:
  // `wire`: the format of the activations sent on (floating-point ones).
  StageRunner(std::shared_ptr<model::ZooModel> model, int first, int last, bool is_first,
              bool is_last, Checkpointing checkpointing, Precision precision, at::ScalarType wire);
  StageRunner(const StageRunner&) = delete;
  StageRunner& operator=(const StageRunner&) = delete;

  // Forgets the last step's losses and held-bytes peak; this step's backwards are seeded with
  // `loss_scale` times their gradient, and micro-batch `inject_overflow` (if >= 0) with infinity.
  // REQUIRES: nothing held.
  void beginStep(double loss_scale = 1.0, int inject_overflow = -1);
  // Runs micro-batch m's forward on `input` (the model input on the first stage, the previous
  // stage's activation otherwise). Returns the activation for the next stage, or, on the last
  // stage, an undefined tensor (the loss of `targets` is kept for the backward).
  at::Tensor forward(int micro_batch, const at::Tensor& input, const at::Tensor& targets);
  // Back-propagates micro-batch m from `output_gradient` (undefined on the last stage) and
  // returns the gradient of its input (undefined on the first stage).
  at::Tensor backward(int micro_batch, const at::Tensor& output_gradient);

  // Σ over this step's micro-batches of the summed per-sample loss (last stage; 0 elsewhere).
  double lossSum() const { return loss_sum_; }
  // The most bytes of tensors held between forwards and backwards during this step (inputs,
  // outputs, layer boundaries; not the graph's internals, which a MemoryAccount sees).
  std::uint64_t peakHeldBytes() const { return peak_held_bytes_; }
  Checkpointing checkpointing() const { return checkpointing_; }

 private:
  struct Held {
    // The stage's input (with checkpointing) or the graph's leaf input.
    at::Tensor input;
    // The output with its graph, or the loss on the last stage (no checkpointing).
    at::Tensor output;
    // kLayer: the input of every layer of the stage.
    std::vector<at::Tensor> boundaries;
    // With checkpointing: the random generators' states where each recomputed range (the stage,
    // or each layer) began its forward, so that its recompute draws the same dropout masks.
    std::vector<RngState> rng;
    at::Tensor targets;
    std::uint64_t bytes = 0;
  };
  at::Tensor leafOf(const at::Tensor& input, bool needs_gradient) const;
  // A floating-point activation from another stage as fp32 (the model input is left as it is).
  at::Tensor arrived(const at::Tensor& input) const;
  // The factor micro-batch m's backward is seeded with.
  double seedFactor(int micro_batch) const;
  // `gradient` (of a tensor of `dtype`) times the seed factor, in `dtype`; scaled in fp32 first,
  // so that a small gradient does not flush to zero in fp16 before it is scaled.
  at::Tensor seeded(const at::Tensor& gradient, at::ScalarType dtype, int micro_batch) const;
  // The input gradient handed back: divided by the loss scale again.
  at::Tensor unscaled(const at::Tensor& gradient) const;
  // Layers [first, last) under autocast to the stage's format.
  at::Tensor runLayers(int first, int last, const at::Tensor& x);
  // The summed loss of the last stage's output, under autocast as in single-process training.
  at::Tensor lossOf(const at::Tensor& output, const at::Tensor& targets);
  at::Tensor backwardLayers(int micro_batch, Held held, at::Tensor gradient);
  void hold(int micro_batch, Held held);

  std::shared_ptr<model::ZooModel> model_;
  int first_;
  int last_;
  bool is_first_;
  bool is_last_;
  Checkpointing checkpointing_;
  Precision precision_;
  at::ScalarType wire_;
  double loss_scale_ = 1.0;
  int inject_overflow_ = -1;
  std::map<int, Held> held_;
  std::uint64_t held_bytes_ = 0;
  std::uint64_t peak_held_bytes_ = 0;
  double loss_sum_ = 0;
};

}  // namespace chorus::parallel::detail
