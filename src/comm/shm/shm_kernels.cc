#include "shm/shm_kernels.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>

#include "chorus/core/error.h"

namespace chorus::comm {
namespace {

struct Sum {
  template <typename T>
  static T apply(T a, T b) {
    return a + b;
  }
};
struct Max {
  template <typename T>
  static T apply(T a, T b) {
    return std::max(a, b);
  }
};
struct Min {
  template <typename T>
  static T apply(T a, T b) {
    return std::min(a, b);
  }
};

// One two-input pass: out = a (op) b, written to `dst` and, when kCopy, also to `copy`; the last
// pass of an average also divides. No __restrict: `a` may be `dst` or `copy`, `b` may be `dst`
// (element i is read before it is written).
template <typename T, typename Op, bool kDivide, bool kCopy>
void combine(const T* a, const T* b, T* dst, T* copy, std::size_t count, int n) {
  const T divisor = static_cast<T>(n);
  for (std::size_t i = 0; i < count; ++i) {
    T value = Op::apply(a[i], b[i]);
    if constexpr (kDivide) value = value / divisor;
    dst[i] = value;
    if constexpr (kCopy) copy[i] = value;
  }
}

template <typename T, typename Op, bool kDivide>
void combineLast(const T* a, const T* b, T* dst, T* copy, std::size_t count, int n) {
  if (copy)
    combine<T, Op, kDivide, true>(a, b, dst, copy, count, n);
  else
    combine<T, Op, kDivide, false>(a, b, dst, nullptr, count, n);
}

// Native types: each pass folds one more source into the accumulator, in rank order; the last pass
// divides (average) and writes dst and copy, so the result is written once to each place. The
// accumulator is `copy` when there is one: `dst` may be a later source, which must not be
// overwritten before it is read.
template <typename T, typename Op>
void reduceNative(const void* const* sources, int n, T* dst, T* copy, std::size_t count,
                  bool average) {
  const T* acc = static_cast<const T*>(sources[0]);
  if (n == 1) {
    if (dst != acc) std::memmove(dst, acc, count * sizeof(T));
    if (copy) std::memcpy(copy, dst, count * sizeof(T));
    return;
  }
  T* partial = copy ? copy : dst;
  for (int k = 1; k < n; ++k) {
    const T* next = static_cast<const T*>(sources[k]);
    if (k + 1 < n)
      combine<T, Op, false, false>(acc, next, partial, nullptr, count, n);
    else if (average)
      combineLast<T, Op, true>(acc, next, dst, copy, count, n);
    else
      combineLast<T, Op, false>(acc, next, dst, copy, count, n);
    acc = partial;
  }
}

// Half types: widen to float in blocks that stay in L1, reduce, divide, round once.
template <typename H, typename Op>
void reduceWidened(const void* const* sources, int n, H* dst, H* copy, std::size_t count,
                   bool average) {
  constexpr std::size_t kBlock = 1024;
  float acc[kBlock];
  for (std::size_t base = 0; base < count; base += kBlock) {
    const std::size_t len = std::min(kBlock, count - base);
    const H* first = static_cast<const H*>(sources[0]) + base;
    for (std::size_t i = 0; i < len; ++i) acc[i] = static_cast<float>(first[i]);
    for (int k = 1; k < n; ++k) {
      const H* next = static_cast<const H*>(sources[k]) + base;
      for (std::size_t i = 0; i < len; ++i) acc[i] = Op::apply(acc[i], static_cast<float>(next[i]));
    }
    if (average)
      for (std::size_t i = 0; i < len; ++i) acc[i] /= static_cast<float>(n);
    for (std::size_t i = 0; i < len; ++i) dst[base + i] = static_cast<H>(acc[i]);
    if (copy) std::memcpy(copy + base, dst + base, len * sizeof(H));
  }
}

template <typename T, typename Op>
void reduceTyped(const void* const* sources, int n, void* dst, void* copy, std::size_t count,
                 bool average) {
  if constexpr (std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Half>)
    reduceWidened<T, Op>(sources, n, static_cast<T*>(dst), static_cast<T*>(copy), count, average);
  else
    reduceNative<T, Op>(sources, n, static_cast<T*>(dst), static_cast<T*>(copy), count, average);
}

template <typename T>
void reduceOp(ReduceOp op, const void* const* sources, int n, void* dst, void* copy,
              std::size_t count) {
  switch (op) {
    case ReduceOp::kSum:
      return reduceTyped<T, Sum>(sources, n, dst, copy, count, false);
    case ReduceOp::kAvg:
      return reduceTyped<T, Sum>(sources, n, dst, copy, count, true);
    case ReduceOp::kMax:
      return reduceTyped<T, Max>(sources, n, dst, copy, count, false);
    case ReduceOp::kMin:
      return reduceTyped<T, Min>(sources, n, dst, copy, count, false);
  }
}

}  // namespace

bool shmReducible(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Float:
    case c10::ScalarType::Double:
    case c10::ScalarType::BFloat16:
    case c10::ScalarType::Half:
    case c10::ScalarType::Int:
    case c10::ScalarType::Long:
      return true;
    default:
      return false;
  }
}

void shmReduce(c10::ScalarType type, ReduceOp op, const void* const* sources, int n, void* dst,
               void* copy, std::size_t count) {
  switch (type) {
    case c10::ScalarType::Float:
      return reduceOp<float>(op, sources, n, dst, copy, count);
    case c10::ScalarType::Double:
      return reduceOp<double>(op, sources, n, dst, copy, count);
    case c10::ScalarType::BFloat16:
      return reduceOp<c10::BFloat16>(op, sources, n, dst, copy, count);
    case c10::ScalarType::Half:
      return reduceOp<c10::Half>(op, sources, n, dst, copy, count);
    case c10::ScalarType::Int:
      return reduceOp<std::int32_t>(op, sources, n, dst, copy, count);
    case c10::ScalarType::Long:
      return reduceOp<std::int64_t>(op, sources, n, dst, copy, count);
    default:
      CHORUS_THROW(CommError, "shm: cannot reduce ", c10::toString(type));
  }
}

}  // namespace chorus::comm
