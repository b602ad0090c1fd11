// A simulated training step of BF16 weights, for tests and benchmarks of the
// delta codecs, and the order-0 entropy yardstick of DESIGN.md ("Delta size").
//
// Each element has an FP32 master weight w ~ N(0, 0.02) (or ~ 1.0 for norm-like
// tensors), a persistent gradient bias b ~ N(0, 0.5) under unit gradient noise,
// and Adam moments started at their steady state. One step draws g = b + noise,
// updates m = 0.9 m + 0.1 g and v = 0.999 v + 0.001 g^2 and moves
// w -= lr * m / (sqrt(v) + 1e-8). Base and target are the BF16 round-to-nearest-
// even images of w before and after. Few elements change, mostly by one unit in
// the last place, and small weights change more often than large ones: the
// statistics of real RL steps (TOOLCHAIN-NOTES.md).
//
// Everything is a deterministic function of the seed (given the same libm).
//
// Thread safety: plain functions and values; use one generator per thread.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <unordered_map>
#include <vector>

namespace deltacast::bench {

// FP32 -> BF16, round to nearest, ties to even, on the bits. NaNs stay NaNs
// (quietened, keeping the sign and top payload bits) instead of rounding into
// infinity; overflow rounds to infinity as IEEE says.
inline uint16_t Bf16FromF32(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t bias = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + bias) >> 16);
}

// SplitMix64 seeding a xoshiro256+ core; Gaussian draws by Box-Muller.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (auto& s : s_) {
      seed += 0x9E3779B97F4A7C15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      s = z ^ (z >> 31);
    }
  }
  uint64_t Next() {
    const uint64_t result = s_[0] + s_[3];
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = std::rotl(s_[3], 45);
    return result;
  }
  // Uniform in (0, 1].
  double Uniform() { return (static_cast<double>(Next() >> 11) + 1.0) * 0x1.0p-53; }
  double Normal() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    const double r = std::sqrt(-2.0 * std::log(Uniform()));
    const double theta = 6.283185307179586 * Uniform();
    spare_ = r * std::sin(theta);
    have_spare_ = true;
    return r * std::cos(theta);
  }

 private:
  uint64_t s_[4];
  double spare_ = 0;
  bool have_spare_ = false;
};

// The state of one element and the update direction of the simulated step.
struct ElementStep {
  float w;       // master weight before the step
  float update;  // m / (sqrt(v) + 1e-8) after the step's moment updates
};

// Draws `n` elements of a tensor (norm_like: weights near 1.0).
inline std::vector<ElementStep> DrawElements(uint64_t seed, size_t n, bool norm_like) {
  Rng rng(seed);
  std::vector<ElementStep> out(n);
  // Steady state of the EMAs: m ~ b + N(0, 0.1 / 1.9), v ~ b^2 + 1.
  const double m_noise = std::sqrt(0.1 / 1.9);
  for (auto& e : out) {
    const double w = norm_like ? 1.0 + 0.02 * rng.Normal() : 0.02 * rng.Normal();
    const double b = 0.5 * rng.Normal();
    double m = b + m_noise * rng.Normal();
    double v = b * b + 1.0;
    const double g = b + rng.Normal();
    m = 0.9 * m + 0.1 * g;
    v = 0.999 * v + 0.001 * g * g;
    e.w = static_cast<float>(w);
    e.update = static_cast<float>(m / (std::sqrt(v) + 1e-8));
  }
  return out;
}

// BF16 images of the elements before and after a step of learning rate `lr`.
inline void StepBf16(const std::vector<ElementStep>& elements, double lr,
                     std::vector<uint16_t>& base, std::vector<uint16_t>& target) {
  base.resize(elements.size());
  target.resize(elements.size());
  const float lr_f = static_cast<float>(lr);
  for (size_t i = 0; i < elements.size(); ++i) {
    base[i] = Bf16FromF32(elements[i].w);
    target[i] = Bf16FromF32(elements[i].w - lr_f * elements[i].update);
  }
}

// Fraction of elements whose BF16 bits change under a step of `lr`.
inline double ChangeRate(const std::vector<ElementStep>& elements, double lr) {
  const float lr_f = static_cast<float>(lr);
  size_t changed = 0;
  for (const auto& e : elements) {
    changed += Bf16FromF32(e.w) != Bf16FromF32(e.w - lr_f * e.update);
  }
  return elements.empty() ? 0.0 : static_cast<double>(changed) / elements.size();
}

// The learning rate at which about `rate` of N(0, 0.02) weights change, found by
// bisection in log space on a fixed sample.
inline double CalibrateLr(double rate, uint64_t seed = 12345) {
  const auto sample = DrawElements(seed, 1 << 19, /*norm_like=*/false);
  double lo = 1e-9, hi = 1e-1;
  for (int i = 0; i < 50; ++i) {
    const double mid = std::sqrt(lo * hi);
    (ChangeRate(sample, mid) < rate ? lo : hi) = mid;
  }
  return std::sqrt(lo * hi);
}

// Order-0 entropy of a set of changes: n * H(gaps) + n * H(XOR values), from the
// empirical histograms of the changes themselves. A gap is the distance from
// the previous changed element (from element -1 for the first), counted along
// the concatenation of everything added.
class Order0Entropy {
 public:
  // Adds the changes between two equally long arrays of 16-bit words.
  void AddBf16(const std::vector<uint16_t>& base, const std::vector<uint16_t>& target) {
    for (size_t i = 0; i < base.size(); ++i) {
      const uint16_t x = base[i] ^ target[i];
      if (x != 0) {
        ++gaps_[offset_ + i - last_];
        ++values_[x];
        last_ = offset_ + i;
        ++n_;
      }
    }
    offset_ += base.size();
  }
  uint64_t changes() const { return n_; }
  double GapBits() const { return Bits(gaps_); }
  double ValueBits() const { return Bits(values_); }
  double Bytes() const { return (GapBits() + ValueBits()) / 8; }

 private:
  template <class Map>
  double Bits(const Map& histogram) const {
    double bits = 0;
    for (const auto& [key, count] : histogram) {
      bits -= static_cast<double>(count) * std::log2(static_cast<double>(count) / n_);
    }
    return bits;
  }

  std::unordered_map<uint64_t, uint64_t> gaps_;
  std::unordered_map<uint64_t, uint64_t> values_;
  uint64_t offset_ = 1;  // so the first gap counts from element -1
  uint64_t last_ = 0;
  uint64_t n_ = 0;
};

}  // namespace deltacast::bench
