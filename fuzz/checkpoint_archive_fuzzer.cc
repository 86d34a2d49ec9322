// Fuzz target: the checkpoint archive reader: libtorch's archive format (a zip of pickled tensors)
// as chorus reads a rank's state and a model from a checkpoint (runtime/checkpoint_archive.h,
// trainer_checkpoint.cc), inside translateRestoreErrors as the trainer runs it. Whatever the
// bytes, the answer is the data or a CheckpointError; libtorch's own errors (c10::Error) must be
// translated, never escape.
//
// Input: the archive's bytes. Seeds are archives written by chorus (model, rank state).
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "checkpoint/checkpoint_archive.h"
#include "chorus/model/model_config.h"
#include "fuzz_support.h"

namespace {

// A small MLP like the ones chorus trains, made afresh for each input (loading replaces its
// tensors); the fuzzer's model archives are loaded into it.
std::shared_ptr<chorus::model::ZooModel> smallModel() {
  chorus::model::ModelConfig config;
  config.kind = "mlp";
  config.input_shape = {4};
  config.hidden = {3};
  config.classes = 2;
  return chorus::model::makeModel(config, 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace chorus;
  fuzz::quietLogs();
  const std::string bytes = fuzz::asText(data, size);
  fuzz::guarded([&] {
    runtime::translateRestoreErrors("fuzz", [&] {
      torch::serialize::InputArchive archive = runtime::archiveOf(bytes);
      // A rank's state (restoreRankState): the generator and the loss scale.
      at::Tensor rng, scale;
      if (archive.try_read("rng_cpu", rng))
        runtime::setGeneratorState(at::detail::createCPUGenerator(), rng);
      if (archive.try_read("loss_scale", scale)) {
        scale[0].item<double>();
        scale[1].item<double>();
      }
      // A model (loadModel): every parameter and buffer by name.
      torch::NoGradGuard no_grad;
      auto model = smallModel();
      for (auto& item : model->named_parameters()) archive.read(item.key(), item.value());
      for (auto& item : model->named_buffers()) archive.read(item.key(), item.value(), true);
    });
  });
  return 0;
}
