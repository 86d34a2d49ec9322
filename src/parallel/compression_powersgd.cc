// PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019): warm-started power iterations give a
// rank-r approximation of each gradient matrix, at two all-reduces of r(a + b) numbers per
// iteration and a×b matrix instead of one of ab.
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "chorus/core/error.h"
#include "compression_internal.h"

namespace chorus::parallel::detail {
namespace {

constexpr const char* kQPrefix = "q/";
constexpr const char* kCallsPrefix = "calls/";
// A column of P keeping no more than this fraction of its norm after the projections on the
// earlier columns is dependent on them. fp32 rounding of P = M Q leaves about 1e-6 of a column's
// norm on a rank-deficient M (measured up to 4096×4096); 1e-4 keeps a 25× margin, and a true
// direction this weak is delayed by error feedback, not lost.
constexpr double kDependent = 1e-4;

bool startsWith(const std::string& text, const char* prefix) { return text.rfind(prefix, 0) == 0; }

// One compressed matrix of a call.
struct Matrix {
  const FlatLayout::Entry* entry = nullptr;
  std::int64_t rows = 0, cols = 0, rank = 0;
  at::Tensor m;            // the (compensated) contribution, rows × cols
  at::Tensor p;            // rows × rank, the summed P, orthonormalized
  std::vector<bool> kept;  // columns of p that were not dependent
};

class PowerSgdCodec : public GradientCodec {
 public:
  using GradientCodec::GradientCodec;

  void allReduce(const std::string& key, at::Tensor& flat, const FlatLayout& given,
                 comm::Communicator& comm) override {
    if (warmingUp(key)) {
      if (flat.numel() > 0) comm.allReduce(flat).wait();
      countAllReduce(static_cast<std::int64_t>(flat.nbytes()), comm.size(),
                     static_cast<std::int64_t>(flat.nbytes()));
      return;
    }
    const FlatLayout layout = given.entries.empty() ? FlatLayout::whole(key, flat) : given;
    std::vector<Matrix> matrices;
    std::vector<const FlatLayout::Entry*> plain;
    classify(layout, flat, matrices, plain);
    // The uncompressed tensors ride with the first P; every iteration refines the warm Q.
    const int iterations = matrices.empty() ? 1 : options_.powersgd_iterations;
    const std::vector<const FlatLayout::Entry*> none;
    for (int iteration = 0; iteration < iterations; ++iteration) {
      const bool first = iteration == 0;
      reduceP(flat, matrices, first ? plain : none, comm, first);
      if (!matrices.empty()) reduceQ(flat, matrices, comm, iteration + 1 == iterations);
    }
  }

  void forget(const std::string& key, const FlatLayout& layout) override {
    GradientCodec::forget(key, layout);
    q_.erase(key);  // a layout of none is one matrix under the call's key
    for (const FlatLayout::Entry& entry : layout.entries) q_.erase(entry.key);
  }

  std::map<std::string, at::Tensor> state() const override {
    auto state = GradientCodec::state();
    for (const auto& [name, q] : q_) state[kQPrefix + name] = q.clone();
    for (const auto& [name, calls] : calls_)
      state[kCallsPrefix + name] = at::full({1}, calls, at::kLong);
    return state;
  }

  void loadState(const std::map<std::string, at::Tensor>& state) override {
    std::map<std::string, at::Tensor> rest;
    q_.clear();
    calls_.clear();
    for (const auto& [name, tensor] : state) {
      if (startsWith(name, kQPrefix))
        q_[name.substr(2)] = tensor.to(at::kFloat).contiguous().clone();
      else if (startsWith(name, kCallsPrefix) && tensor.numel() == 1)
        calls_[name.substr(6)] = tensor.to(at::kLong).item<std::int64_t>();
      else
        rest[name] = tensor;
    }
    GradientCodec::loadState(rest);
  }

 private:
  // Counts the call: true while `key` is within its first powersgd_start_step calls. Counting
  // stops there (the counts only matter until then, and only then are they part of state()).
  bool warmingUp(const std::string& key) {
    if (options_.powersgd_start_step == 0) return false;
    std::int64_t& calls = calls_[key];
    if (calls >= options_.powersgd_start_step) return false;
    ++calls;
    return true;
  }

  // Which entries are worth compressing (matrices), and which travel as they are (plain).
  void classify(const FlatLayout& layout, const at::Tensor& flat, std::vector<Matrix>& matrices,
                std::vector<const FlatLayout::Entry*>& plain) {
    for (const auto& entry : layout.entries) {
      if (entry.offset < 0 || entry.offset + entry.numel() > flat.numel())
        CHORUS_THROW(ConfigError, "powersgd: entry '", entry.key, "' lies outside the buffer");
      Matrix matrix;
      matrix.entry = &entry;
      matrix.rows = entry.shape.empty() ? 1 : entry.shape[0];
      matrix.cols = matrix.rows == 0 ? 0 : entry.numel() / matrix.rows;
      matrix.rank = std::min<std::int64_t>({options_.powersgd_rank, matrix.rows, matrix.cols});
      const double sent = static_cast<double>(matrix.rank * (matrix.rows + matrix.cols));
      const bool worth =
          entry.shape.size() >= 2 && entry.numel() >= options_.powersgd_min_elements &&
          static_cast<double>(entry.numel()) >= options_.powersgd_min_compression_rate * sent;
      if (!worth) {
        plain.push_back(&entry);
        continue;
      }
      at::Tensor view =
          flat.narrow(0, entry.offset, entry.numel()).view({matrix.rows, matrix.cols});
      matrix.m = options_.error_feedback ? feedback_.compensate(entry.key, view) : view.clone();
      matrices.push_back(std::move(matrix));
    }
  }

  // All-reduces every P = M Q and the `plain` tensors (written back to `flat`), and leaves each
  // matrix's summed P orthonormalized in matrix.p. `first`: this call's first collective.
  void reduceP(at::Tensor& flat, std::vector<Matrix>& matrices,
               const std::vector<const FlatLayout::Entry*>& plain, comm::Communicator& comm,
               bool first) {
    std::int64_t factors = 0;
    for (const auto& matrix : matrices) factors += matrix.rows * matrix.rank;
    std::int64_t size = factors;
    for (const auto* entry : plain) size += entry->numel();
    at::Tensor buffer = at::empty({size}, at::kFloat);
    std::int64_t offset = 0;
    for (auto& matrix : matrices) {
      at::Tensor p = buffer.narrow(0, offset, matrix.rows * matrix.rank);
      p.view({matrix.rows, matrix.rank}).copy_(matrix.m.matmul(warmQ(matrix)));
      offset += p.numel();
    }
    for (const auto* entry : plain) {
      buffer.narrow(0, offset, entry->numel()).copy_(flat.narrow(0, entry->offset, entry->numel()));
      offset += entry->numel();
    }
    sum(buffer, factors, comm, first ? static_cast<std::int64_t>(flat.nbytes()) : 0);
    offset = factors;
    for (const auto* entry : plain) {
      flat.narrow(0, entry->offset, entry->numel()).copy_(buffer.narrow(0, offset, entry->numel()));
      offset += entry->numel();
    }
    offset = 0;
    for (auto& matrix : matrices) {
      matrix.p = buffer.narrow(0, offset, matrix.rows * matrix.rank)
                     .view({matrix.rows, matrix.rank})
                     .clone();
      matrix.kept = orthonormalizeColumns(matrix.p, kDependent);
      offset += matrix.rows * matrix.rank;
    }
  }

  // All-reduces every Q = Mᵀ P and keeps the sum as the next warm start. On the `last`
  // iteration also writes M̂ = P Qᵀ into `flat` and updates the residuals.
  void reduceQ(at::Tensor& flat, std::vector<Matrix>& matrices, comm::Communicator& comm,
               bool last) {
    std::int64_t size = 0;
    for (const auto& matrix : matrices) size += matrix.cols * matrix.rank;
    at::Tensor buffer = at::empty({size}, at::kFloat);
    std::int64_t offset = 0;
    for (auto& matrix : matrices) {
      at::Tensor q = buffer.narrow(0, offset, matrix.cols * matrix.rank)
                         .view({matrix.cols, matrix.rank})
                         .copy_(matrix.m.t().matmul(matrix.p));
      if (options_.powersgd_bf16_factors) q.copy_(q.to(at::kBFloat16));  // what is sent
      if (last && options_.error_feedback)
        feedback_.update(matrix.entry->key, matrix.m, matrix.p.matmul(q.t()));
      offset += q.numel();
    }
    sum(buffer, size, comm, 0);
    offset = 0;
    for (auto& matrix : matrices) {
      at::Tensor q =
          buffer.narrow(0, offset, matrix.cols * matrix.rank).view({matrix.cols, matrix.rank});
      if (last)
        flat.narrow(0, matrix.entry->offset, matrix.entry->numel())
            .view({matrix.rows, matrix.cols})
            .copy_(matrix.p.matmul(q.t()));
      at::Tensor next = q.clone();
      reseedColumns(next, matrix.kept, options_.seed, matrix.entry->key);
      q_[matrix.entry->key] = std::move(next);
      offset += q.numel();
    }
  }

  // Sums `buffer` over the ranks: its first `factors` elements (P's or Q's) in bf16 when
  // powersgd_bf16_factors, the rest in fp32. `raw`: fp32 bytes of the call, on its first one.
  void sum(at::Tensor& buffer, std::int64_t factors, comm::Communicator& comm, std::int64_t raw) {
    if (!options_.powersgd_bf16_factors) {
      if (buffer.numel() > 0) comm.allReduce(buffer).wait();
      countAllReduce(static_cast<std::int64_t>(buffer.nbytes()), comm.size(), raw);
      return;
    }
    at::Tensor low = buffer.narrow(0, 0, factors).to(at::kBFloat16);
    if (factors > 0) comm.allReduce(low).wait();
    buffer.narrow(0, 0, factors).copy_(low);
    countAllReduce(static_cast<std::int64_t>(low.nbytes()), comm.size(), raw);
    at::Tensor rest = buffer.narrow(0, factors, buffer.numel() - factors);
    if (rest.numel() == 0) return;
    comm.allReduce(rest).wait();
    countAllReduce(static_cast<std::int64_t>(rest.nbytes()), comm.size(), 0);
  }

  // The Q of the previous iteration for this matrix, or a seeded Gaussian one (equal on all
  // ranks).
  at::Tensor warmQ(const Matrix& matrix) {
    at::Tensor& q = q_[matrix.entry->key];
    if (!q.defined() || q.size(0) != matrix.cols || q.size(1) != matrix.rank)
      q = seededColumns(options_.seed, matrix.entry->key, matrix.cols, matrix.rank);
    return q;
  }

  std::map<std::string, at::Tensor> q_;        // warm start per tensor key
  std::map<std::string, std::int64_t> calls_;  // calls per allReduce() key (start step)
};

}  // namespace

std::unique_ptr<GradientCodec> makePowerSgdCodec(const CodecOptions& options) {
  if (options.powersgd_rank < 1)
    CHORUS_THROW(ConfigError, "powersgd: rank must be >= 1, got ", options.powersgd_rank);
  if (options.powersgd_iterations < 1)
    CHORUS_THROW(ConfigError, "powersgd: iterations must be >= 1, got ",
                 options.powersgd_iterations);
  if (!(options.powersgd_min_compression_rate >= 1.0))
    CHORUS_THROW(ConfigError, "powersgd: min compression rate must be >= 1, got ",
                 options.powersgd_min_compression_rate);
  if (options.powersgd_start_step < 0)
    CHORUS_THROW(ConfigError, "powersgd: start step must be >= 0, got ",
                 options.powersgd_start_step);
  return std::make_unique<PowerSgdCodec>(options);
}

}  // namespace chorus::parallel::detail
