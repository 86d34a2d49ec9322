// Portable pseudo-random numbers for everything in `data` that must be reproducible.
//
// Invariant 1 (placement never changes the math) needs the sequence of global batches and the
// synthetic samples to be bit-identical on every rank, whatever its platform, compiler or libtorch
// build. std::mt19937 is portable but std::uniform_int_distribution and std::shuffle are not (each
// standard library maps engine output to a range differently), and libtorch's generators may change
// between releases. So the data layer uses its own tiny generator, SplitMix64 (Steele, Lea and
// Flood, "Fast splittable pseudorandom number generators", 2014), with integer-only range
// reduction. No libtorch here: the sampler depends on this header and stays torch-free.
#pragma once

#include <cstdint>

namespace chorus::data {

// The SplitMix64 generator: a 64-bit counter passed through a strong mixing function. A value
// type: copy it to fork the stream. Not thread-safe (each thread owns its generator).
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}

  // The next 64 uniformly distributed bits.
  std::uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return mix(state_);
  }

  // A uniform integer in [0, bound), without modulo bias. REQUIRES: bound >= 1.
  std::uint64_t below(std::uint64_t bound) {
    // Reject the lowest 2^64 mod bound values so the remaining range is a multiple of bound.
    const std::uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const std::uint64_t x = next();
      if (x >= threshold) return x % bound;
    }
  }

  // A uniform float in [-1, 1). Uses only exact operations (24 random bits, a power-of-two
  // scale), so the value is the same under any IEEE-754 implementation.
  float symmetricUnit() {
    const auto bits = static_cast<std::int32_t>(next() >> 40);  // in [0, 2^24)
    return static_cast<float>(bits - (1 << 23)) * (1.0f / static_cast<float>(1 << 23));
  }

  // The SplitMix64 finaliser: a bijective mix of 64 bits.
  static std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

 private:
  std::uint64_t state_;
};

// Derives the seed of an independent stream from a parent seed and a stream index (an epoch, a
// sample id). Distinct (seed, index) pairs give unrelated streams; the result depends on nothing
// else.
inline std::uint64_t deriveSeed(std::uint64_t seed, std::uint64_t index) {
  return SplitMix64::mix(SplitMix64::mix(seed ^ 0x5851f42d4c957f2dULL) + index);
}

}  // namespace chorus::data
