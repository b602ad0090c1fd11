// An independent reference of how Megatron-style trainers shard a Llama/MoE
// checkpoint, written from ../shared/LAYOUTS.md with element loops (no runs, no
// layout/ code), plus the layout descriptions such jobs would ship. The iota tests
// shard canonical tensors filled with their own global indices with this
// reference, expand the descriptions with layout/, and check that the runs put every
// index back exactly once.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "layout/placement.h"

namespace deltacast::layout::testing {

struct Job {
  uint64_t hidden = 32, heads = 8, kv_heads = 4, head_dim = 4, ffn = 24, vocab = 50, layers = 4;
  uint64_t experts = 0, expert_ffn = 8;  // experts > 0: MoE MLP instead of a dense one
  bool stacked_down = false;             // canonical experts' down_proj stacked [E, H, I]
  bool tied = false;                     // no lm_head: output_layer is a copy of the embedding
  uint64_t pad = 8;                      // vocab_pad_multiple
  uint64_t tp = 1, pp = 1, dp = 1, ep = 1;
  bool gathered = false;  // a many-to-one tensor the trainer gathers for rank tp=0 pp=0
  bool fsdp2 = false;     // HF names, every tensor chunked on dim 0 over dp (no tp)
  bool flat = false;      // HF names, flattened into one buffer owned in dp ranges
  uint64_t flat_align = 4;
};

struct Rank {
  uint64_t tp = 0, pp = 0, dp = 0, ep = 0;
};

// A tensor with int64 elements (iota values: canonical index << 20 | element).
struct Tensor {
  TensorSpec spec;
  std::vector<int64_t> values;
};

inline constexpr int64_t kPadding = -1;

inline int64_t Iota(uint64_t canonical, uint64_t element) {
  return static_cast<int64_t>((canonical << 40) | element);
}

inline std::vector<Tensor> CanonicalTensors(const Job& j) {
  std::vector<TensorSpec> specs;
  auto add = [&](std::string name, std::vector<uint64_t> shape) {
    specs.push_back({std::move(name), DType::kI64, std::move(shape)});
  };
  const uint64_t h = j.hidden, q = j.heads * j.head_dim, kv = j.kv_heads * j.head_dim;
  add("model.embed_tokens.weight", {j.vocab, h});
  for (uint64_t l = 0; l < j.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "self_attn.q_proj.weight", {q, h});
    add(p + "self_attn.k_proj.weight", {kv, h});
    add(p + "self_attn.v_proj.weight", {kv, h});
    add(p + "self_attn.o_proj.weight", {h, q});
    add(p + "input_layernorm.weight", {h});
    add(p + "post_attention_layernorm.weight", {h});
    if (j.experts == 0) {
      add(p + "mlp.gate_proj.weight", {j.ffn, h});
      add(p + "mlp.up_proj.weight", {j.ffn, h});
      add(p + "mlp.down_proj.weight", {h, j.ffn});
    } else {
      add(p + "mlp.gate.weight", {j.experts, h});
      for (uint64_t e = 0; e < j.experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        add(x + "gate_proj.weight", {j.expert_ffn, h});
        add(x + "up_proj.weight", {j.expert_ffn, h});
        if (!j.stacked_down) add(x + "down_proj.weight", {h, j.expert_ffn});
      }
      if (j.stacked_down) add(p + "mlp.experts.down_proj", {j.experts, h, j.expert_ffn});
    }
  }
  add("model.norm.weight", {h});
  if (!j.tied) add("lm_head.weight", {j.vocab, h});
  if (j.gathered) add("model.rope.scale", {j.head_dim, 3});
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

class Reference {
 public:
  Reference(const Job& job, const std::vector<Tensor>& canonical) : j_(job) {
    for (const Tensor& t : canonical) by_name_[t.spec.name] = &t;
  }

  // The rank's shard, as the trainer holds it.
  std::vector<Tensor> Shard(const Rank& r) const {
    std::vector<Tensor> out;
    if (j_.fsdp2 || j_.flat) return DataParallelShard(r);
    const uint64_t per_stage = j_.layers / j_.pp;
    if (j_.gathered && r.tp == 0 && r.pp == 0) {
      out.push_back(Copy("gathered.rope.scale", "model.rope.scale"));
    }
    if (r.pp == 0)
      out.push_back(Vocab("embedding.word_embeddings.weight", "model.embed_tokens.weight", r));
    for (uint64_t ll = 0; ll < per_stage; ++ll) {
      const uint64_t l = r.pp * per_stage + ll;
      const std::string m = "decoder.layers." + std::to_string(ll) + ".";
      const std::string c = "model.layers." + std::to_string(l) + ".";
      out.push_back(Qkv(m + "self_attention.linear_qkv.weight", c, r));
      out.push_back(
          Copy(m + "self_attention.linear_qkv.layer_norm_weight", c + "input_layernorm.weight"));
      out.push_back(RowSplit(m + "self_attention.linear_proj.weight", c + "self_attn.o_proj.weight",
                             r.tp, j_.tp));
      out.push_back(
          Copy(m + "mlp.linear_fc1.layer_norm_weight", c + "post_attention_layernorm.weight"));
      if (j_.experts == 0) {
        out.push_back(GateUp(m + "mlp.linear_fc1.weight", c + "mlp.", r.tp, j_.tp));
        out.push_back(
            RowSplit(m + "mlp.linear_fc2.weight", c + "mlp.down_proj.weight", r.tp, j_.tp));
        continue;
      }
      out.push_back(Copy(m + "mlp.router.weight", c + "mlp.gate.weight"));
      const uint64_t local = j_.experts / j_.ep;
      for (uint64_t el = 0; el < local; ++el) {
        const uint64_t e = r.ep * local + el;
        const std::string lx = m + "mlp.experts.local_experts." + std::to_string(el) + ".";
        const std::string cx = c + "mlp.experts." + std::to_string(e) + ".";
        out.push_back(GateUp(lx + "linear_fc1.weight", cx, 0, 1));  // etp = 1
        if (!j_.stacked_down)
          out.push_back(RowSplit(lx + "linear_fc2.weight", cx + "down_proj.weight", 0, 1));
      }
      if (j_.stacked_down) {
        // The local experts' fc2 stacked [E/ep, H, I], from the canonical stack.
        const Tensor& down = *by_name_.at(c + "mlp.experts.down_proj");
        const uint64_t slab = j_.hidden * j_.expert_ffn;
        Tensor t{{m + "mlp.experts.stacked_fc2", DType::kI64, {local, j_.hidden, j_.expert_ffn}},
                 {}};
        for (uint64_t el = 0; el < local; ++el) {
          const uint64_t e = r.ep * local + el;
          t.values.insert(t.values.end(), down.values.begin() + e * slab,
                          down.values.begin() + (e + 1) * slab);
        }
        out.push_back(std::move(t));
      }
    }
    if (r.pp == j_.pp - 1) {
      out.push_back(Copy("decoder.final_layernorm.weight", "model.norm.weight"));
      out.push_back(Vocab("output_layer.weight",
                          j_.tied ? "model.embed_tokens.weight" : "lm_head.weight", r));
    }
    return out;
  }

  // The layout file such a rank would ship.
  std::string LayoutToml(const Rank& r) const {
    std::string s = "[layout]\ncanonical = \"canonical.json\"\n\n[model]\n";
    s += "hidden = " + std::to_string(j_.hidden) + "\nheads = " + std::to_string(j_.heads) +
         "\nkv_heads = " + std::to_string(j_.kv_heads) +
         "\nhead_dim = " + std::to_string(j_.head_dim) + "\nlayers = " + std::to_string(j_.layers) +
         "\nvocab_pad_multiple = " + std::to_string(j_.pad) + "\n";
    if (j_.experts) s += "experts = " + std::to_string(j_.experts) + "\n";
    s += "\n[mesh]\ntp = " + std::to_string(j_.tp) + "\npp = " + std::to_string(j_.pp) +
         "\ndp = " + std::to_string(j_.dp) + "\nep = " + std::to_string(j_.ep) + "\n";
    if (j_.fsdp2) s += "fsdp = \"fsdp2\"\n";
    if (j_.flat) s += "fsdp = \"flat\"\n";
    s += "\n[rank]\ntp = " + std::to_string(r.tp) + "\npp = " + std::to_string(r.pp) +
         "\ndp = " + std::to_string(r.dp) + "\nep = " + std::to_string(r.ep) + "\n";
    auto rule = [&](std::string local, std::string kind, std::vector<std::string> canonical,
                    std::string extra = "") {
      s += "\n[[tensor]]\nlocal = \"" + local + "\"\nkind = \"" + kind + "\"\ncanonical = [";
      for (size_t i = 0; i < canonical.size(); ++i) s += (i ? ", \"" : "\"") + canonical[i] + "\"";
      s += "]\n" + extra;
    };
    if (j_.fsdp2 || j_.flat) {
      rule("*", "replicated", {"*"});
      if (j_.flat) {
        s += "\n[[flat]]\nlocal = \"flat_param\"\ndtype = \"I64\"\nalign = " +
             std::to_string(j_.flat_align) + "\nparams = [";
        bool first = true;
        for (const auto& [name, t] : by_name_) {
          s += (first ? "\"" : ", \"") + name + "\"";
          first = false;
        }
        s += "]\n";
      }
      return s;
    }
    const std::string ml = "decoder.layers.{layer}.", cl = "model.layers.{layer}.";
    rule("embedding.word_embeddings.weight", "column", {"model.embed_tokens.weight"},
         "pad = \"vocab\"\n");
    if (j_.tied) {
      rule("output_layer.weight", "tied", {"model.embed_tokens.weight"}, "pad = \"vocab\"\n");
    } else {
      rule("output_layer.weight", "column", {"lm_head.weight"}, "pad = \"vocab\"\n");
    }
    rule("decoder.final_layernorm.weight", "replicated", {"model.norm.weight"});
    if (j_.gathered) rule("gathered.rope.scale", "gathered", {"model.rope.scale"});
    rule(ml + "self_attention.linear_qkv.weight", "qkv",
         {cl + "self_attn.q_proj.weight", cl + "self_attn.k_proj.weight",
          cl + "self_attn.v_proj.weight"});
    rule(ml + "self_attention.linear_qkv.layer_norm_weight", "replicated",
         {cl + "input_layernorm.weight"});
    rule(ml + "self_attention.linear_proj.weight", "row", {cl + "self_attn.o_proj.weight"});
    rule(ml + "mlp.linear_fc1.layer_norm_weight", "replicated",
         {cl + "post_attention_layernorm.weight"});
    rule(ml + "mlp.linear_fc1.weight", "gate_up",
         {cl + "mlp.gate_proj.weight", cl + "mlp.up_proj.weight"});
    rule(ml + "mlp.linear_fc2.weight", "row", {cl + "mlp.down_proj.weight"});
    if (j_.experts == 0) return s;
    rule(ml + "mlp.router.weight", "replicated", {cl + "mlp.gate.weight"});
    const std::string lx = ml + "mlp.experts.local_experts.{expert}.",
                      cx = cl + "mlp.experts.{expert}.";
    rule(lx + "linear_fc1.weight", "gate_up", {cx + "gate_proj.weight", cx + "up_proj.weight"});
    rule(lx + "linear_fc2.weight", "row", {cx + "down_proj.weight"});
    // Stacked on both sides: the local stack's slab e_l is canonical slab ep*E/ep + e_l.
    if (j_.stacked_down) {
      rule(ml + "mlp.experts.stacked_fc2", "row", {cl + "mlp.experts.down_proj"},
           "expert = true\n");
    }
    return s;
  }

 private:
  const Tensor& C(const std::string& name) const { return *by_name_.at(name); }
  static uint64_t RowSize(const TensorSpec& s) {
    uint64_t n = 1;
    for (size_t i = 1; i < s.shape.size(); ++i) n *= s.shape[i];
    return n;
  }

  Tensor Copy(const std::string& local, const std::string& canonical) const {
    Tensor t = C(canonical);
    t.spec.name = local;
    return t;
  }

  Tensor Vocab(const std::string& local, const std::string& canonical, const Rank& r) const {
    const Tensor& c = C(canonical);
    const uint64_t m = j_.pad * j_.tp;
    const uint64_t padded = (j_.vocab + m - 1) / m * m, per = padded / j_.tp;
    Tensor t{{local, DType::kI64, {per, j_.hidden}}, {}};
    for (uint64_t i = 0; i < per; ++i) {
      const uint64_t row = r.tp * per + i;
      for (uint64_t k = 0; k < j_.hidden; ++k) {
        t.values.push_back(row < j_.vocab ? c.values[row * j_.hidden + k] : kPadding);
      }
    }
    return t;
  }

  // Fuse-then-split, row by row from the formula in LAYOUTS.md.
  Tensor Qkv(const std::string& local, const std::string& c, const Rank& r) const {
    const Tensor& q = C(c + "self_attn.q_proj.weight");
    const Tensor& k = C(c + "self_attn.k_proj.weight");
    const Tensor& v = C(c + "self_attn.v_proj.weight");
    const uint64_t hpg = j_.heads / j_.kv_heads, hd = j_.head_dim, h = j_.hidden;
    const uint64_t blk = (hpg + 2) * hd, total = (j_.heads + 2 * j_.kv_heads) * hd,
                   per = total / j_.tp;
    Tensor t{{local, DType::kI64, {per, h}}, {}};
    for (uint64_t i = 0; i < per; ++i) {
      const uint64_t fused = r.tp * per + i;
      const uint64_t g = fused / blk, s = (fused % blk) / hd, d = fused % hd;
      const Tensor* src;
      uint64_t row;
      if (s < hpg) {
        src = &q;
        row = (g * hpg + s) * hd + d;
      } else {
        src = s == hpg ? &k : &v;
        row = g * hd + d;
      }
      t.values.insert(t.values.end(), src->values.begin() + row * h,
                      src->values.begin() + (row + 1) * h);
    }
    return t;
  }

  Tensor RowSplit(const std::string& local, const std::string& canonical, uint64_t r,
                  uint64_t tp) const {
    const Tensor& c = C(canonical);
    const uint64_t rows = c.spec.shape[0], cols = c.spec.shape[1], w = cols / tp;
    Tensor t{{local, DType::kI64, {rows, w}}, {}};
    for (uint64_t o = 0; o < rows; ++o) {
      for (uint64_t x = 0; x < w; ++x) t.values.push_back(c.values[o * cols + r * w + x]);
    }
    return t;
  }

  Tensor GateUp(const std::string& local, const std::string& prefix, uint64_t r,
                uint64_t tp) const {
    const Tensor& gate = C(prefix + "gate_proj.weight");
    const Tensor& up = C(prefix + "up_proj.weight");
    const uint64_t rows = gate.spec.shape[0], h = gate.spec.shape[1], per = rows / tp;
    Tensor t{{local, DType::kI64, {2 * per, h}}, {}};
    for (const Tensor* src : {&gate, &up}) {
      t.values.insert(t.values.end(), src->values.begin() + r * per * h,
                      src->values.begin() + (r + 1) * per * h);
    }
    return t;
  }

  std::vector<Tensor> DataParallelShard(const Rank& r) const {
    std::vector<Tensor> out;
    if (j_.fsdp2) {
      for (const auto& [name, c] : by_name_) {
        // torch.chunk(param, dp, dim=0)[r.dp]
        const uint64_t rows = c->spec.shape[0], row = RowSize(c->spec);
        const uint64_t chunk = (rows + j_.dp - 1) / j_.dp;
        const uint64_t first = std::min(rows, r.dp * chunk), end = std::min(rows, first + chunk);
        Tensor t{c->spec, {}};
        t.spec.shape[0] = end - first;
        t.values.assign(c->values.begin() + first * row, c->values.begin() + end * row);
        out.push_back(std::move(t));
      }
      return out;
    }
    // FSDP1: parameters in name order, each start aligned, padded to dp equal parts.
    std::vector<int64_t> flat;
    for (const auto& [name, c] : by_name_) {
      while (flat.size() % j_.flat_align != 0) flat.push_back(kPadding);
      flat.insert(flat.end(), c->values.begin(), c->values.end());
    }
    const uint64_t per = (flat.size() + j_.dp - 1) / j_.dp;
    flat.resize(per * j_.dp, kPadding);
    Tensor t{{"flat_param", DType::kI64, {per}}, {}};
    t.values.assign(flat.begin() + r.dp * per, flat.begin() + (r.dp + 1) * per);
    out.push_back(std::move(t));
    return out;
  }

  Job j_;
  std::map<std::string, const Tensor*> by_name_;
};

inline std::vector<Rank> AllRanks(const Job& j) {
  std::vector<Rank> out;
  for (uint64_t p = 0; p < j.pp; ++p)
    for (uint64_t t = 0; t < j.tp; ++t)
      for (uint64_t d = 0; d < j.dp; ++d)
        for (uint64_t e = 0; e < j.ep; ++e) out.push_back({t, p, d, e});
  return out;
}

}  // namespace deltacast::layout::testing
