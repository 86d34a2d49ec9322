// PowerSGD's local linear algebra: orthonormalization of P and the seeded start vectors of Q.
// Plain loops and seeded generators, so that every rank computes the same bits whatever its
// thread count (the codec's contract: Q is equal on every rank).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <vector>

#include "compression_internal.h"

namespace chorus::parallel::detail {
namespace {

// FNV-1a: a hash that is the same in every build, so every rank seeds a key's Q alike.
std::uint64_t stableHash(const std::string& text) {
  std::uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

double dot(const double* x, const double* y, std::int64_t n) {
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += x[i] * y[i];
  return sum;
}

}  // namespace

std::vector<bool> orthonormalizeColumns(at::Tensor& p, double dependent) {
  const std::int64_t rows = p.size(0), cols = p.size(1);
  float* data = p.data_ptr<float>();
  std::vector<double> a(static_cast<size_t>(rows * cols));  // column-major copy
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) a[j * rows + i] = data[i * cols + j];
  std::vector<bool> kept(static_cast<size_t>(cols), false);
  for (std::int64_t j = 0; j < cols; ++j) {
    double* x = a.data() + j * rows;
    const double before = std::sqrt(dot(x, x, rows));
    // Two passes: after one, a nearly dependent column is only as orthogonal to the earlier ones
    // as its rounding noise, and normalizing it would leak that noise into M̂.
    for (int pass = 0; pass < 2; ++pass)
      for (std::int64_t k = 0; k < j; ++k) {
        const double* y = a.data() + k * rows;
        const double projection = dot(y, x, rows);
        for (std::int64_t i = 0; i < rows; ++i) x[i] -= projection * y[i];
      }
    const double norm = std::sqrt(dot(x, x, rows));
    kept[j] = norm > 0 && norm > dependent * before;
    const double scale = kept[j] ? 1.0 / norm : 0.0;
    for (std::int64_t i = 0; i < rows; ++i) x[i] *= scale;
  }
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      data[i * cols + j] = static_cast<float>(a[j * rows + i]);
  return kept;
}

at::Tensor seededColumns(std::uint64_t seed, const std::string& key, std::int64_t rows,
                         std::int64_t cols) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed ^ stableHash(key));
  return at::randn({rows, cols}, generator, at::kFloat);
}

void reseedColumns(at::Tensor& q, const std::vector<bool>& kept, std::uint64_t seed,
                   const std::string& key) {
  for (std::int64_t j = 0; j < q.size(1); ++j)
    if (!kept[static_cast<size_t>(j)])
      q.select(1, j).copy_(
          seededColumns(seed, key + "#" + std::to_string(j), q.size(0), 1).select(1, 0));
}

}  // namespace chorus::parallel::detail
