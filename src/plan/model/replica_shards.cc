// ZeRO shards by memory around the replicas (sharded_split.h). Rank r holds its slice and a
// replica of its successor's, both as large as a slice of their fraction, so its fraction and its
// successor's share its headroom: a cyclic system. Asking every rank for the same relative
// headroom gives a linear system that is singular for an even number of ranks (the alternating
// fractions cancel); the min-max of the used headroom is a small linear program instead.
#include <algorithm>
#include <cmath>

#include "chorus/core/error.h"
#include "chorus/core/units.h"
#include "chorus/plan/replica_shards.h"
#include "model/sharded_split.h"

namespace chorus::plan {
namespace {

constexpr double kEpsilon = 1e-12;
constexpr double kSmallestFraction = 1e-9;

// A dense simplex tableau for: maximize Σ x subject to A x ≤ b, x ≥ 0, with b > 0 (so the slack
// basis is feasible and no first phase is needed). Bland's rule: no cycling.
class Tableau {
 public:
  Tableau(std::vector<std::vector<double>> rows, std::vector<double> rhs)
      : n_(static_cast<int>(rhs.size())), basis_(n_) {
    for (int r = 0; r < n_; ++r) {
      std::vector<double> row(2 * n_ + 1, 0.0);
      for (int j = 0; j < n_; ++j) row[j] = rows[r][j];
      row[n_ + r] = 1;
      row[2 * n_] = rhs[r];
      table_.push_back(row);
      basis_[r] = n_ + r;
    }
    objective_.assign(2 * n_ + 1, 0.0);
    for (int j = 0; j < n_; ++j) objective_[j] = -1;
  }

  // The optimal x.
  std::vector<double> solve() {
    // Each pivot visits a new basis; the bound only guards against a numerical stall, which
    // would leave a feasible x (every pivot keeps it feasible), not an optimal one.
    for (int iteration = 0; iteration < 100 * n_ + 100; ++iteration) {
      int entering = -1;
      for (int j = 0; j < 2 * n_ && entering < 0; ++j)
        if (objective_[j] < -kEpsilon) entering = j;
      if (entering < 0) break;
      pivot(leavingRow(entering), entering);
    }
    std::vector<double> x(n_, 0.0);
    for (int r = 0; r < n_; ++r)
      if (basis_[r] < n_) x[basis_[r]] = table_[r][2 * n_];
    return x;
  }

 private:
  int leavingRow(int entering) const {
    int row = -1;
    double best = 0;
    for (int r = 0; r < n_; ++r) {
      if (table_[r][entering] <= kEpsilon) continue;
      const double ratio = table_[r][2 * n_] / table_[r][entering];
      if (row < 0 || ratio < best - kEpsilon ||
          (ratio <= best + kEpsilon && basis_[r] < basis_[row])) {
        row = r;
        best = ratio;
      }
    }
    // Every x is bounded by its own row (sharded > 0): some row always limits it.
    CHORUS_CHECK_CONFIG(row >= 0, "ZeRO shards by memory: the split is unbounded");
    return row;
  }

  void pivot(int row, int column) {
    std::vector<double>& p = table_[row];
    const double scale = p[column];
    for (double& value : p) value /= scale;
    for (int r = 0; r < n_; ++r)
      if (r != row) eliminate(table_[r], p, column);
    eliminate(objective_, p, column);
    basis_[row] = column;
  }

  static void eliminate(std::vector<double>& target, const std::vector<double>& p, int column) {
    const double factor = target[column];
    if (factor == 0) return;
    for (std::size_t j = 0; j < target.size(); ++j) target[j] -= factor * p[j];
  }

  int n_;
  std::vector<int> basis_;
  std::vector<std::vector<double>> table_;
  std::vector<double> objective_;
};

// The largest share of its headroom any rank uses under `fractions`.
double usedHeadroom(const std::vector<double>& fractions, const std::vector<double>& headroom,
                    double sharded, const std::vector<double>& replica) {
  const std::size_t n = fractions.size();
  double used = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const double successor = n > 1 ? replica[r] * fractions[(r + 1) % n] : 0;
    used = std::max(used, (sharded * fractions[r] + successor) / headroom[r]);
  }
  return used;
}

// A vertex of the linear program can leave ranks empty where a split nearer the proportional
// one is as good (equal devices: (1/2, 0, 1/2, 0) against (1/4, 1/4, 1/4, 1/4)): the furthest
// point towards the proportional split, on the segment from `best`, that uses no more headroom.
// The largest share used is convex along the segment, so the points that keep it form an
// interval from `best`, found by bisection.
std::vector<double> towardProportional(const std::vector<double>& best,
                                       const std::vector<double>& headroom, double sharded,
                                       const std::vector<double>& replica) {
  double total = 0;
  for (double h : headroom) total += h;
  std::vector<double> proportional;
  for (double h : headroom) proportional.push_back(h / total);
  const double limit = usedHeadroom(best, headroom, sharded, replica) * (1 + 1e-12);
  const auto blend = [&](double alpha) {
    std::vector<double> mixed;
    for (std::size_t r = 0; r < best.size(); ++r)
      mixed.push_back((1 - alpha) * best[r] + alpha * proportional[r]);
    return mixed;
  };
  if (usedHeadroom(proportional, headroom, sharded, replica) <= limit) return proportional;
  double low = 0, high = 1;
  for (int step = 0; step < 60; ++step) {
    const double middle = 0.5 * (low + high);
    (usedHeadroom(blend(middle), headroom, sharded, replica) <= limit ? low : high) = middle;
  }
  return blend(low);
}

}  // namespace

std::pair<std::vector<double>, double> shardsAroundReplicas(const std::vector<double>& headroom,
                                                            double sharded,
                                                            const std::vector<double>& replica) {
  const int n = static_cast<int>(headroom.size());
  CHORUS_CHECK_CONFIG(n >= 1 && replica.size() == headroom.size() && sharded > 0,
                      "ZeRO shards by memory: one headroom and replica size per rank");
  // In units of the sharded state, so that the tableau's numbers are near 1.
  std::vector<std::vector<double>> rows(n, std::vector<double>(n, 0.0));
  std::vector<double> rhs;
  for (int r = 0; r < n; ++r) {
    CHORUS_CHECK_CONFIG(headroom[r] > 0 && replica[r] >= 0, "ZeRO shards by memory: rank ", r,
                        " has no headroom");
    rows[r][r] += 1;
    if (n > 1) rows[r][(r + 1) % n] += replica[r] / sharded;
    rhs.push_back(headroom[r] / sharded);
  }
  std::vector<double> x = Tableau(rows, rhs).solve();
  double total = 0;
  for (double value : x) total += value;
  for (double& value : x) value /= total;
  return {towardProportional(x, headroom, sharded, replica), 1 / total};
}

std::vector<double> zeroShardsWithReplicas(const MemoryModel& memory,
                                           std::vector<StageMemoryRequest> requests,
                                           const std::vector<double>& usable,
                                           const std::vector<std::string>& names) {
  const auto [split, headroom] = shardedHeadroom(memory, std::move(requests), usable, names);
  auto [fractions, used] = shardsAroundReplicas(headroom, split.sharded, split.replica);
  // A rank may hold no slice (an empty one works); the memory model reads a fraction of 0 as
  // "even", so it gets a vanishing one instead.
  double total = 0;
  for (double& fraction : fractions) total += (fraction = std::max(fraction, kSmallestFraction));
  for (double& fraction : fractions) fraction /= total;
  CHORUS_CHECK_CONFIG(used <= 1 + 1e-9,
                      "ZeRO shards by memory: with each rank keeping a replica of its successor's "
                      "slice (zero.redundancy = 1) the devices cannot hold the sharded state of ",
                      formatBytes(static_cast<std::uint64_t>(split.sharded)),
                      ": the best split needs ", std::lround(100 * used),
                      "% of the headroom of the fullest device");
  return fractions;
}

}  // namespace chorus::plan
