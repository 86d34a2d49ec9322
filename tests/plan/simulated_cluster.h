// Simulated devices for deterministic tests of the load balancer: each device's compute time for b
// samples is t_i(b) = a_i + c_i·b, seen through a noise model, with no wall clock anywhere.
//
// The noise models are the ones a real host throws at the balancer: Gaussian jitter, rare slow
// steps (a host hiccup: 3× the time), and pairs of devices that share cores and slow each other
// down while both compute. The optimum a test compares against is computed from the true
// (noise-free) cost curves, so "within 3% of the optimum" means the step time the devices could
// really reach.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

namespace chorus::plan::testing {

struct SimDevice {
  double a = 0;          // fixed seconds per step
  double c = 1e-3;       // seconds per sample
  std::int64_t cap = 0;  // most samples per step; 0: none

  double seconds(std::int64_t samples) const { return samples > 0 ? a + c * samples : 0.0; }
};

struct NoiseModel {
  double jitter = 0;             // relative σ of Gaussian noise on every measurement
  double spike_probability = 0;  // chance per device and step of a hiccup
  double spike_factor = 3;       // a hiccup multiplies the step's time by this
  // Pairs of devices that share cores: while both compute, each runs slower by this factor.
  std::vector<std::pair<int, int>> shared_cores;
  double contention = 0.3;
};

// A draw of uniform and normal variates that is the same on every platform (std::*_distribution
// is implementation-defined; the engine is not).
class PortableRandom {
 public:
  explicit PortableRandom(std::uint64_t seed) : engine_(seed) {}
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  double uniform(double low, double high) { return low + (high - low) * uniform(); }
  double logUniform(double low, double high) {
    return std::exp(uniform(std::log(low), std::log(high)));
  }
  std::int64_t integer(std::int64_t low, std::int64_t high) {  // in [low, high]
    return low + static_cast<std::int64_t>(uniform() * static_cast<double>(high - low + 1));
  }
  double normal() {  // Box–Muller
    const double u = 1.0 - uniform(), v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * M_PI * v);
  }

 private:
  std::mt19937_64 engine_;
};

// True compute time of every device at `shares`, contention included: two devices that share
// cores both run (1 + contention)× slower while both compute, and the one with more work finishes
// the rest alone.
inline std::vector<double> trueSeconds(const std::vector<SimDevice>& devices,
                                       const std::vector<std::int64_t>& shares,
                                       const NoiseModel& noise) {
  std::vector<double> seconds(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) seconds[i] = devices[i].seconds(shares[i]);
  std::vector<double> alone = seconds;
  for (const auto& [x, y] : noise.shared_cores) {
    const double overlap = std::min(alone[x], alone[y]);
    seconds[x] = alone[x] + noise.contention * overlap;
    seconds[y] = alone[y] + noise.contention * overlap;
  }
  return seconds;
}

inline double trueStepSeconds(const std::vector<SimDevice>& devices,
                              const std::vector<std::int64_t>& shares, const NoiseModel& noise) {
  const std::vector<double> seconds = trueSeconds(devices, shares, noise);
  return *std::max_element(seconds.begin(), seconds.end());
}

// What the devices report for one step: the true times through jitter and hiccups.
inline std::vector<double> measuredSeconds(const std::vector<SimDevice>& devices,
                                           const std::vector<std::int64_t>& shares,
                                           const NoiseModel& noise, PortableRandom& random) {
  std::vector<double> seconds = trueSeconds(devices, shares, noise);
  for (double& value : seconds) {
    value *= std::max(0.05, 1.0 + noise.jitter * random.normal());
    if (random.uniform() < noise.spike_probability) value *= noise.spike_factor;
  }
  return seconds;
}

namespace detail {

inline std::int64_t capOf(const SimDevice& device, std::int64_t batch) {
  return device.cap > 0 ? std::min(device.cap, batch) : batch;
}

// The most samples device `d` finishes by `finish` on its own (at least 1 is required of it).
inline std::int64_t aloneCapacity(const SimDevice& device, double finish, std::int64_t batch) {
  if (finish < device.seconds(1)) return -1;  // cannot even do its one sample
  const double most = std::floor((finish - device.a) / device.c * (1 + 1e-12));
  return std::min<std::int64_t>(capOf(device, batch), static_cast<std::int64_t>(most));
}

}  // namespace detail

// The best step time of any integer split (Σ b_i = batch, 1 <= b_i <= cap_i) on the curves the
// devices show when they compute at once: (1 + contention)·t_i(b) for a device that shares cores.
// That is what a pair measures when it finishes together, which is what balancing means; a split
// that idles one of the pair (1 sample) can be faster still when fixed costs are large, but no
// balancer that models each device by its own curve is asked to find it. Bisection on the finish
// time T over the integer capacity at T (a step function of T that only grows).
inline double optimumStepSeconds(std::vector<SimDevice> devices, std::int64_t batch,
                                 const NoiseModel& noise) {
  for (const auto& [x, y] : noise.shared_cores)
    for (int d : {x, y}) {
      devices[d].a *= 1 + noise.contention;
      devices[d].c *= 1 + noise.contention;
    }
  const auto capacity = [&](double finish) {
    std::int64_t total = 0;
    for (const SimDevice& device : devices) {
      const std::int64_t most = detail::aloneCapacity(device, finish, batch);
      if (most < 1) return std::int64_t{-1};
      total += most;
    }
    return total;
  };
  double low = 0, high = 1;
  while (capacity(high) < batch) high *= 2;
  for (int round = 0; round < 100 && high - low > 1e-9 * high; ++round) {
    const double middle = 0.5 * (low + high);
    (capacity(middle) >= batch ? high : low) = middle;
  }
  return high;
}

}  // namespace chorus::plan::testing
