// Deterministic, counter-based randomness. Every random decision in the pipeline (shuffle
// order, crop box, flip) is a pure function of (seed, epoch, sample index), so any worker
// thread, any node and any restart computes the same value without shared state.
//
//   Rng rng(MixSeed(job_seed, epoch, index));
//   double u = rng.Uniform();  // [0, 1)
#ifndef FERRY_COMMON_RANDOM_H_
#define FERRY_COMMON_RANDOM_H_

#include <bit>
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

// A pseudo-random permutation of [0, n) that costs O(1) memory and O(1) expected time per
// lookup: a 6-round Feistel network over the smallest even number of bits that holds n,
// walked until the value falls below n (cycle walking; under 4 steps on average). For
// orders too large to materialise (a pass over a corpus of billions of windows). The same
// (n, key) gives the same permutation on every machine.
//
//   IndexPermutation order(n, MixSeed(seed, pass));
//   uint64_t sample = order(i);  // i < n; distinct i give distinct samples
class IndexPermutation {
 public:
  // n >= 1.
  IndexPermutation(uint64_t n, uint64_t key) : n_(n) {
    const int bits = n <= 2 ? 1 : static_cast<int>(std::bit_width(n - 1));
    half_bits_ = (bits + 1) / 2;
    mask_ = (uint64_t{1} << half_bits_) - 1;
    for (int r = 0; r < kRounds; ++r) keys_[r] = Mix64(key + static_cast<uint64_t>(r));
  }

  // The image of i, for i < n.
  uint64_t operator()(uint64_t i) const {
    uint64_t x = i;
    do {
      x = Encrypt(x);
    } while (x >= n_);
    return x;
  }

 private:
  static constexpr int kRounds = 6;

  uint64_t Encrypt(uint64_t x) const {
    uint64_t left = x >> half_bits_;
    uint64_t right = x & mask_;
    for (int r = 0; r < kRounds; ++r) {
      const uint64_t next = left ^ (Mix64(right ^ keys_[r]) & mask_);
      left = right;
      right = next;
    }
    return (left << half_bits_) | right;
  }

  uint64_t n_;
  int half_bits_;
  uint64_t mask_;
  uint64_t keys_[kRounds];
};

}  // namespace ferry

#endif  // FERRY_COMMON_RANDOM_H_
