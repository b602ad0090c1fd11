#include "agent/synth.h"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numbers>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>

#include "apply/safetensors.h"
#include "common/file_util.h"
#include "common/hash.h"
#include "common/parallel.h"
#include "common/thread_annotations.h"

namespace deltacast::agent {
namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------
// Random numbers: splitmix64 streams seeded per slice, so a slice's values do not
// depend on which thread computes it or on what else the run contains.

inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Normal deviates by piecewise-linear interpolation of the inverse CDF over 4096
// equal-probability bins: one table lookup and one multiply-add per value, about
// 5x faster than Box-Muller. The two tail bins end where the bin's mean equals the
// true conditional mean, so values reach about 3.9 sigma; the table is rescaled to
// unit variance.
constexpr int kNormalBinBits = 12;
constexpr size_t kNormalBins = size_t{1} << kNormalBinBits;

// Acklam's rational approximation refined by one Halley step (double precision).
double InverseNormalCdf(double p) {
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,
                                 -2.759285104469687e+02, 1.383577518672690e+02,
                                 -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02,
                                 -1.556989798598866e+02, 6.680131188771972e+01,
                                 -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01,
                                 -2.400758277161838e+00, -2.549732539343734e+00,
                                 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01,
                                 2.445134137142996e+00, 3.754408661907416e+00};
  constexpr double kLow = 0.02425;
  double x;
  if (p < kLow) {
    const double q = std::sqrt(-2 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else if (p > 1 - kLow) {
    const double q = std::sqrt(-2 * std::log(1 - p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else {
    const double q = p - 0.5;
    const double r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  }
  const double e = 0.5 * std::erfc(-x / std::sqrt(2.0)) - p;
  const double u = e * std::sqrt(2 * std::numbers::pi) * std::exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}

// Interleaved (start, slope) per bin so one lookup touches one cache line.
struct NormalTable {
  std::array<float, 2 * kNormalBins> start_slope;
};

NormalTable BuildNormalTable() {
  std::array<double, kNormalBins + 1> q;
  for (size_t j = 1; j < kNormalBins; ++j) {
    q[j] = InverseNormalCdf(static_cast<double>(j) / kNormalBins);
  }
  const double pdf_q1 = std::exp(-q[1] * q[1] / 2) / std::sqrt(2 * std::numbers::pi);
  q[0] = -2.0 * kNormalBins * pdf_q1 - q[1];  // (q0 + q1) / 2 == E[X | X < q1]
  q[kNormalBins] = -q[0];
  double variance = 0;  // of X uniform on each bin's segment, bins equally likely
  for (size_t j = 0; j < kNormalBins; ++j) {
    variance += (q[j] * q[j] + q[j] * q[j + 1] + q[j + 1] * q[j + 1]) / 3;
  }
  const double scale = 1 / std::sqrt(variance / kNormalBins);
  NormalTable t;
  for (size_t j = 0; j < kNormalBins; ++j) {
    t.start_slope[2 * j] = static_cast<float>(q[j] * scale);
    t.start_slope[2 * j + 1] = static_cast<float>((q[j + 1] - q[j]) * scale);
  }
  return t;
}

const NormalTable& GetNormalTable() {
  static const NormalTable table = BuildNormalTable();
  return table;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(Mix64(seed)) {}

  uint64_t Next() {
    state_ += 0x9e3779b97f4a7c15ull;
    return Mix64(state_);
  }

  // out[i] = mean + stddev * N(0, 1) for i in [0, n).
  void FillNormal(float* out, size_t n, float mean, float stddev) {
    const float* t = GetNormalTable().start_slope.data();
    auto sample = [t](uint32_t r) {
      constexpr int kFracBits = 32 - kNormalBinBits;
      const uint32_t bin = r >> kFracBits;
      const float frac =
          static_cast<float>(r & ((1u << kFracBits) - 1)) * (1.0f / (1u << kFracBits));
      return t[2 * bin] + frac * t[2 * bin + 1];
    };
    size_t i = 0;
    for (; i + 1 < n; i += 2) {
      const uint64_t r = Next();
      out[i] = mean + stddev * sample(static_cast<uint32_t>(r));
      out[i + 1] = mean + stddev * sample(static_cast<uint32_t>(r >> 32));
    }
    if (i < n) out[i] = mean + stddev * sample(static_cast<uint32_t>(Next()));
  }

 private:
  uint64_t state_;
};

uint64_t SliceSeed(uint64_t seed, uint64_t name_hash, uint64_t slice) {
  return Mix64(Mix64(Mix64(seed) ^ name_hash) + slice);
}

// ---------------------------------------------------------------------------
// BF16 storage.

inline float Bf16ToFloat(uint16_t h) { return std::bit_cast<float>(uint32_t{h} << 16); }

void ToBf16(const float* in, size_t n, uint16_t* out) {
  for (size_t i = 0; i < n; ++i) out[i] = FloatToBf16(in[i]);
}

// ---------------------------------------------------------------------------
// Optimizer dynamics. Adam is invariant to the gradient's scale (eps aside), so the
// synthetic gradient has unit noise: g = bias + N(0, 1), with a persistent
// per-element bias ~ N(0, kBiasStd^2). Moments start at their steady state
// (mid-training, so no bias correction): m ~ bias + the spread of an EMA of unit
// noise, v = E[g^2].

constexpr float kBeta1 = 0.9f;
constexpr float kBeta2 = 0.999f;
constexpr float kEps = 1e-8f;
constexpr float kBiasStd = 0.5f;
constexpr float kWeightDecay = 0.01f;

// How a tensor's weights start: N(mean, std^2); decayed unless it is a norm.
struct InitSpec {
  float mean = 0;
  float stddev = 0.02f;
  float weight_decay = kWeightDecay;
  auto operator<=>(const InitSpec&) const = default;
};

// HF's initializer_range for projections; embeddings and lm_head wider, as in trained
// checkpoints whose vocabulary rows grow larger than the projections; RMSNorm gains
// near 1 and, as in every LLM recipe, excluded from weight decay.
constexpr InitSpec kLinearInit{0.0f, 0.02f, kWeightDecay};
constexpr InitSpec kVocabInit{0.0f, 0.05f, kWeightDecay};
constexpr InitSpec kNormInit{1.0f, 0.02f, 0.0f};

// Per-element optimizer state for up to kSliceElements elements.
struct SliceState {
  std::vector<float> w, m, v, bias, noise;
  void Resize(size_t n) {
    for (auto* a : {&w, &m, &v, &bias, &noise}) a->resize(n);
  }
};

// Draws initial weights and steady-state moments. The draw order is part of the
// output format: changing it changes every checkpoint a seed produces.
void InitState(Rng& rng, const InitSpec& spec, size_t n, SliceState& s) {
  s.Resize(n);
  rng.FillNormal(s.w.data(), n, spec.mean, spec.stddev);
  rng.FillNormal(s.bias.data(), n, 0.0f, kBiasStd);
  const float m_noise = std::sqrt((1 - kBeta1) / (1 + kBeta1));
  rng.FillNormal(s.m.data(), n, 0.0f, m_noise);
  for (size_t i = 0; i < n; ++i) {
    s.m[i] += s.bias[i];
    s.v[i] = s.bias[i] * s.bias[i] + 1.0f;
  }
}

// Draws this step's gradient and updates the moments in place; leaves the Adam
// direction m / (sqrt(v) + eps) in s.noise.
void AdamDirection(Rng& rng, size_t n, SliceState& s) {
  rng.FillNormal(s.noise.data(), n, 0.0f, 1.0f);
  float* __restrict m = s.m.data();
  float* __restrict v = s.v.data();
  float* __restrict g = s.noise.data();
  const float* __restrict bias = s.bias.data();
  for (size_t i = 0; i < n; ++i) {
    const float gi = bias[i] + g[i];
    const float mi = kBeta1 * m[i] + (1 - kBeta1) * gi;
    const float vi = kBeta2 * v[i] + (1 - kBeta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    g[i] = mi / (std::sqrt(vi) + kEps);
  }
}

// AdamW: decoupled weight decay, applied with the same lr.
inline float AdamWUpdate(float w, float direction, float lr, float wd) {
  return w - lr * (direction + wd * w);
}

void ApplyUpdate(const float* __restrict direction, size_t n, float lr, float wd,
                 float* __restrict w) {
  for (size_t i = 0; i < n; ++i) w[i] = AdamWUpdate(w[i], direction[i], lr, wd);
}

// ---------------------------------------------------------------------------
// Model shape: Llama architecture (RMSNorm, SwiGLU MLP, GQA, untied lm_head).

struct ModelShape {
  uint64_t hidden = 0;
  uint64_t intermediate = 0;
  uint64_t vocab = 0;
  uint64_t heads = 0;
  uint64_t kv_heads = 0;
  uint64_t head_dim = 0;
  int layers = 0;
  uint64_t experts = 0;  // 0: a dense MLP

  uint64_t KvDim() const { return kv_heads * head_dim; }
  uint64_t PerLayer() const {
    return 2 * hidden * hidden + 2 * hidden * KvDim() + 3 * hidden * intermediate + 2 * hidden +
           experts * hidden;
  }
  uint64_t Params() const { return 2 * vocab * hidden + hidden + layers * PerLayer(); }
};

uint64_t RoundTo(double x, uint64_t multiple) {
  return static_cast<uint64_t>(std::llround(x / static_cast<double>(multiple))) * multiple;
}

// Searches widths and depths for the shape closest to `params`, preferring the
// proportions of published Llama-family models: depth about hidden/64 up to
// hidden 1024 and sqrt(hidden)/2 beyond (TinyLlama 2048x22, Llama-2-7B 4096x32),
// intermediate about 8/3 hidden (tuned within [2, 4] x hidden to hit the count),
// from 512 wide a head count divisible by 4 and, once there are 8 heads, GQA with 4
// query heads per KV head (Llama-3 style), vocabulary 32000
// (Llama-2), shrunk for small models so embeddings stay near a quarter of the total;
// or, with `embedding_share` > 0, the vocabulary that gives embeddings and LM head
// that share of the total.
ModelShape ChooseShape(uint64_t params, double embedding_share) {
  const double target = static_cast<double>(params);
  ModelShape best;
  double best_score = std::numeric_limits<double>::infinity();
  ModelShape closest;
  double closest_error = std::numeric_limits<double>::infinity();
  for (uint64_t h = 64; h <= 65536; h += 64) {
    ModelShape s;
    s.hidden = h;
    s.head_dim = h >= 3072 ? 128 : 64;
    if (h % s.head_dim != 0) continue;
    s.heads = h / s.head_dim;
    if (h >= 512 && s.heads % 4 != 0) continue;  // real widths allow GQA groups of 4
    s.kv_heads = (s.heads >= 8 && s.heads % 4 == 0) ? s.heads / 4 : s.heads;
    s.vocab = embedding_share > 0
                  ? std::max<uint64_t>(
                        RoundTo(embedding_share / 2 * target / static_cast<double>(h), 64), 64)
                  : std::clamp<uint64_t>(RoundTo(0.125 * target / static_cast<double>(h), 64), 256,
                                         32000);
    const uint64_t multiple = h >= 2048 ? 256 : 64;
    const double ideal_layers =
        h <= 1024 ? std::max(2.0, h / 64.0) : std::sqrt(static_cast<double>(h)) / 2;
    const double fixed = 2.0 * static_cast<double>(s.vocab * h + h / 2);
    for (int layers = 2; layers <= 1024; ++layers) {
      s.layers = layers;
      s.intermediate = 0;
      const double rest = target - fixed - layers * static_cast<double>(s.PerLayer());
      if (rest <= 0) break;
      s.intermediate = std::max<uint64_t>(RoundTo(rest / (3.0 * h * layers), multiple), multiple);
      if (s.intermediate < 2 * h) break;  // deeper only shrinks it further
      const double error = std::abs(static_cast<double>(s.Params()) - target) / target;
      if (error < closest_error) {
        closest_error = error;
        closest = s;
      }
      if (s.intermediate > 4 * h || error > 0.02) continue;
      const double score = std::abs(std::log(layers / ideal_layers)) +
                           std::abs(std::log(static_cast<double>(s.intermediate) / (8.0 * h / 3)));
      if (score < best_score) {
        best_score = score;
        best = s;
      }
    }
  }
  return best.layers > 0 ? best : closest;
}

struct SynthTensor {
  TensorSpec info;
  InitSpec init;
  uint64_t name_hash = 0;  // seeds its slices, so values do not depend on sharding
  int shard = 0;
};

// Tensors in state_dict order, the order Hugging Face assigns them to shards.
std::vector<SynthTensor> BuildTensors(const ModelShape& s) {
  std::vector<SynthTensor> out;
  auto add = [&](std::string name, std::vector<uint64_t> shape, const InitSpec& init) {
    SynthTensor t;
    t.info = {std::move(name), DType::kBF16, std::move(shape)};
    t.init = init;
    t.name_hash = Hash64(AsBytes(t.info.name));
    out.push_back(std::move(t));
  };
  const uint64_t h = s.hidden;
  add("model.embed_tokens.weight", {s.vocab, h}, kVocabInit);
  for (int i = 0; i < s.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "self_attn.q_proj.weight", {h, h}, kLinearInit);
    add(p + "self_attn.k_proj.weight", {s.KvDim(), h}, kLinearInit);
    add(p + "self_attn.v_proj.weight", {s.KvDim(), h}, kLinearInit);
    add(p + "self_attn.o_proj.weight", {h, h}, kLinearInit);
    if (s.experts == 0) {
      add(p + "mlp.gate_proj.weight", {s.intermediate, h}, kLinearInit);
      add(p + "mlp.up_proj.weight", {s.intermediate, h}, kLinearInit);
      add(p + "mlp.down_proj.weight", {h, s.intermediate}, kLinearInit);
    } else {
      // The dense MLP's parameters spread over the experts, plus a router.
      const uint64_t ffn = s.intermediate / s.experts;
      add(p + "mlp.gate.weight", {s.experts, h}, kLinearInit);
      for (uint64_t e = 0; e < s.experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        add(x + "gate_proj.weight", {ffn, h}, kLinearInit);
        add(x + "up_proj.weight", {ffn, h}, kLinearInit);
        add(x + "down_proj.weight", {h, ffn}, kLinearInit);
      }
    }
    add(p + "input_layernorm.weight", {h}, kNormInit);
    add(p + "post_attention_layernorm.weight", {h}, kNormInit);
  }
  add("model.norm.weight", {h}, kNormInit);
  add("lm_head.weight", {s.vocab, h}, kVocabInit);
  return out;
}

// Hugging Face's default (5 GB) for big models; small ones still get 2-4 files so
// that multi-file handling is always exercised.
uint64_t AutoShardBytes(uint64_t total_bytes) {
  if (total_bytes < (64ull << 20)) return (total_bytes + 1) / 2;
  return std::min<uint64_t>(5'000'000'000ull, (total_bytes + 3) / 4);
}

std::string ShardName(int index, int count) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05d-of-%05d.safetensors", index + 1, count);
  return buf;
}

bool IsShardName(const std::string& name) {
  // model-NNNNN-of-NNNNN.safetensors
  if (name.size() != 32 || !name.starts_with("model-") || !name.ends_with(".safetensors") ||
      name.substr(11, 4) != "-of-") {
    return false;
  }
  for (size_t i : {6, 7, 8, 9, 10, 15, 16, 17, 18, 19}) {
    if (name[i] < '0' || name[i] > '9') return false;
  }
  return true;
}

constexpr uint64_t kSliceElements = uint64_t{1} << 18;
constexpr size_t kCalibrationSample = size_t{1} << 20;

struct SliceDesc {
  size_t tensor = 0;  // index into Plan::file_order
  uint64_t index_in_tensor = 0;
  uint64_t offset = 0;  // first element
  uint64_t count = 0;
};

// Everything decided before the first byte is written.
struct Plan {
  ModelShape shape;
  std::vector<SynthTensor> canonical;   // state_dict order
  std::vector<SynthTensor> file_order;  // shard by shard, by name within a shard
  std::vector<std::vector<TensorSpec>> shard_tensors;
  std::vector<std::string> shard_names;
  std::vector<SliceDesc> slices;
  uint64_t total_bytes = 0;
};

Plan MakePlan(uint64_t params, uint64_t max_shard_bytes, uint64_t experts, double embedding_share) {
  Plan plan;
  plan.shape = ChooseShape(params, embedding_share);
  plan.shape.experts = experts;
  plan.canonical = BuildTensors(plan.shape);
  for (const auto& t : plan.canonical) plan.total_bytes += t.info.ByteSize();
  if (max_shard_bytes == 0) max_shard_bytes = AutoShardBytes(plan.total_bytes);

  // Greedy in state_dict order, as transformers' shard_checkpoint does: a tensor that
  // does not fit starts a new shard; one larger than the limit gets a shard alone.
  int shards = 0;
  uint64_t in_shard = 0;
  for (auto& t : plan.canonical) {
    const uint64_t bytes = t.info.ByteSize();
    if (shards == 0 || (in_shard > 0 && in_shard + bytes > max_shard_bytes)) {
      ++shards;
      in_shard = 0;
    }
    t.shard = shards - 1;
    in_shard += bytes;
  }

  // The safetensors library stores a file's tensors sorted by name, so the data
  // section (and therefore the generation order) follows that order.
  plan.file_order = plan.canonical;
  std::stable_sort(plan.file_order.begin(), plan.file_order.end(),
                   [](const SynthTensor& a, const SynthTensor& b) {
                     return std::tie(a.shard, a.info.name) < std::tie(b.shard, b.info.name);
                   });
  plan.shard_tensors.resize(shards);
  for (int i = 0; i < shards; ++i) plan.shard_names.push_back(ShardName(i, shards));
  for (size_t i = 0; i < plan.file_order.size(); ++i) {
    const auto& t = plan.file_order[i];
    plan.shard_tensors[t.shard].push_back(t.info);
    const uint64_t n = t.info.ElementCount();
    for (uint64_t off = 0, k = 0; off < n; off += kSliceElements, ++k) {
      plan.slices.push_back({i, k, off, std::min(kSliceElements, n - off)});
    }
  }
  return plan;
}

// ---------------------------------------------------------------------------
// Learning-rate calibration.

// Draws a sample spread over tensor kinds in proportion to their parameters,
// takes one step's Adam direction (it does not depend on lr), then bisects lr in
// log space until the fraction of BF16 values that change matches the target.
double CalibrateLearningRate(const Plan& plan, uint64_t seed, double target) {
  std::map<InitSpec, uint64_t> kind_params;
  uint64_t total = 0;
  for (const auto& t : plan.canonical) {
    kind_params[t.init] += t.info.ElementCount();
    total += t.info.ElementCount();
  }
  const uint64_t sample = std::min<uint64_t>(total, kCalibrationSample);
  struct Group {
    float wd;
    std::vector<float> w, direction;
    std::vector<uint16_t> bf16;
  };
  std::vector<Group> groups;
  uint64_t kind_index = 0;
  for (const auto& [spec, count] : kind_params) {
    const size_t n = static_cast<size_t>(
        std::llround(static_cast<double>(sample) * static_cast<double>(count) / total));
    if (n == 0) continue;
    Rng rng(SliceSeed(seed, 0x63616c6962726174ull /* "calibrat" */, kind_index++));
    SliceState s;
    InitState(rng, spec, n, s);
    AdamDirection(rng, n, s);
    Group g{spec.weight_decay, std::move(s.w), std::move(s.noise), {}};
    g.bf16.resize(n);
    ToBf16(g.w.data(), n, g.bf16.data());
    groups.push_back(std::move(g));
  }
  auto change_fraction = [&](double lr) {
    uint64_t changed = 0, n = 0;
    const float lr_f = static_cast<float>(lr);
    for (const auto& g : groups) {
      for (size_t i = 0; i < g.w.size(); ++i) {
        changed += FloatToBf16(AdamWUpdate(g.w[i], g.direction[i], lr_f, g.wd)) != g.bf16[i];
      }
      n += g.w.size();
    }
    return static_cast<double>(changed) / static_cast<double>(n);
  };
  double lo = 1e-12, hi = 1.0;
  for (int iter = 0; iter < 48; ++iter) {
    const double mid = std::sqrt(lo * hi);
    (change_fraction(mid) < target ? lo : hi) = mid;
  }
  return std::sqrt(lo * hi);
}

// ---------------------------------------------------------------------------
// Generation.

// A slice's BF16 values at every step, and what changed.
struct SliceResult {
  const SliceDesc* desc = nullptr;
  std::vector<uint16_t> bf16;  // (steps + 1) * count, step-major
  std::vector<SynthStepStats> stats;
};

// Hands out optimizer-state scratch so memory is per thread, not per slice.
class ScratchPool {
 public:
  std::unique_ptr<SliceState> Take() {
    MutexLock lock(mu_);
    if (free_.empty()) return std::make_unique<SliceState>();
    auto s = std::move(free_.back());
    free_.pop_back();
    return s;
  }
  void Return(std::unique_ptr<SliceState> s) {
    MutexLock lock(mu_);
    free_.push_back(std::move(s));
  }

 private:
  Mutex mu_;
  std::vector<std::unique_ptr<SliceState>> free_ GUARDED_BY(mu_);
};

void CountChanges(const uint16_t* before2, const uint16_t* before, const uint16_t* after, size_t n,
                  SynthStepStats& st) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t a = before[i], c = after[i];
    const uint16_t x = a ^ c;
    if (x == 0) continue;
    ++st.changed;
    if (x & 0x8000) {
      ++st.sign_flips;
    } else if (std::abs(int{a & 0x7fff} - int{c & 0x7fff}) == 1) {
      ++st.one_ulp;
    }
    st.xor_low_run += (x == 0x1 || x == 0x3 || x == 0x7 || x == 0xf);
    if (before2 != nullptr && before2[i] != a) {
      ++st.repeats;
      const bool up_now = Bf16ToFloat(c) > Bf16ToFloat(a);
      const bool up_before = Bf16ToFloat(a) > Bf16ToFloat(before2[i]);
      st.repeats_same_direction += up_now == up_before;
    }
  }
  if (before2 != nullptr) {
    for (size_t i = 0; i < n; ++i) st.prev_changed += before2[i] != before[i];
  }
}

void ComputeSlice(const Plan& plan, const SliceDesc& d, uint64_t seed, int steps, float lr,
                  ScratchPool& pool, SliceResult& out) {
  const SynthTensor& t = plan.file_order[d.tensor];
  const size_t n = d.count;
  out.desc = &d;
  out.bf16.resize((steps + 1) * n);
  out.stats.assign(steps, SynthStepStats{});
  auto state = pool.Take();
  Rng rng(SliceSeed(seed, t.name_hash, d.index_in_tensor));
  InitState(rng, t.init, n, *state);
  ToBf16(state->w.data(), n, out.bf16.data());
  for (int k = 1; k <= steps; ++k) {
    AdamDirection(rng, n, *state);
    ApplyUpdate(state->noise.data(), n, lr, t.init.weight_decay, state->w.data());
    uint16_t* cur = out.bf16.data() + k * n;
    ToBf16(state->w.data(), n, cur);
    CountChanges(k >= 2 ? cur - 2 * n : nullptr, cur - n, cur, n, out.stats[k - 1]);
  }
  pool.Return(std::move(state));
}

// The open files of the shard being written, one per step.
class StepWriters {
 public:
  StepWriters(const Plan& plan, std::vector<fs::path> step_dirs)
      : plan_(plan), step_dirs_(std::move(step_dirs)) {}

  Status Write(const std::vector<SliceResult>& window, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      const SliceResult& r = window[i];
      const int shard = plan_.file_order[r.desc->tensor].shard;
      if (shard != shard_) RETURN_IF_ERROR(Open(shard));
      const size_t n = r.desc->count;
      for (size_t k = 0; k < writers_.size(); ++k) {
        const auto* p = reinterpret_cast<const std::byte*>(r.bf16.data() + k * n);
        RETURN_IF_ERROR(writers_[k]->Append(ByteSpan(p, n * sizeof(uint16_t))));
      }
    }
    return Status::Ok();
  }

  Status Finish() {
    for (auto& w : writers_) RETURN_IF_ERROR(w->Finish());
    writers_.clear();
    return Status::Ok();
  }

 private:
  Status Open(int shard) {
    RETURN_IF_ERROR(Finish());
    const std::map<std::string, std::string> metadata = {{"format", "pt"}};
    for (const auto& dir : step_dirs_) {
      ASSIGN_OR_RETURN(auto w,
                       apply::SafetensorsWriter::Create(dir / plan_.shard_names[shard],
                                                        plan_.shard_tensors[shard], metadata));
      writers_.push_back(std::move(w));
    }
    shard_ = shard;
    return Status::Ok();
  }

  const Plan& plan_;
  std::vector<fs::path> step_dirs_;
  std::vector<std::unique_ptr<apply::SafetensorsWriter>> writers_;
  int shard_ = -1;
};

std::string IndexJson(const Plan& plan) {
  nlohmann::json weight_map = nlohmann::json::object();
  for (const auto& t : plan.canonical) weight_map[t.info.name] = plan.shard_names[t.shard];
  nlohmann::json index = {{"metadata", {{"total_size", plan.total_bytes}}},
                          {"weight_map", std::move(weight_map)}};
  return index.dump(2) + "\n";  // as transformers writes it: indent 2, sorted keys
}

std::string ConfigJson(const ModelShape& s) {
  nlohmann::json config = {
      {"architectures", {"LlamaForCausalLM"}},
      {"attention_bias", false},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
      {"head_dim", s.head_dim},
      {"hidden_act", "silu"},
      {"hidden_size", s.hidden},
      {"initializer_range", 0.02},
      {"intermediate_size", s.intermediate},
      {"max_position_embeddings", 4096},
      {"model_type", "llama"},
      {"num_attention_heads", s.heads},
      {"num_hidden_layers", s.layers},
      {"num_key_value_heads", s.kv_heads},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", 10000.0},
      {"tie_word_embeddings", false},
      {"torch_dtype", "bfloat16"},
      {"vocab_size", s.vocab},
  };
  return config.dump(2) + "\n";
}

Status ValidateOptions(const SynthOptions& o) {
  if (o.out_dir.empty()) return Status::InvalidArgument("synth: no output directory given");
  if (o.params < kMinSynthParams || o.params > kMaxSynthParams) {
    return Status::InvalidArgument("synth: params " + std::to_string(o.params) +
                                   " is outside [1M, 1T]");
  }
  if (o.steps < 1 || o.steps > kMaxSynthSteps) {
    return Status::InvalidArgument("synth: steps " + std::to_string(o.steps) + " is outside [1, " +
                                   std::to_string(kMaxSynthSteps) + "]");
  }
  if (!std::isfinite(o.lr) || o.lr < 0 || o.lr >= 1) {
    return Status::InvalidArgument("synth: learning rate " + std::to_string(o.lr) +
                                   " is outside [0, 1) (0 = calibrate from the change rate)");
  }
  if (o.experts == 1 || o.experts > 64) {
    return Status::InvalidArgument("synth: experts " + std::to_string(o.experts) +
                                   " is outside [2, 64] (0 = a dense MLP)");
  }
  if (o.embedding_share != 0 && !(o.embedding_share >= 0.001 && o.embedding_share <= 0.5)) {
    return Status::InvalidArgument("synth: embedding share " + std::to_string(o.embedding_share) +
                                   " is outside [0.001, 0.5] (0 = the default shape's)");
  }
  if (o.lr == 0 &&
      !(o.change_rate >= kMinSynthChangeRate && o.change_rate <= kMaxSynthChangeRate)) {
    return Status::InvalidArgument("synth: change rate " + std::to_string(o.change_rate) +
                                   " is outside [0.001, 0.5]");
  }
  return Status::Ok();
}

// Creates the step directories, removes shards of an earlier run that the new
// layout would not overwrite, and checks that the output fits on the disk.
Status PrepareDirectories(const Plan& plan, const std::vector<fs::path>& dirs) {
  uint64_t reclaimed = 0;
  for (const auto& dir : dirs) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return Status::IoError("synth: cannot create " + dir.string() + ": " + ec.message());
    if (!fs::is_directory(dir, ec)) {
      return Status::IoError("synth: " + dir.string() + " is not a directory");
    }
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      const bool ours = std::find(plan.shard_names.begin(), plan.shard_names.end(), name) !=
                        plan.shard_names.end();
      if (!ours && !IsShardName(name)) continue;
      std::error_code entry_ec;
      const uint64_t size = entry.is_regular_file(entry_ec) ? entry.file_size(entry_ec) : 0;
      if (entry_ec) continue;
      reclaimed += size;
      if (!ours && !fs::remove(entry.path(), entry_ec)) {
        return Status::IoError("synth: cannot remove stale " + entry.path().string() + ": " +
                               entry_ec.message());
      }
    }
    if (ec) return Status::IoError("synth: cannot list " + dir.string() + ": " + ec.message());
  }
  std::error_code ec;
  const fs::space_info space = fs::space(dirs.front(), ec);
  const uint64_t needed = plan.total_bytes * dirs.size();
  if (!ec && space.available + reclaimed < needed) {
    return Status::ResourceExhausted(
        "synth: " + std::to_string(dirs.size()) + " checkpoints need " +
        std::to_string(needed >> 20) + " MiB but " + dirs.front().parent_path().string() + " has " +
        std::to_string((space.available + reclaimed) >> 20) + " MiB free");
  }
  return Status::Ok();
}

}  // namespace

Result<SynthReport> Synthesize(const SynthOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  const Plan plan =
      MakePlan(options.params, options.max_shard_bytes, options.experts, options.embedding_share);
  if (plan.shape.experts > 0 && plan.shape.intermediate % plan.shape.experts != 0) {
    return Status::InvalidArgument("synth: " + std::to_string(plan.shape.experts) +
                                   " experts do not divide the intermediate size " +
                                   std::to_string(plan.shape.intermediate));
  }
  const int steps = options.steps;
  std::vector<fs::path> step_dirs;
  for (int k = 0; k <= steps; ++k)
    step_dirs.push_back(options.out_dir / ("step" + std::to_string(k)));
  RETURN_IF_ERROR(PrepareDirectories(plan, step_dirs));

  SynthReport report;
  for (const auto& t : plan.canonical) report.tensors.push_back(t.info);
  report.params = plan.shape.Params();
  report.layers = plan.shape.layers;
  report.hidden = plan.shape.hidden;
  report.intermediate = plan.shape.intermediate;
  report.vocab = plan.shape.vocab;
  report.heads = plan.shape.heads;
  report.kv_heads = plan.shape.kv_heads;
  report.head_dim = plan.shape.head_dim;
  report.experts = plan.shape.experts;
  report.shards = static_cast<int>(plan.shard_names.size());
  report.lr =
      options.lr > 0 ? options.lr : CalibrateLearningRate(plan, options.seed, options.change_rate);
  report.step_stats.assign(steps, SynthStepStats{});
  const float lr = static_cast<float>(report.lr);

  // Compute a window of slices in parallel while the previous window is written,
  // so file order is kept and compute and I/O overlap.
  // Capped because each thread in flight holds a window of (steps + 1) BF16 slices.
  const size_t threads =
      std::min<size_t>(options.threads == 0 ? DefaultThreadCount() : options.threads, 256);
  const size_t window = 2 * threads;
  std::array<std::vector<SliceResult>, 2> buffers;
  for (auto& b : buffers) b.resize(window);
  ScratchPool pool;
  StepWriters writers(plan, step_dirs);
  std::future<Status> pending;  // declared after the buffers: joined before they die
  const uint64_t bytes_per_element = 2 * static_cast<uint64_t>(steps + 1);  // BF16, every step
  uint64_t bytes_total = 0, bytes_done = 0;
  for (const SliceDesc& slice : plan.slices) bytes_total += slice.count * bytes_per_element;
  if (options.on_progress) options.on_progress(0, bytes_total);
  for (size_t first = 0, w = 0; first < plan.slices.size(); first += window, ++w) {
    auto& buf = buffers[w % 2];
    const size_t count = std::min(window, plan.slices.size() - first);
    ParallelFor(count, threads, [&](size_t i) {
      ComputeSlice(plan, plan.slices[first + i], options.seed, steps, lr, pool, buf[i]);
    });
    if (options.on_progress) {
      for (size_t i = 0; i < count; ++i)
        bytes_done += plan.slices[first + i].count * bytes_per_element;
      options.on_progress(bytes_done, bytes_total);
    }
    for (size_t i = 0; i < count; ++i) {
      for (int k = 0; k < steps; ++k) {
        SynthStepStats& total = report.step_stats[k];
        const SynthStepStats& s = buf[i].stats[k];
        total.changed += s.changed;
        total.one_ulp += s.one_ulp;
        total.xor_low_run += s.xor_low_run;
        total.sign_flips += s.sign_flips;
        total.prev_changed += s.prev_changed;
        total.repeats += s.repeats;
        total.repeats_same_direction += s.repeats_same_direction;
      }
    }
    if (pending.valid()) RETURN_IF_ERROR(pending.get());
    pending = std::async(std::launch::async,
                         [&writers, &buf, count] { return writers.Write(buf, count); });
  }
  if (pending.valid()) RETURN_IF_ERROR(pending.get());
  RETURN_IF_ERROR(writers.Finish());

  const std::string index = IndexJson(plan);
  const std::string config = ConfigJson(plan.shape);
  for (const auto& dir : step_dirs) {
    RETURN_IF_ERROR(WriteFile(dir / "model.safetensors.index.json", AsBytes(index)));
    RETURN_IF_ERROR(WriteFile(dir / "config.json", AsBytes(config)));
  }
  for (const auto& name : plan.shard_names) {
    std::error_code ec;
    const uint64_t size = fs::file_size(step_dirs.front() / name, ec);
    if (ec) return Status::IoError("synth: cannot stat " + name + ": " + ec.message());
    report.bytes_per_checkpoint += size;
  }
  if (options.shards.requested) {
    ShardModel model;
    model.hidden = plan.shape.hidden;
    model.heads = plan.shape.heads;
    model.kv_heads = plan.shape.kv_heads;
    model.head_dim = plan.shape.head_dim;
    model.layers = static_cast<uint64_t>(plan.shape.layers);
    model.intermediate = plan.shape.intermediate;
    model.vocab = plan.shape.vocab;
    model.experts = plan.shape.experts;
    for (const auto& dir : step_dirs) RETURN_IF_ERROR(WriteShards(dir, model, options.shards));
    report.shard_ranks = static_cast<int>(options.shards.Ranks());
  }
  for (const auto& s : report.step_stats) {
    report.measured_change_rate.push_back(static_cast<double>(s.changed) /
                                          static_cast<double>(report.params));
  }
  return report;
}

}  // namespace deltacast::agent
