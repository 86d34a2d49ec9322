#include "chorus/plan/pipeline_partition.h"

#include <algorithm>
#include <limits>

#include "chorus/core/error.h"

namespace chorus::plan {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
// Caps above the first solution's worth trying before computing the uncapped minimum sum.
constexpr size_t kCapsBeforeTighterBound = 2;
// Initial capacity of a memo row (a stage's costs for growing layer counts).
constexpr size_t kRowReserve = 16;

// A state's Pareto entry: the best (sum, tail) of the suffix starting here, and how it continues.
struct Entry {
  double sum;
  double tail;
  int next;   // first layer of the next stage
  int index;  // entry in the next stage's front
  int tag;
};
using Front = std::vector<Entry>;

class Solver {
 public:
  Solver(int layers, int stages, int micro_batches, const StageCostFn& cost)
      : layers_(layers),
        stages_(stages),
        micro_batches_(micro_batches),
        cost_(cost),
        cache_(stages, std::vector<std::vector<StageCost>>(layers + 1)) {}

  // Stage cost with memoization; j in (i, lastStart]. Extends the cached row as needed.
  const StageCost& at(int s, int i, int j) {
    std::vector<StageCost>& row = cache_[s][i];
    if (row.empty()) row.reserve(kRowReserve);
    while (static_cast<int>(row.size()) < j - i)
      row.push_back(cost_(s, i, i + static_cast<int>(row.size()) + 1));
    return row[j - i - 1];
  }
  int firstStart(int s) const { return s; }
  int lastStart(int s) const { return layers_ - (stages_ - s); }
  int lastEnd(int s) const { return layers_ - (stages_ - s - 1); }

  // Smallest achievable bottleneck max_s t_s, or infinity when nothing fits or every bottleneck
  // exceeds `limit` (stages slower than `limit` are not considered, which keeps the scan short).
  double minBottleneck(double limit) {
    std::vector<double> next(layers_ + 1, kInfinity), current(layers_ + 1, kInfinity);
    next[layers_] = 0;
    for (int s = stages_ - 1; s >= 0; --s) {
      std::fill(current.begin(), current.end(), kInfinity);
      for (int i = firstStart(s); i <= lastStart(s); ++i) {
        for (int j = i + 1; j <= lastEnd(s); ++j) {
          const StageCost& c = at(s, i, j);
          if (!c.feasible || c.monotone >= current[i] || c.monotone > limit) break;
          if (c.time <= limit) current[i] = std::min(current[i], std::max(c.time, next[j]));
        }
      }
      std::swap(next, current);
    }
    return next[0];
  }

  // Smallest sum_s t_s of any feasible partition, without a cap (a lower bound on sum + tail for
  // the stopping rule; stages are only limited by what fits).
  double minSum() {
    std::vector<double> next(layers_ + 1, kInfinity), current(layers_ + 1, kInfinity);
    next[layers_] = 0;
    for (int s = stages_ - 1; s >= 0; --s) {
      std::fill(current.begin(), current.end(), kInfinity);
      for (int i = firstStart(s); i <= lastStart(s); ++i)
        for (int j = i + 1; j <= lastEnd(s); ++j) {
          const StageCost& c = at(s, i, j);
          if (!c.feasible) break;
          current[i] = std::min(current[i], c.time + next[j]);
        }
      std::swap(next, current);
    }
    return next[0];
  }

  // The Pareto DP under cap `cap`; returns the best partition (objective computed with its true
  // slowest stage) or nullopt. A forward pass first finds, per state, the smallest sum of the
  // stages before it; states no prefix reaches are skipped, and suffixes that cannot bring the
  // total under `bound` (prefix + sum + tail + (M - 1) * cap) are dropped.
  std::optional<Partition> solve(double cap, double bound) {
    const double allowance = micro_batches_ > 1 ? bound - (micro_batches_ - 1) * cap : bound;
    const std::vector<std::vector<double>> prefix = prefixSums(cap);
    std::vector<std::vector<Front>> fronts(stages_ + 1, std::vector<Front>(layers_ + 1));
    fronts[stages_][layers_].push_back({0, 0, -1, -1, 0});
    Front candidates;
    for (int s = stages_ - 1; s >= 0; --s) {
      for (int i = firstStart(s); i <= lastStart(s); ++i) {
        if (prefix[s][i] == kInfinity) continue;
        const double room = allowance - prefix[s][i];
        candidates.clear();
        for (int j = i + 1; j <= lastEnd(s); ++j) {
          const StageCost& c = at(s, i, j);
          if (!c.feasible || c.monotone > cap) break;
          if (c.time > cap) continue;
          // The rest's front runs by sum up and tail down; past the first entry whose tail is
          // under this stage's, max(tail) is this stage's and only larger sums follow.
          const Front& rest = fronts[s + 1][j];
          for (size_t k = 0; k < rest.size(); ++k) {
            const Entry entry{c.time + rest[k].sum, std::max(c.tail, rest[k].tail), j,
                              static_cast<int>(k), c.tag};
            if (entry.sum >= room) break;
            if (entry.sum + entry.tail < room) candidates.push_back(entry);
            if (rest[k].tail <= c.tail) break;
          }
        }
        fronts[s][i] = paretoFilter(candidates);
      }
    }
    const Front& top = fronts[0][0];
    if (top.empty()) return std::nullopt;
    size_t best = 0;
    for (size_t k = 1; k < top.size(); ++k)
      if (top[k].sum + top[k].tail < top[best].sum + top[best].tail) best = k;
    return rebuild(fronts, best);
  }

  // Every distinct feasible stage time in (low, high], ascending.
  std::vector<double> capsBetween(double low, double high) {
    std::vector<double> caps;
    for (int s = 0; s < stages_; ++s)
      for (int i = firstStart(s); i <= lastStart(s); ++i)
        for (int j = i + 1; j <= lastEnd(s); ++j) {
          const StageCost& c = at(s, i, j);
          if (!c.feasible || c.monotone > high) break;
          if (c.time > low && c.time <= high) caps.push_back(c.time);
        }
    std::sort(caps.begin(), caps.end());
    caps.erase(std::unique(caps.begin(), caps.end()), caps.end());
    return caps;
  }

 private:
  // prefix[s][i]: the smallest sum of stages 0..s-1 covering layers [0, i) under `cap`.
  std::vector<std::vector<double>> prefixSums(double cap) {
    std::vector<std::vector<double>> prefix(stages_ + 1,
                                            std::vector<double>(layers_ + 1, kInfinity));
    prefix[0][0] = 0;
    for (int s = 0; s < stages_; ++s)
      for (int i = firstStart(s); i <= lastStart(s); ++i) {
        if (prefix[s][i] == kInfinity) continue;
        for (int j = i + 1; j <= lastEnd(s); ++j) {
          const StageCost& c = at(s, i, j);
          if (!c.feasible || c.monotone > cap) break;
          if (c.time <= cap) prefix[s + 1][j] = std::min(prefix[s + 1][j], prefix[s][i] + c.time);
        }
      }
    return prefix;
  }

  static Front paretoFilter(Front& candidates) {
    std::sort(candidates.begin(), candidates.end(), [](const Entry& a, const Entry& b) {
      if (a.sum != b.sum) return a.sum < b.sum;
      if (a.tail != b.tail) return a.tail < b.tail;
      return a.next != b.next ? a.next < b.next : a.index < b.index;
    });
    Front front;
    for (const Entry& entry : candidates)
      if (front.empty() || entry.tail < front.back().tail) front.push_back(entry);
    return front;
  }

  Partition rebuild(const std::vector<std::vector<Front>>& fronts, size_t index) {
    Partition partition;
    partition.cuts.push_back(0);
    const Entry& top = fronts[0][0][index];
    partition.sum = top.sum;
    partition.tail = top.tail;
    int i = 0;
    for (int s = 0; s < stages_; ++s) {
      const Entry& entry = fronts[s][i][index];
      partition.slowest = std::max(partition.slowest, at(s, i, entry.next).time);
      partition.tags.push_back(entry.tag);
      partition.cuts.push_back(entry.next);
      i = entry.next;
      index = static_cast<size_t>(entry.index);
    }
    partition.objective = partition.sum + (micro_batches_ - 1) * partition.slowest + partition.tail;
    return partition;
  }

  int layers_, stages_, micro_batches_;
  const StageCostFn& cost_;
  std::vector<std::vector<std::vector<StageCost>>> cache_;
};

void checkArguments(int layers, int stages, int micro_batches) {
  CHORUS_CHECK_CONFIG(stages >= 1 && stages <= layers && micro_batches >= 1,
                      "partitionLayers: need 1 <= stages (", stages, ") <= layers (", layers,
                      ") and micro_batches >= 1");
}

bool better(const Partition& a, const std::optional<Partition>& b) {
  if (!b) return true;
  if (a.objective != b->objective) return a.objective < b->objective;
  return a.sum < b->sum;
}

}  // namespace

std::optional<Partition> partitionLayers(int layers, int stages, int micro_batches,
                                         const StageCostFn& cost, const PartitionOptions& options) {
  checkArguments(layers, stages, micro_batches);
  Solver solver(layers, stages, micro_batches, cost);
  std::optional<Partition> best;
  if (micro_batches == 1) {
    best = solver.solve(kInfinity, options.upper_bound);
  } else {
    // No plan with a bottleneck above `limit` can beat the upper bound.
    const double limit = (options.upper_bound - options.lower_bound) / (micro_batches - 1);
    const double lowest = solver.minBottleneck(limit);
    if (lowest == kInfinity) return std::nullopt;
    if ((micro_batches - 1) * lowest + options.lower_bound >= options.upper_bound)
      return std::nullopt;
    best = solver.solve(lowest, options.upper_bound);
    const double bound = std::min(options.upper_bound, best ? best->objective : kInfinity);
    double lower_bound = options.lower_bound;
    std::vector<double> caps =
        solver.capsBetween(lowest, (bound - lower_bound) / (micro_batches - 1));
    if (caps.size() > kCapsBeforeTighterBound) {
      // Many caps to try: the uncapped minimum sum usually rules most of them out.
      lower_bound = std::max(lower_bound, solver.minSum() * (1 - 1e-12));
      const double high = (bound - lower_bound) / (micro_batches - 1);
      caps.erase(std::upper_bound(caps.begin(), caps.end(), high), caps.end());
    }
    for (double cap : caps) {
      const double limit = std::min(options.upper_bound, best ? best->objective : kInfinity);
      if ((micro_batches - 1) * cap + lower_bound >= limit) break;
      std::optional<Partition> candidate = solver.solve(cap, limit);
      if (candidate && better(*candidate, best)) best = candidate;
    }
  }
  if (best && best->objective >= options.upper_bound) return std::nullopt;
  return best;
}

namespace {

void enumerate(int layers, int stages, int micro_batches, const StageCostFn& cost,
               std::vector<int>& cuts, std::optional<Partition>& best) {
  const int s = static_cast<int>(cuts.size()) - 1;
  if (s == stages) {
    if (cuts.back() != layers) return;
    Partition p;
    p.cuts = cuts;
    for (int k = 0; k < stages; ++k) {
      const StageCost c = cost(k, cuts[k], cuts[k + 1]);
      if (!c.feasible) return;
      p.sum += c.time;
      p.slowest = std::max(p.slowest, c.time);
      p.tail = std::max(p.tail, c.tail);
      p.tags.push_back(c.tag);
    }
    p.objective = p.sum + (micro_batches - 1) * p.slowest + p.tail;
    if (better(p, best)) best = p;
    return;
  }
  for (int j = cuts.back() + 1; j <= layers - (stages - s - 1); ++j) {
    cuts.push_back(j);
    enumerate(layers, stages, micro_batches, cost, cuts, best);
    cuts.pop_back();
  }
}

}  // namespace

std::optional<Partition> partitionLayersBruteForce(int layers, int stages, int micro_batches,
                                                   const StageCostFn& cost) {
  checkArguments(layers, stages, micro_batches);
  std::vector<int> cuts{0};
  std::optional<Partition> best;
  enumerate(layers, stages, micro_batches, cost, cuts, best);
  return best;
}

}  // namespace chorus::plan
