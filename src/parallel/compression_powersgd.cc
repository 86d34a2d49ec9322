// PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019): one warm-started power iteration per step
// gives a rank-r approximation of each gradient matrix, at two all-reduces of r(a + b) numbers
// per a×b matrix instead of one of ab.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "chorus/core/error.h"
#include "compression_internal.h"

namespace chorus::parallel::detail {
namespace {

constexpr const char* kQPrefix = "q/";

// FNV-1a: a hash that is the same in every build, so every rank seeds a key's Q alike.
std::uint64_t stableHash(const std::string& text) {
  std::uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

// Modified Gram–Schmidt on the columns of `p` (rows × r, contiguous fp32), in place, in plain
// loops with double accumulators: the same bits on every rank and thread count. A column that is
// (numerically) dependent on earlier ones becomes zero instead of amplified noise.
void orthonormalize(at::Tensor& p) {
  const std::int64_t rows = p.size(0), cols = p.size(1);
  float* data = p.data_ptr<float>();
  auto column_dot = [&](std::int64_t a, std::int64_t b) {
    double sum = 0;
    for (std::int64_t i = 0; i < rows; ++i)
      sum += static_cast<double>(data[i * cols + a]) * data[i * cols + b];
    return sum;
  };
  for (std::int64_t j = 0; j < cols; ++j) {
    const double before = std::sqrt(column_dot(j, j));
    for (std::int64_t k = 0; k < j; ++k) {
      const double dot = column_dot(k, j);
      for (std::int64_t i = 0; i < rows; ++i)
        data[i * cols + j] -= static_cast<float>(dot * data[i * cols + k]);
    }
    const double norm = std::sqrt(column_dot(j, j));
    const double scale = norm > 1e-6 * before && norm > 0 ? 1.0 / norm : 0.0;
    for (std::int64_t i = 0; i < rows; ++i)
      data[i * cols + j] = static_cast<float>(data[i * cols + j] * scale);
  }
}

// One compressed matrix of a call.
struct Matrix {
  const FlatLayout::Entry* entry = nullptr;
  std::int64_t rows = 0, cols = 0, rank = 0;
  at::Tensor m;  // the (compensated) contribution, rows × cols
  at::Tensor p;  // rows × rank, orthonormalized after the first all-reduce
};

class PowerSgdCodec : public GradientCodec {
 public:
  using GradientCodec::GradientCodec;

  void allReduce(const std::string& key, at::Tensor& flat, const FlatLayout& given,
                 comm::Communicator& comm) override {
    const FlatLayout layout = given.entries.empty() ? FlatLayout::whole(key, flat) : given;
    std::vector<Matrix> matrices;
    std::vector<const FlatLayout::Entry*> plain;
    classify(layout, flat, matrices, plain);
    // First all-reduce: every P, then the uncompressed tensors.
    std::int64_t first_size = 0;
    for (const auto& matrix : matrices) first_size += matrix.rows * matrix.rank;
    for (const auto* entry : plain) first_size += entry->numel();
    at::Tensor first = at::empty({first_size}, at::kFloat);
    std::int64_t offset = 0;
    for (auto& matrix : matrices) {
      at::Tensor p = first.narrow(0, offset, matrix.rows * matrix.rank);
      p.view({matrix.rows, matrix.rank}).copy_(matrix.m.matmul(warmQ(matrix)));
      offset += p.numel();
    }
    for (const auto* entry : plain) {
      first.narrow(0, offset, entry->numel()).copy_(flat.narrow(0, entry->offset, entry->numel()));
      offset += entry->numel();
    }
    if (first_size > 0) comm.allReduce(first).wait();
    countAllReduce(static_cast<std::int64_t>(first.nbytes()), comm.size(),
                   static_cast<std::int64_t>(flat.nbytes()));
    offset = 0;
    for (auto& matrix : matrices) offset += matrix.rows * matrix.rank;
    for (const auto* entry : plain) {
      flat.narrow(0, entry->offset, entry->numel()).copy_(first.narrow(0, offset, entry->numel()));
      offset += entry->numel();
    }
    if (!matrices.empty()) finishMatrices(first, flat, matrices, comm);
  }

  std::map<std::string, at::Tensor> state() const override {
    auto state = GradientCodec::state();
    for (const auto& [name, q] : q_) state[kQPrefix + name] = q.clone();
    return state;
  }

  void loadState(const std::map<std::string, at::Tensor>& state) override {
    std::map<std::string, at::Tensor> rest;
    q_.clear();
    for (const auto& [name, tensor] : state) {
      if (name.compare(0, 2, kQPrefix) == 0)
        q_[name.substr(2)] = tensor.to(at::kFloat).contiguous().clone();
      else
        rest[name] = tensor;
    }
    GradientCodec::loadState(rest);
  }

 private:
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
      const bool worth = entry.shape.size() >= 2 &&
                         entry.numel() >= options_.powersgd_min_elements &&
                         matrix.rank * (matrix.rows + matrix.cols) < entry.numel();
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

  // The Q of the previous step for this matrix, or a seeded Gaussian one (equal on all ranks).
  at::Tensor warmQ(const Matrix& matrix) {
    at::Tensor& q = q_[matrix.entry->key];
    if (!q.defined() || q.size(0) != matrix.cols || q.size(1) != matrix.rank) {
      auto generator =
          at::make_generator<at::CPUGeneratorImpl>(options_.seed ^ stableHash(matrix.entry->key));
      q = at::randn({matrix.cols, matrix.rank}, generator, at::kFloat);
    }
    return q;
  }

  // Orthonormalizes each summed P, all-reduces Q = Mᵀ P, and writes M̂ = P Qᵀ.
  void finishMatrices(const at::Tensor& first, at::Tensor& flat, std::vector<Matrix>& matrices,
                      comm::Communicator& comm) {
    std::int64_t second_size = 0;
    for (const auto& matrix : matrices) second_size += matrix.cols * matrix.rank;
    at::Tensor second = at::empty({second_size}, at::kFloat);
    std::int64_t p_offset = 0, q_offset = 0;
    for (auto& matrix : matrices) {
      matrix.p = first.narrow(0, p_offset, matrix.rows * matrix.rank)
                     .view({matrix.rows, matrix.rank})
                     .clone();
      orthonormalize(matrix.p);
      at::Tensor q = matrix.m.t().matmul(matrix.p);
      if (options_.error_feedback)
        feedback_.update(matrix.entry->key, matrix.m, matrix.p.matmul(q.t()));
      second.narrow(0, q_offset, q.numel()).view({matrix.cols, matrix.rank}).copy_(q);
      p_offset += matrix.rows * matrix.rank;
      q_offset += q.numel();
    }
    comm.allReduce(second).wait();
    countAllReduce(static_cast<std::int64_t>(second.nbytes()), comm.size(), 0);
    q_offset = 0;
    for (auto& matrix : matrices) {
      at::Tensor q =
          second.narrow(0, q_offset, matrix.cols * matrix.rank).view({matrix.cols, matrix.rank});
      q_[matrix.entry->key] = q.clone();
      flat.narrow(0, matrix.entry->offset, matrix.entry->numel())
          .view({matrix.rows, matrix.cols})
          .copy_(matrix.p.matmul(q.t()));
      q_offset += q.numel();
    }
  }

  std::map<std::string, at::Tensor> q_;  // warm start per tensor key
};

}  // namespace

std::unique_ptr<GradientCodec> makePowerSgdCodec(const CodecOptions& options) {
  if (options.powersgd_rank < 1)
    CHORUS_THROW(ConfigError, "powersgd: rank must be >= 1, got ", options.powersgd_rank);
  return std::make_unique<PowerSgdCodec>(options);
}

}  // namespace chorus::parallel::detail
