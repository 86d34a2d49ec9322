// The job's datasets, and the model dimensions that follow from them.
#include <torch/torch.h>

#include "chorus/data/fashion_mnist.h"
#include "chorus/data/synthetic.h"
#include "chorus/data/text_corpus.h"
#include "train/trainer_state.h"

namespace chorus::runtime {
namespace {

TrainingData textData(const JobConfig& job, model::ModelConfig& model) {
  data::TextCorpusOptions options;
  options.context = model.context;
  options.test_fraction = job.data.test_fraction;
  options.split = data::Split::kTrain;
  TrainingData data;
  data.train = data::loadTextCorpus(job.data.path, options);
  options.split = data::Split::kTest;
  data.test = data::loadTextCorpus(job.data.path, options);
  model.vocab = data.train->numClasses();
  return data;
}

// Synthetic samples are pure functions of (seed, id): the "test" set is the first samples of the
// same stream, so evaluation measures fit, which is what synthetic jobs (tests, benchmarks) need.
TrainingData syntheticData(const JobConfig& job, model::ModelConfig& model) {
  const std::int64_t test_size = std::max<std::int64_t>(1, job.data.size / 4);
  TrainingData data;
  if (model.kind == "gpt") {
    data.train = std::make_shared<data::SyntheticTokens>(job.data.size, model.context, model.vocab,
                                                         job.seed);
    data.test =
        std::make_shared<data::SyntheticTokens>(test_size, model.context, model.vocab, job.seed);
  } else {
    data.train = std::make_shared<data::SyntheticClassification>(job.data.size, model.input_shape,
                                                                 model.classes, job.seed);
    data.test = std::make_shared<data::SyntheticClassification>(test_size, model.input_shape,
                                                                model.classes, job.seed);
  }
  return data;
}

}  // namespace

TrainingData makeTrainingData(const JobConfig& job, model::ModelConfig& model) {
  if (job.data.dataset == "text") return textData(job, model);
  if (job.data.dataset == "synthetic") return syntheticData(job, model);
  TrainingData data;
  data.train = data::loadFashionMnist(job.data.dir, data::Split::kTrain);
  data.test = data::loadFashionMnist(job.data.dir, data::Split::kTest);
  model.input_shape = data.train->sampleShape();
  model.classes = data.train->numClasses();
  return data;
}

std::unique_ptr<TrainingContext> startTraining(JobConfig job, std::shared_ptr<Worker> worker,
                                               bool share_parameters) {
  auto context = std::make_unique<TrainingContext>();
  TrainingContext& start = *context;
  start.job = std::move(job);
  start.worker = std::move(worker);
  start.data = makeTrainingData(start.job, start.job.model);
  data::SamplerOptions sampling;
  sampling.dataset_size = start.data.train->size();
  sampling.global_batch = start.job.train.global_batch;
  sampling.seed = start.job.seed;
  start.sampler = std::make_unique<data::GlobalSampler>(sampling);
  start.model = model::makeModel(start.job.model, start.job.seed);
  start.model->to(start.worker->device());
  // Dropout draws its masks from libtorch's default generators: seeded from the job and the rank,
  // a job draws the same masks every time it runs (and the recompute of activation checkpointing
  // can replay them); without this they depended on what ran in the process before.
  at::manual_seed(start.job.seed * 1000003ULL + static_cast<std::uint64_t>(start.worker->rank()));
  if (!share_parameters) return context;
  torch::NoGradGuard no_grad;
  // Through host memory: a world may hold CUDA beside CPU ranks, or two ranks of one GPU, where no
  // one backend carries a device tensor to everyone (comm.md, "Devices of several kinds"). Once,
  // at the start: its cost does not matter.
  for (auto& parameter : start.model->parameters()) {
    at::Tensor host = parameter.is_cpu() ? parameter : parameter.cpu();
    start.worker->world()->broadcast(host, 0).wait();
    if (!parameter.is_cpu()) parameter.copy_(host);
  }
  return context;
}

}  // namespace chorus::runtime
