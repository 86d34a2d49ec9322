#include "chorus/runtime/train/step_figures.h"

#include <ATen/ATen.h>

#include <array>

namespace chorus::runtime {
namespace {

// The wire form: doubles, exact for every field (sample counts stay far below 2^53).
constexpr int kFields = 8;

std::array<double, kFields> pack(const RankFigures& figures) {
  return {figures.compute_seconds,  figures.wait_seconds,
          figures.loss_sum,         figures.overflow ? 1.0 : 0.0,
          figures.stop ? 1.0 : 0.0, figures.loss_scale,
          figures.balance,          static_cast<double>(figures.samples)};
}

RankFigures unpack(const double* field) {
  RankFigures figures;
  figures.compute_seconds = field[0];
  figures.wait_seconds = field[1];
  figures.loss_sum = field[2];
  figures.overflow = field[3] > 0;
  figures.stop = field[4] > 0;
  figures.loss_scale = field[5];
  figures.balance = field[6];
  figures.samples = static_cast<std::int64_t>(field[7]);
  return figures;
}

template <typename Value, typename Field>
std::vector<Value> column(const std::vector<RankFigures>& ranks, Field field) {
  std::vector<Value> values;
  values.reserve(ranks.size());
  for (const RankFigures& rank : ranks) values.push_back(rank.*field);
  return values;
}

}  // namespace

StepFigures StepFigures::exchange(comm::Communicator& world, const RankFigures& mine, bool always) {
  if (world.size() == 1 && !always) return StepFigures({mine});
  const std::array<double, kFields> packed = pack(mine);
  const at::Tensor local =
      at::tensor(std::vector<double>(packed.begin(), packed.end()), at::kDouble);
  at::Tensor all = at::empty({kFields * world.size()}, at::kDouble);
  world.allGather(local, all).wait();
  const double* values = all.data_ptr<double>();
  std::vector<RankFigures> ranks;
  for (int rank = 0; rank < world.size(); ++rank) ranks.push_back(unpack(values + kFields * rank));
  return StepFigures(std::move(ranks));
}

bool StepFigures::anyOverflow() const {
  for (const RankFigures& rank : ranks_)
    if (rank.overflow) return true;
  return false;
}

bool StepFigures::anyStop() const {
  for (const RankFigures& rank : ranks_)
    if (rank.stop) return true;
  return false;
}

double StepFigures::lossSum() const {
  double total = 0;
  for (const RankFigures& rank : ranks_) total += rank.loss_sum;
  return total;
}

std::int64_t StepFigures::totalSamples() const {
  std::int64_t total = 0;
  for (const RankFigures& rank : ranks_) total += rank.samples;
  return total;
}

std::vector<double> StepFigures::computeSeconds() const {
  return column<double>(ranks_, &RankFigures::compute_seconds);
}
std::vector<double> StepFigures::waitSeconds() const {
  return column<double>(ranks_, &RankFigures::wait_seconds);
}
std::vector<double> StepFigures::lossScales() const {
  return column<double>(ranks_, &RankFigures::loss_scale);
}
std::vector<double> StepFigures::balance() const {
  return column<double>(ranks_, &RankFigures::balance);
}
std::vector<std::int64_t> StepFigures::samples() const {
  return column<std::int64_t>(ranks_, &RankFigures::samples);
}

}  // namespace chorus::runtime
