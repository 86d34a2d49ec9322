#include "chorus/device/microbench.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/cuda.h>

#include <algorithm>
#include <functional>

#include "chorus/core/clock.h"
#include "chorus/core/error.h"

namespace chorus::device {
namespace {

void synchronize(const at::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// The best rate, in operations per second, of `options.trials` trials of `op`. Each trial runs
// batches of doubling size, synchronizing after each batch, until it has run min_seconds: a GPU
// then queues many kernels between synchronizations, and the clock is read after the work is done.
double bestRate(const std::function<void()>& op, const at::Device& device,
                const MeasureOptions& options) {
  // Warm-up: first-touch page faults, BLAS and cuBLAS handle set-up, oneDNN kernel generation.
  op();
  op();
  synchronize(device);
  double best = 0;
  for (int trial = 0; trial < options.trials; ++trial) {
    std::int64_t done = 0;
    std::int64_t batch = 1;
    Stopwatch watch;
    double elapsed = 0;
    while (true) {
      for (std::int64_t i = 0; i < batch; ++i) op();
      synchronize(device);
      done += batch;
      elapsed = watch.seconds();
      if (elapsed >= options.min_seconds) break;
      batch *= 2;
    }
    best = std::max(best, static_cast<double>(done) / elapsed);
  }
  return best;
}

double matmulGflops(const at::Device& device, at::ScalarType dtype, const MeasureOptions& options) {
  const std::int64_t n = options.matmul_size;
  const auto tensor_options = at::TensorOptions().device(device).dtype(dtype);
  const at::Tensor a = at::randn({n, n}, tensor_options);
  const at::Tensor b = at::randn({n, n}, tensor_options);
  at::Tensor out = at::empty({n, n}, tensor_options);
  const double rate = bestRate([&] { at::mm_out(out, a, b); }, device, options);
  return rate * 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) /
         1e9;
}

double bandwidthGbs(const at::Device& device, const MeasureOptions& options) {
  const auto elements = static_cast<std::int64_t>(options.bandwidth_bytes / sizeof(float));
  const auto tensor_options = at::TensorOptions().device(device).dtype(at::kFloat);
  const at::Tensor source = at::ones({elements}, tensor_options);
  at::Tensor destination = at::empty({elements}, tensor_options);
  const double rate = bestRate([&] { destination.copy_(source); }, device, options);
  const double bytes = static_cast<double>(elements) * sizeof(float);
  return rate * 2.0 * bytes / 1e9;  // each copy reads and writes every byte
}

// fp32 products with cuBLAS allowed to round their inputs to TF32 (the tensor cores' format);
// the process's setting is restored after, whatever happens.
double tf32Gflops(const at::Device& device, const MeasureOptions& options) {
  at::Context& context = at::globalContext();
  const bool allowed = context.allowTF32CuBLAS();
  context.setAllowTF32CuBLAS(true);
  try {
    const double gflops = matmulGflops(device, at::kFloat, options);
    context.setAllowTF32CuBLAS(allowed);
    return gflops;
  } catch (...) {
    context.setAllowTF32CuBLAS(allowed);
    throw;
  }
}

void checkOptions(const MeasureOptions& options) {
  CHORUS_CHECK_CONFIG(options.threads >= 1, "measure: threads must be >= 1, got ", options.threads);
  CHORUS_CHECK_CONFIG(options.matmul_size >= 1, "measure: matmul_size must be >= 1, got ",
                      options.matmul_size);
  CHORUS_CHECK_CONFIG(options.min_seconds > 0, "measure: min_seconds must be > 0, got ",
                      options.min_seconds);
  CHORUS_CHECK_CONFIG(options.trials >= 1, "measure: trials must be >= 1, got ", options.trials);
  CHORUS_CHECK_CONFIG(options.bandwidth_bytes >= sizeof(float),
                      "measure: bandwidth_bytes must hold at least one float");
}

DeviceMeasurement measureOn(const DeviceInfo& device, const at::Device& where,
                            const MeasureOptions& options) {
  DeviceMeasurement result;
  result.matmul_gflops_fp32 = matmulGflops(where, at::kFloat, options);
  if (device.supports("bf16"))
    result.matmul_gflops_bf16 = matmulGflops(where, at::kBFloat16, options);
  if (where.is_cuda() && device.supports("fp16"))
    result.matmul_gflops_fp16 = matmulGflops(where, at::kHalf, options);
  if (where.is_cuda() && device.supports("tf32"))
    result.matmul_gflops_tf32 = tf32Gflops(where, options);
  result.mem_bandwidth_gbs = bandwidthGbs(where, options);
  return result;
}

}  // namespace

MeasureOptions MeasureOptions::quick() {
  MeasureOptions options;
  options.matmul_size = 512;
  options.min_seconds = 0.05;
  options.trials = 2;
  options.bandwidth_bytes = 32ull << 20;
  return options;
}

ScopedIntraOpThreads::ScopedIntraOpThreads(int threads) : previous_(at::get_num_threads()) {
  at::set_num_threads(threads);
}

ScopedIntraOpThreads::~ScopedIntraOpThreads() { at::set_num_threads(previous_); }

DeviceMeasurement measureDevice(const DeviceInfo& device, const MeasureOptions& options) {
  checkOptions(options);
  try {
    if (device.kind == DeviceKind::kCuda) {
      const at::Device where(at::kCUDA, static_cast<c10::DeviceIndex>(device.index));
      return measureOn(device, where, options);
    }
    ScopedIntraOpThreads threads(options.threads);
    DeviceMeasurement result = measureOn(device, at::Device(at::kCPU), options);
    result.threads = options.threads;
    return result;
  } catch (const c10::Error& error) {
    CHORUS_THROW(DeviceError, "cannot measure ", describe(device), ": ",
                 error.what_without_backtrace());
  }
}

std::string blasBackend() {
  const std::string config = at::show_config();
  const std::string key = "BLAS_INFO=";
  for (auto at = config.find(key); at != std::string::npos; at = config.find(key, at + 1)) {
    // Skip keys that merely end in BLAS_INFO (none today, but cheap to rule out).
    if (at > 0 && config[at - 1] != ' ' && config[at - 1] != ',' && config[at - 1] != '\n')
      continue;
    const auto begin = at + key.size();
    const auto end = config.find_first_of(", \n", begin);
    return config.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  }
  return "";
}

}  // namespace chorus::device
