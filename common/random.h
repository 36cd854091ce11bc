// Deterministic, counter-based randomness. Every random decision in the pipeline (shuffle
// order, crop box, flip) is a pure function of (seed, epoch, sample index), so any worker
// thread, any node and any restart computes the same value without shared state.
//
//   Rng rng(MixSeed(job_seed, epoch, index));
//   double u = rng.Uniform();  // [0, 1)
#ifndef FERRY_COMMON_RANDOM_H_
#define FERRY_COMMON_RANDOM_H_

#include <cstdint>

namespace ferry {

// SplitMix64 finalizer: a bijective 64-bit mix with good avalanche.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Combines a job seed with up to two coordinates (e.g. epoch and sample index).
inline uint64_t MixSeed(uint64_t seed, uint64_t a, uint64_t b = 0) {
  return Mix64(Mix64(Mix64(seed) ^ a) ^ (b * 0xd1b54a32d192ed03ull));
}

// Small, fast generator (SplitMix64 stream). Not for cryptography.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    state_ += 0x9e3779b97f4a7c15ull;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform double in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Uniform double in [lo, hi).
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Uniform integer in [0, n); n > 0. Lemire's multiply-shift, bias below 2^-64 * n.
  uint64_t Below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(Next()) * n) >> 64);
  }

 private:
  uint64_t state_;
};

}  // namespace ferry

#endif  // FERRY_COMMON_RANDOM_H_
