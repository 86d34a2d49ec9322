// Micro-benchmarks: measured figures of a device (matmul throughput per dtype, memory bandwidth),
// used by `chorus devices` and as the planner's first guess of each device's relative speed.
//
// The figures are measured on the spot rather than looked up, because what matters is what
// libtorch achieves here: the same CPU is ~20x slower with the reference BLAS than with MKL or
// OpenBLAS, and a GPU's clocks depend on its power limit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "chorus/device/discovery.h"

namespace chorus::device {

// How to measure. Value type.
struct MeasureOptions {
  // Intra-op threads for CPU measurements. Default: 1, as each CPU worker runs one intra-op
  // thread (docs/architecture.md, "Process model"); the process-wide setting is restored
  // afterwards.
  int threads = 1;
  // Side n of the n x n matrices multiplied. Default: 1024 (large enough for a BLAS to reach its
  // steady rate, small enough for ~20 ms per product on one core).
  int matmul_size = 1024;
  // Minimum wall time of one timed trial, in seconds. Default: 0.2.
  double min_seconds = 0.2;
  // Trials per figure; the best is reported, as the least disturbed by other processes.
  // Default: 3.
  int trials = 3;
  // Bytes copied by the bandwidth measurement. Default: 256 MiB (well past any CPU cache).
  std::uint64_t bandwidth_bytes = 256ull << 20;

  // Smaller sizes for tests and `chorus devices --quick`: about a tenth of the time.
  static MeasureOptions quick();
};

// Measured figures of one device. Value type.
struct DeviceMeasurement {
  // Matrix-multiply throughput, 2n^3 flops per product.
  double matmul_gflops_fp32 = 0;
  // bf16: on a GPU that lists it, or a CPU with native bf16 (DeviceInfo::dtypes). Empty otherwise.
  std::optional<double> matmul_gflops_bf16;
  // fp16: GPUs only (CPU fp16 matmul is emulated and slow). Empty otherwise.
  std::optional<double> matmul_gflops_fp16;
  // fp32 inputs through TF32 tensor cores: CUDA GPUs that list tf32 (Ampere and later). Empty
  // otherwise.
  std::optional<double> matmul_gflops_tf32;
  // Device-memory copy rate, counting read and write: 2 x bytes / t.
  double mem_bandwidth_gbs = 0;
  // Intra-op threads used (CPU); 0 for a GPU.
  int threads = 0;
};

// Sets libtorch's process-wide intra-op thread count for its scope and restores it after: a
// measurement runs at a worker's threads. Not copyable.
class ScopedIntraOpThreads {
 public:
  explicit ScopedIntraOpThreads(int threads);
  ~ScopedIntraOpThreads();
  ScopedIntraOpThreads(const ScopedIntraOpThreads&) = delete;
  ScopedIntraOpThreads& operator=(const ScopedIntraOpThreads&) = delete;

 private:
  int previous_;
};

// Measures `device`. Takes roughly (2 + dtypes) x trials x min_seconds. Throws DeviceError when the
// device cannot run the measurement (e.g. a GPU index that does not exist, or out of memory), and
// ConfigError for options out of range.
DeviceMeasurement measureDevice(const DeviceInfo& device, const MeasureOptions& options = {});

// The BLAS libtorch's CPU matmul uses, from its build configuration ("mkl", "openblas", ...);
// empty when libtorch does not say.
std::string blasBackend();

}  // namespace chorus::device
