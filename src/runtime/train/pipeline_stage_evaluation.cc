// The pipeline engine's evaluation: forward only, through the pipeline, the test samples dealt to
// the replicas.
#include <ATen/ATen.h>
#include <torch/torch.h>

#include <deque>

#include "chorus/core/error.h"
#include "chorus/parallel/precision.h"
#include "train/pipeline_stage_engine.h"

namespace chorus::runtime {
namespace {

// Evaluation transfers get tags far above the engine's (2m, 2m + 1 for micro-batch m), so they
// can never be confused with a training step's.
constexpr int kEvalTagBase = 1 << 24;
// An activation's shape travels ahead of it: rank, sizes (kMaxDims at most), dtype.
constexpr int kMaxDims = 6;
constexpr int kHeaderLength = kMaxDims + 2;

// An activation's send stays in flight while the stage computes its next chunk; its tensors must
// live that long. At most this many are held: the whole test split's activations would not fit a
// stage's memory budget (the first stage of a GPT held 26 MiB of them, where training peaks at 6).
constexpr std::size_t kSendsInFlight = 2;

struct PendingSend {
  at::Tensor header;
  at::Tensor tensor;
  comm::Work header_work;
  comm::Work tensor_work;
};

comm::OpOptions tagged(const PipelineStageEngine& s, int tag) {
  comm::OpOptions options;
  options.timeout = s.options.timeout;
  options.tag = tag;
  return options;
}

void sendActivation(PipelineStageEngine& s, int chunk, const at::Tensor& output,
                    std::deque<PendingSend>& pending) {
  CHORUS_CHECK_CONFIG(output.dim() <= kMaxDims, "pipeline evaluation: activations of ",
                      output.dim(), " dimensions (at most ", kMaxDims, ")");
  std::vector<std::int64_t> header(kHeaderLength, 0);
  header[0] = output.dim();
  for (std::int64_t d = 0; d < output.dim(); ++d) header[1 + d] = output.size(d);
  header[kHeaderLength - 1] = static_cast<std::int64_t>(output.scalar_type());
  const int next = s.engine->layout().rankOf(s.position().replica, s.position().stage + 1);
  PendingSend send;
  send.header = at::tensor(header, at::kLong);
  send.tensor = output.contiguous();
  comm::Communicator& world = *s.worker->world();
  send.header_work = world.send(send.header, next, tagged(s, kEvalTagBase + 2 * chunk));
  send.tensor_work = world.send(send.tensor, next, tagged(s, kEvalTagBase + 2 * chunk + 1));
  pending.push_back(std::move(send));
  while (pending.size() > kSendsInFlight) {
    pending.front().header_work.wait();
    pending.front().tensor_work.wait();
    pending.pop_front();
  }
}

at::Tensor receiveActivation(PipelineStageEngine& s, int chunk) {
  const int previous = s.engine->layout().rankOf(s.position().replica, s.position().stage - 1);
  comm::Communicator& world = *s.worker->world();
  at::Tensor header = at::empty({kHeaderLength}, at::kLong);
  world.recv(header, previous, tagged(s, kEvalTagBase + 2 * chunk)).wait();
  const auto values = header.accessor<std::int64_t, 1>();
  std::vector<std::int64_t> sizes;
  for (std::int64_t d = 0; d < values[0]; ++d) sizes.push_back(values[1 + d]);
  at::Tensor input =
      at::empty(sizes, at::TensorOptions()
                           .dtype(static_cast<at::ScalarType>(values[kHeaderLength - 1]))
                           .device(s.worker->device()));
  world.recv(input, previous, tagged(s, kEvalTagBase + 2 * chunk + 1)).wait();
  return input;
}

// The first `limit` test samples (all when 0), dealt to the replicas in contiguous, nearly equal
// slices.
std::vector<std::int64_t> replicaEvaluationIds(std::int64_t test_size, std::int64_t limit,
                                               int replica, int replicas) {
  const std::int64_t total = limit > 0 ? std::min(limit, test_size) : test_size;
  const std::int64_t begin = total * replica / replicas, end = total * (replica + 1) / replicas;
  std::vector<std::int64_t> ids;
  for (std::int64_t id = begin; id < end; ++id) ids.push_back(id);
  return ids;
}

}  // namespace

std::pair<double, double> PipelineStageEngine::evaluate(std::int64_t samples) {
  PipelineStageEngine& s = *this;
  torch::NoGradGuard no_grad;
  s.model->eval();
  const auto ids =
      replicaEvaluationIds(s.data.test->size(), samples < 0 ? s.job.train.eval_samples : samples,
                           s.position().replica, s.options.replicas);
  const int first = s.engine->firstLayer(), last = s.engine->lastLayer();
  // correct predictions, predictions, summed loss, samples: counted on the last stages
  at::Tensor totals = at::zeros({4}, at::kDouble);
  std::deque<PendingSend> pending;
  int chunk = 0;
  const auto step = static_cast<std::size_t>(s.eval_chunk);
  for (std::size_t begin = 0; begin < ids.size(); begin += step, ++chunk) {
    const std::vector<std::int64_t> part(ids.begin() + begin,
                                         ids.begin() + std::min(ids.size(), begin + step));
    data::Batch batch;
    if (s.firstStage() || s.lastStage()) batch = s.data.test->get(part);
    // As in training: a received activation enters as fp32, the stage computes in its format
    // and sends in the wire format.
    at::Tensor input =
        s.firstStage() ? batch.inputs.to(s.worker->device()) : receiveActivation(s, chunk);
    if (!s.firstStage() && input.is_floating_point()) input = input.to(at::kFloat);
    parallel::AutocastScope autocast(s.worker->device().type(), s.options.precision);
    at::Tensor output = s.model->forwardRange(first, last, input);
    if (!s.lastStage()) {
      const at::ScalarType wire =
          s.options.fp32_transfers ? at::kFloat : parallel::scalarTypeOf(s.options.precision);
      if (output.is_floating_point()) output = output.to(wire);
      sendActivation(s, chunk, output, pending);
      continue;
    }
    const at::Tensor targets = batch.targets.to(s.worker->device());
    totals[0] += static_cast<double>(s.model->correct(output, targets));
    totals[1] += static_cast<double>(targets.numel());
    totals[2] += s.model->lossSum(output, targets).item<double>();
    totals[3] += static_cast<double>(part.size());
  }
  for (PendingSend& send : pending) {
    send.header_work.wait();
    send.tensor_work.wait();
  }
  s.worker->world()->allReduce(totals).wait();
  return evaluationResult(totals);
}

}  // namespace chorus::runtime
