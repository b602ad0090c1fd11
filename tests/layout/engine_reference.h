// An independent sharder of how vLLM and SGLang hold a Hugging Face checkpoint's
// tensors on each GPU, written with element loops from the engines' weight
// loaders (docs/layout.md, "Engine layouts"), never from layout/: the tests build
// each GPU's parameters with it, as the engine's named_parameters() would hold
// them, and compare them byte for byte with what a refit left there.
//
// Canonical values are iota (tensor << 40 | element, reference.h), so any element
// in a wrong place shows.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tests/layout/reference.h"

namespace deltacast::layout::testing {

// A Qwen2 / Llama / Qwen3-shaped model, small.
struct EngineModel {
  std::string model_type = "qwen2";  // qwen2: QKV biases; qwen3: q/k norms
  uint64_t hidden = 32, heads = 8, kv_heads = 2, head_dim = 4, ffn = 24, vocab = 50;
  uint64_t layers = 2;
  uint64_t experts = 0, moe_ffn = 8, shared_ffn = 0;  // experts > 0: every layer is MoE
  bool tied = false;
  // > 0: block-FP8 serving weights; each decoder linear has a weight_scale_inv grid
  // of [ceil(rows / fp8_block), ceil(cols / fp8_block)] (placement does not care that
  // the tests' values are I64).
  uint64_t fp8_block = 0;

  bool Bias() const { return model_type == "qwen2" || model_type == "qwen2_moe"; }
  bool QkNorm() const { return model_type == "qwen3" || model_type == "qwen3_moe"; }

  // config.json as the checkpoint ships it.
  std::string ConfigJson() const {
    std::string j =
        "{\"model_type\": \"" + model_type + "\", \"hidden_size\": " + std::to_string(hidden) +
        ", \"num_attention_heads\": " + std::to_string(heads) +
        ", \"num_key_value_heads\": " + std::to_string(kv_heads) +
        ", \"head_dim\": " + std::to_string(head_dim) +
        ", \"intermediate_size\": " + std::to_string(ffn) +
        ", \"vocab_size\": " + std::to_string(vocab) +
        ", \"num_hidden_layers\": " + std::to_string(layers) +
        ", \"tie_word_embeddings\": " + (tied ? "true" : "false") + ", \"rms_norm_eps\": 1e-06";
    if (experts > 0) {
      j += ", \"num_experts\": " + std::to_string(experts) +
           ", \"moe_intermediate_size\": " + std::to_string(moe_ffn) +
           ", \"shared_expert_intermediate_size\": " + std::to_string(shared_ffn) +
           ", \"num_experts_per_tok\": 2";
    }
    if (fp8_block > 0) {
      const std::string b = std::to_string(fp8_block);
      j += ", \"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", "
           "\"activation_scheme\": \"dynamic\", \"weight_block_size\": [" +
           b + ", " + b + "], \"modules_to_not_convert\": [\"lm_head\", \"model.embed_tokens\"]}";
    }
    return j + "}";
  }
};

// The engine and its parallel settings (engine.h's EngineParallel, restated).
struct EngineRun {
  std::string engine = "vllm";
  uint64_t tp = 1, dp = 1, ep = 1;
  uint64_t Gpus() const { return tp * dp; }
};

// The checkpoint's tensors, Hugging Face names, sorted, iota values.
inline std::vector<Tensor> EngineCanonical(const EngineModel& m) {
  std::vector<TensorSpec> specs;
  auto add = [&](std::string name, std::vector<uint64_t> shape) {
    const bool linear = name.find("_proj.weight") != std::string::npos;
    if (linear && m.fp8_block > 0 && shape.size() == 2) {
      const uint64_t b = m.fp8_block;
      specs.push_back(
          {name + "_scale_inv", DType::kI64, {(shape[0] + b - 1) / b, (shape[1] + b - 1) / b}});
    }
    specs.push_back({std::move(name), DType::kI64, std::move(shape)});
  };
  const uint64_t h = m.hidden, q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  add("model.embed_tokens.weight", {m.vocab, h});
  for (uint64_t l = 0; l < m.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "self_attn.q_proj.weight", {q, h});
    add(p + "self_attn.k_proj.weight", {kv, h});
    add(p + "self_attn.v_proj.weight", {kv, h});
    if (m.Bias()) {
      add(p + "self_attn.q_proj.bias", {q});
      add(p + "self_attn.k_proj.bias", {kv});
      add(p + "self_attn.v_proj.bias", {kv});
    }
    if (m.QkNorm()) {
      add(p + "self_attn.q_norm.weight", {m.head_dim});
      add(p + "self_attn.k_norm.weight", {m.head_dim});
    }
    add(p + "self_attn.o_proj.weight", {h, q});
    add(p + "input_layernorm.weight", {h});
    add(p + "post_attention_layernorm.weight", {h});
    if (m.experts == 0) {
      add(p + "mlp.gate_proj.weight", {m.ffn, h});
      add(p + "mlp.up_proj.weight", {m.ffn, h});
      add(p + "mlp.down_proj.weight", {h, m.ffn});
      continue;
    }
    add(p + "mlp.gate.weight", {m.experts, h});
    for (uint64_t e = 0; e < m.experts; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      add(x + "gate_proj.weight", {m.moe_ffn, h});
      add(x + "up_proj.weight", {m.moe_ffn, h});
      add(x + "down_proj.weight", {h, m.moe_ffn});
    }
    if (m.shared_ffn > 0) {
      add(p + "mlp.shared_expert.gate_proj.weight", {m.shared_ffn, h});
      add(p + "mlp.shared_expert.up_proj.weight", {m.shared_ffn, h});
      add(p + "mlp.shared_expert.down_proj.weight", {h, m.shared_ffn});
      add(p + "mlp.shared_expert_gate.weight", {1, h});
    }
  }
  add("model.norm.weight", {h});
  if (!m.tied) add("lm_head.weight", {m.vocab, h});
  std::sort(specs.begin(), specs.end(),
            [](const TensorSpec& a, const TensorSpec& b) { return a.name < b.name; });
  std::vector<Tensor> out;
  for (uint64_t c = 0; c < specs.size(); ++c) {
    Tensor t{specs[c], std::vector<int64_t>(specs[c].ElementCount())};
    for (uint64_t e = 0; e < t.values.size(); ++e) t.values[e] = Iota(c, e);
    out.push_back(std::move(t));
  }
  return out;
}

class EngineSharder {
 public:
  EngineSharder(const EngineModel& model, const EngineRun& run,
                const std::vector<Tensor>& canonical)
      : m_(model), run_(run) {
    for (const Tensor& t : canonical) by_name_[t.spec.name] = &t;
  }

  // GPU g's parameters, named and shaped as the engine's module holds them.
  std::vector<Tensor> Gpu(uint64_t g) const {
    const uint64_t tp = g % run_.tp;
    std::vector<Tensor> out;
    out.push_back(Vocab("model.embed_tokens.weight", tp));
    for (uint64_t l = 0; l < m_.layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      out.push_back(Qkv(p, "weight", tp));
      if (Fp8()) out.push_back(Qkv(p, "weight_scale_inv", tp));
      if (m_.Bias()) out.push_back(Qkv(p, "bias", tp));
      for (const std::string& w : Parts(p + "self_attn.o_proj.weight")) {
        out.push_back(Columns(w, C(w), tp, run_.tp));
      }
      if (m_.QkNorm()) {
        out.push_back(Copy(p + "self_attn.q_norm.weight"));
        out.push_back(Copy(p + "self_attn.k_norm.weight"));
      }
      if (m_.experts == 0) {
        for (const std::string& x : Parts("")) {
          out.push_back(GateUp(p + "mlp.gate_up_proj.weight" + x, C(p + "mlp.gate_proj.weight" + x),
                               C(p + "mlp.up_proj.weight" + x), tp, run_.tp));
        }
        for (const std::string& w : Parts(p + "mlp.down_proj.weight")) {
          out.push_back(Columns(w, C(w), tp, run_.tp));
        }
      } else {
        out.push_back(Copy(p + "mlp.gate.weight"));
        Experts(p, g, out);
        if (m_.shared_ffn > 0) {
          const std::string s = p + "mlp.shared_expert.";
          for (const std::string& x : Parts("")) {
            out.push_back(GateUp(s + "gate_up_proj.weight" + x, C(s + "gate_proj.weight" + x),
                                 C(s + "up_proj.weight" + x), tp, run_.tp));
          }
          for (const std::string& w : Parts(s + "down_proj.weight")) {
            out.push_back(Columns(w, C(w), tp, run_.tp));
          }
          out.push_back(Copy(p + "mlp.shared_expert_gate.weight"));
        }
      }
      out.push_back(Copy(p + "input_layernorm.weight"));
      out.push_back(Copy(p + "post_attention_layernorm.weight"));
    }
    out.push_back(Copy("model.norm.weight"));
    if (!m_.tied) out.push_back(Vocab("lm_head.weight", tp));
    return out;
  }

 private:
  const Tensor& C(const std::string& name) const { return *by_name_.at(name); }

  bool Fp8() const { return m_.fp8_block > 0; }
  // A linear's weight, then with FP8 its scale grid, which the engine loads as it
  // loads the weight (BlockQuantScaleParameter: rows and columns divided by the block).
  std::vector<std::string> Parts(const std::string& weight) const {
    if (!Fp8()) return {weight};
    return {weight, weight + "_scale_inv"};
  }

  Tensor Copy(const std::string& name) const {
    const Tensor& c = C(name);
    return {c.spec, c.values};
  }

  // VocabParallelEmbedding / ParallelLMHead: rows padded to a multiple of 64, each
  // rank a contiguous equal share; padding rows hold no checkpoint value.
  Tensor Vocab(const std::string& name, uint64_t tp) const {
    const Tensor& c = C(name);
    const uint64_t v = c.spec.shape[0], h = c.spec.shape[1];
    const uint64_t padded = (v + 63) / 64 * 64, per = padded / run_.tp;
    Tensor t{{name, c.spec.dtype, {per, h}}, std::vector<int64_t>(per * h, kPadding)};
    for (uint64_t i = 0; i < per; ++i) {
      const uint64_t row = tp * per + i;
      if (row >= v) continue;
      for (uint64_t j = 0; j < h; ++j) t.values[i * h + j] = c.values[row * h + j];
    }
    return t;
  }

  // QKVParallelLinear: this rank's query heads, then its KV heads' k rows, then
  // their v rows; with fewer KV heads than ranks, rank r holds head r / (tp / kv).
  Tensor Qkv(const std::string& p, const std::string& part, uint64_t tp) const {
    const Tensor& q = C(p + "self_attn.q_proj." + part);
    const Tensor& k = C(p + "self_attn.k_proj." + part);
    const Tensor& v = C(p + "self_attn.v_proj." + part);
    // A scale grid (FP8) holds one row per block of b weight rows: local grid row
    // i is the block of local weight row i * b, whose source row divided by b is
    // the canonical grid row.
    const bool grid = part == "weight_scale_inv";
    const uint64_t b = grid ? m_.fp8_block : 1;
    const uint64_t row = part == "bias" ? 1 : (m_.hidden + b - 1) / b, hd = m_.head_dim;
    const uint64_t q_heads = m_.heads / run_.tp;
    uint64_t kv_heads = 0, first_kv = 0;
    if (m_.kv_heads >= run_.tp) {
      kv_heads = m_.kv_heads / run_.tp;
      first_kv = tp * kv_heads;
    } else {
      kv_heads = 1;
      first_kv = tp / (run_.tp / m_.kv_heads);
    }
    const uint64_t rows = (q_heads + 2 * kv_heads) * hd / b;
    std::vector<uint64_t> shape{rows};
    if (part != "bias") shape.push_back(row);
    Tensor t{{p + "self_attn.qkv_proj." + part, q.spec.dtype, shape},
             std::vector<int64_t>(rows * row)};
    for (uint64_t i = 0; i < rows; ++i) {
      const uint64_t w = i * b;  // the local weight row
      const Tensor* src;
      uint64_t src_row;
      if (w < q_heads * hd) {
        src = &q;
        src_row = tp * q_heads * hd + w;
      } else if (w < (q_heads + kv_heads) * hd) {
        src = &k;
        src_row = first_kv * hd + (w - q_heads * hd);
      } else {
        src = &v;
        src_row = first_kv * hd + (w - (q_heads + kv_heads) * hd);
      }
      src_row /= b;
      for (uint64_t j = 0; j < row; ++j) t.values[i * row + j] = src->values[src_row * row + j];
    }
    return t;
  }

  // RowParallelLinear: input columns [r * K/n, (r + 1) * K/n) of [O, K].
  static Tensor Columns(const std::string& name, const Tensor& c, uint64_t r, uint64_t n) {
    const uint64_t o = c.spec.shape[0], k = c.spec.shape[1], w = k / n;
    Tensor t{{name, c.spec.dtype, {o, w}}, std::vector<int64_t>(o * w)};
    for (uint64_t i = 0; i < o; ++i) {
      for (uint64_t j = 0; j < w; ++j) t.values[i * w + j] = c.values[i * k + r * w + j];
    }
    return t;
  }

  // MergedColumnParallelLinear: [gate rows of rank r; up rows of rank r].
  static Tensor GateUp(const std::string& name, const Tensor& gate, const Tensor& up, uint64_t r,
                       uint64_t n) {
    const uint64_t rows = gate.spec.shape[0] / n, h = gate.spec.shape[1];
    Tensor t{{name, gate.spec.dtype, {2 * rows, h}}, std::vector<int64_t>(2 * rows * h)};
    for (uint64_t i = 0; i < 2 * rows; ++i) {
      const Tensor& src = i < rows ? gate : up;
      const uint64_t src_row = r * rows + i % rows;
      for (uint64_t j = 0; j < h; ++j) t.values[i * h + j] = src.values[src_row * h + j];
    }
    return t;
  }

  // FusedMoE: the GPU's local experts stacked, w13 [E_l, 2 I/etp, H] ([gate; up] of
  // each), w2 [E_l, H, I/etp]. vLLM: experts split over all tp x dp GPUs (flat rank
  // dp * tp + tp), or whole experts spread over them with expert parallelism.
  // SGLang: ep groups of tp/ep GPUs, ep rank tp / (tp/ep), etp rank tp % (tp/ep).
  void Experts(const std::string& p, uint64_t g, std::vector<Tensor>& out) const {
    uint64_t ep_rank = 0, etp = 1, etp_rank = 0;
    if (run_.engine == "vllm") {
      const uint64_t flat = g;  // dp * tp + tp rank
      if (run_.ep > 1) {
        ep_rank = flat;
      } else {
        etp = run_.Gpus();
        etp_rank = flat;
      }
    } else {
      etp = run_.tp / run_.ep;
      ep_rank = (g % run_.tp) / etp;
      etp_rank = (g % run_.tp) % etp;
    }
    for (const std::string& suffix : Parts("")) {
      const uint64_t b = suffix.empty() ? 1 : m_.fp8_block;
      ExpertsOf(p, suffix, ep_rank, etp, etp_rank, (m_.hidden + b - 1) / b,
                (m_.moe_ffn + b - 1) / b, out);
    }
  }

  // The stacked w13 and w2 of the GPU's local experts (suffix "": the weights;
  // "_scale_inv": their scale grids, h and I counted in blocks).
  void ExpertsOf(const std::string& p, const std::string& suffix, uint64_t ep_rank, uint64_t etp,
                 uint64_t etp_rank, uint64_t h, uint64_t moe_ffn, std::vector<Tensor>& out) const {
    const uint64_t local = m_.experts / run_.ep, ffn = moe_ffn / etp;
    Tensor w13{{p + "mlp.experts.w13_weight" + suffix, DType::kI64, {local, 2 * ffn, h}},
               std::vector<int64_t>(local * 2 * ffn * h)};
    Tensor w2{{p + "mlp.experts.w2_weight" + suffix, DType::kI64, {local, h, ffn}},
              std::vector<int64_t>(local * h * ffn)};
    for (uint64_t e = 0; e < local; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(ep_rank * local + e) + ".";
      const Tensor& gate = C(x + "gate_proj.weight" + suffix);
      const Tensor& up = C(x + "up_proj.weight" + suffix);
      const Tensor& down = C(x + "down_proj.weight" + suffix);
      for (uint64_t i = 0; i < 2 * ffn; ++i) {
        const Tensor& src = i < ffn ? gate : up;
        const uint64_t src_row = etp_rank * ffn + i % ffn;
        for (uint64_t j = 0; j < h; ++j) {
          w13.values[(e * 2 * ffn + i) * h + j] = src.values[src_row * h + j];
        }
      }
      for (uint64_t i = 0; i < h; ++i) {
        for (uint64_t j = 0; j < ffn; ++j) {
          w2.values[(e * h + i) * ffn + j] = down.values[i * moe_ffn + etp_rank * ffn + j];
        }
      }
    }
    out.push_back(std::move(w13));
    out.push_back(std::move(w2));
  }

  EngineModel m_;
  EngineRun run_;
  std::map<std::string, const Tensor*> by_name_;
};

}  // namespace deltacast::layout::testing
