#include "agent/synth_shards.h"

#include <bit>
#include <cstring>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <system_error>
#include <vector>

#include "agent/synth.h"
#include "apply/checkpoint_dir.h"
#include "apply/safetensors.h"
#include "common/file_util.h"

namespace deltacast::agent {
namespace {

namespace fs = std::filesystem;

struct Rank {
  uint64_t tp = 0, pp = 0, dp = 0, ep = 0;
};

// One local tensor: its header entry and how to compute its bytes.
struct LocalDef {
  TensorSpec info;
  std::function<Status(std::byte* out)> fill;
};

class Sharder {
 public:
  Sharder(const apply::CheckpointDirStore& store, const ShardModel& m, const ShardSpec& spec)
      : store_(store), m_(m), s_(spec) {}

  Status Check() const {
    auto bad = [](const std::string& what) {
      return Status::InvalidArgument("synth --shards: " + what);
    };
    if (s_.fsdp > 0) {
      if (s_.tp * s_.pp * s_.dp * s_.ep != 1) return bad("fsdp=W takes no other axis");
      return Status::Ok();
    }
    if (m_.layers < s_.pp) {
      return bad(std::to_string(m_.layers) + " layers cannot fill pp=" + std::to_string(s_.pp) +
                 " stages");
    }
    const uint64_t fused = (m_.heads + 2 * m_.kv_heads) * m_.head_dim;
    if (fused % s_.tp != 0 || m_.hidden % s_.tp != 0 || m_.intermediate % s_.tp != 0 ||
        (m_.heads * m_.head_dim) % s_.tp != 0) {
      return bad("the model's dims (hidden " + std::to_string(m_.hidden) + ", fused qkv " +
                 std::to_string(fused) + ", intermediate " + std::to_string(m_.intermediate) +
                 ") do not split over tp=" + std::to_string(s_.tp));
    }
    if (s_.ep > 1 && (m_.experts == 0 || m_.experts % s_.ep != 0)) {
      return bad("ep=" + std::to_string(s_.ep) +
                 " needs a number of experts it divides (synth "
                 "--experts); the model has " +
                 std::to_string(m_.experts));
    }
    return Status::Ok();
  }

  Result<ByteSpan> Canonical(const std::string& name) const {
    auto index = store_.FindTensor(name);
    if (!index) return Status::NotFound("synth --shards: no canonical tensor '" + name + "'");
    return store_.TensorData(*index);
  }

  std::vector<LocalDef> Defs(const Rank& r) const {
    std::vector<LocalDef> out;
    if (s_.fsdp > 0) {
      for (const auto& t : store_.tensors()) out.push_back(Fsdp2(t, r.dp));
      return out;
    }
    // Uneven stages when the layers do not divide (as Megatron's explicit first /
    // last stage sizes allow); the layout says where each stage starts.
    const uint64_t first = StageStart(r.pp), per_stage = StageStart(r.pp + 1) - first;
    if (r.pp == 0)
      out.push_back(Vocab("embedding.word_embeddings.weight", "model.embed_tokens.weight", r.tp));
    for (uint64_t ll = 0; ll < per_stage; ++ll) {
      const uint64_t l = first + ll;
      const std::string m = "decoder.layers." + std::to_string(ll) + ".";
      const std::string c = "model.layers." + std::to_string(l) + ".";
      out.push_back(Qkv(m + "self_attention.linear_qkv.weight", c, r.tp));
      out.push_back(ZeroCentred(m + "self_attention.linear_qkv.layer_norm_weight",
                                c + "input_layernorm.weight"));
      out.push_back(RowSplit(m + "self_attention.linear_proj.weight", c + "self_attn.o_proj.weight",
                             m_.hidden, m_.heads * m_.head_dim, r.tp, s_.tp));
      if (m_.experts == 0) {
        out.push_back(ZeroCentred(m + "mlp.linear_fc1.layer_norm_weight",
                                  c + "post_attention_layernorm.weight"));
        out.push_back(
            GateUp(m + "mlp.linear_fc1.weight", c + "mlp.", m_.intermediate, r.tp, s_.tp));
        out.push_back(RowSplit(m + "mlp.linear_fc2.weight", c + "mlp.down_proj.weight", m_.hidden,
                               m_.intermediate, r.tp, s_.tp));
        continue;
      }
      out.push_back(
          ZeroCentred(m + "pre_mlp_layernorm.weight", c + "post_attention_layernorm.weight"));
      out.push_back(Plain(m + "mlp.router.weight", c + "mlp.gate.weight", {m_.experts, m_.hidden}));
      // Expert weights whole on every tp rank (expert tensor parallel 1).
      const uint64_t local = m_.experts / s_.ep, ffn = m_.intermediate / m_.experts;
      for (uint64_t el = 0; el < local; ++el) {
        const uint64_t e = r.ep * local + el;
        const std::string lx = m + "mlp.experts.local_experts." + std::to_string(el) + ".";
        const std::string cx = c + "mlp.experts." + std::to_string(e) + ".";
        out.push_back(GateUp(lx + "linear_fc1.weight", cx, ffn, 0, 1));
        out.push_back(
            RowSplit(lx + "linear_fc2.weight", cx + "down_proj.weight", m_.hidden, ffn, 0, 1));
      }
    }
    if (r.pp == s_.pp - 1) {
      out.push_back(ZeroCentred("decoder.final_layernorm.weight", "model.norm.weight"));
      out.push_back(Vocab("output_layer.weight", "lm_head.weight", r.tp));
    }
    return out;
  }

  std::string LayoutToml(const Rank& r) const {
    std::string s = "# Layout of one rank of the synthetic training job (docs/layout.md).\n";
    s += "[layout]\ncanonical = \"canonical.json\"\n\n[model]\n";
    s += "hidden = " + std::to_string(m_.hidden) + "\nheads = " + std::to_string(m_.heads) +
         "\nkv_heads = " + std::to_string(m_.kv_heads) +
         "\nhead_dim = " + std::to_string(m_.head_dim) + "\nlayers = " + std::to_string(m_.layers) +
         "\nvocab_pad_multiple = " + std::to_string(m_.vocab_pad_multiple) + "\n";
    if (m_.experts) s += "experts = " + std::to_string(m_.experts) + "\n";
    if (s_.fsdp > 0) {
      s += "\n[mesh]\ndp = " + std::to_string(s_.fsdp) + "\nfsdp = \"fsdp2\"\n";
    } else {
      s += "\n[mesh]\ntp = " + std::to_string(s_.tp) + "\npp = " + std::to_string(s_.pp) +
           "\ndp = " + std::to_string(s_.dp) + "\nep = " + std::to_string(s_.ep) + "\n";
    }
    s += "\n[rank]\ntp = " + std::to_string(r.tp) + "\npp = " + std::to_string(r.pp) +
         "\ndp = " + std::to_string(r.dp) + "\nep = " + std::to_string(r.ep) + "\n";
    if (s_.fsdp == 0) s += "layer_offset = " + std::to_string(StageStart(r.pp)) + "\n";
    auto rule = [&](const std::string& local, const std::string& kind,
                    std::vector<std::string> canonical, const std::string& extra = "") {
      s += "\n[[tensor]]\nlocal = \"" + local + "\"\nkind = \"" + kind + "\"\ncanonical = [";
      for (size_t i = 0; i < canonical.size(); ++i) s += (i ? ", \"" : "\"") + canonical[i] + "\"";
      s += "]\n" + extra;
    };
    if (s_.fsdp > 0) {
      rule("*", "replicated", {"*"});
      return s;
    }
    const std::string ml = "decoder.layers.{layer}.", cl = "model.layers.{layer}.";
    const std::string zc = "value = \"add_one\"  # zero-centred gamma in F32: residual\n";
    rule("embedding.word_embeddings.weight", "column", {"model.embed_tokens.weight"},
         "pad = \"vocab\"\n");
    rule("output_layer.weight", "column", {"lm_head.weight"}, "pad = \"vocab\"\n");
    rule("decoder.final_layernorm.weight", "replicated", {"model.norm.weight"}, zc);
    rule(ml + "self_attention.linear_qkv.weight", "qkv",
         {cl + "self_attn.q_proj.weight", cl + "self_attn.k_proj.weight",
          cl + "self_attn.v_proj.weight"});
    rule(ml + "self_attention.linear_qkv.layer_norm_weight", "replicated",
         {cl + "input_layernorm.weight"}, zc);
    rule(ml + "self_attention.linear_proj.weight", "row", {cl + "self_attn.o_proj.weight"});
    if (m_.experts == 0) {
      rule(ml + "mlp.linear_fc1.layer_norm_weight", "replicated",
           {cl + "post_attention_layernorm.weight"}, zc);
      rule(ml + "mlp.linear_fc1.weight", "gate_up",
           {cl + "mlp.gate_proj.weight", cl + "mlp.up_proj.weight"});
      rule(ml + "mlp.linear_fc2.weight", "row", {cl + "mlp.down_proj.weight"});
      return s;
    }
    rule(ml + "pre_mlp_layernorm.weight", "replicated", {cl + "post_attention_layernorm.weight"},
         zc);
    rule(ml + "mlp.router.weight", "replicated", {cl + "mlp.gate.weight"});
    const std::string lx = ml + "mlp.experts.local_experts.{expert}.",
                      cx = cl + "mlp.experts.{expert}.";
    rule(lx + "linear_fc1.weight", "gate_up", {cx + "gate_proj.weight", cx + "up_proj.weight"});
    rule(lx + "linear_fc2.weight", "row", {cx + "down_proj.weight"});
    return s;
  }

 private:
  static constexpr uint64_t kE = 2;  // BF16

  uint64_t StageStart(uint64_t stage) const { return stage * m_.layers / s_.pp; }

  LocalDef Plain(const std::string& local, const std::string& canonical,
                 std::vector<uint64_t> shape) const {
    LocalDef d{{local, DType::kBF16, std::move(shape)}, nullptr};
    d.fill = [this, canonical](std::byte* out) -> Status {
      ASSIGN_OR_RETURN(ByteSpan c, Canonical(canonical));
      std::memcpy(out, c.data(), c.size());
      return Status::Ok();
    };
    return d;
  }

  // Megatron's apply_layernorm_1p stores gamma - 1; in F32 that is exact for the
  // gains near 1 a norm has, so bf16(local + 1) gives the canonical bits back.
  LocalDef ZeroCentred(const std::string& local, const std::string& canonical) const {
    LocalDef d{{local, DType::kF32, {m_.hidden}}, nullptr};
    d.fill = [this, canonical](std::byte* out) -> Status {
      ASSIGN_OR_RETURN(ByteSpan c, Canonical(canonical));
      for (uint64_t i = 0; i < m_.hidden; ++i) {
        uint16_t bits;
        std::memcpy(&bits, c.data() + 2 * i, 2);
        const float w = std::bit_cast<float>(uint32_t{bits} << 16);
        const float zc = w - 1.0f;
        if (FloatToBf16(zc + 1.0f) != bits) {
          return Status::InvalidArgument("synth --shards: '" + canonical + "' element " +
                                         std::to_string(i) +
                                         " does not survive storing it zero-centred");
        }
        std::memcpy(out + 4 * i, &zc, 4);
      }
      return Status::Ok();
    };
    return d;
  }

  LocalDef Vocab(const std::string& local, const std::string& canonical, uint64_t r) const {
    const uint64_t mult = m_.vocab_pad_multiple * s_.tp;
    const uint64_t per = (m_.vocab + mult - 1) / mult * mult / s_.tp;
    LocalDef d{{local, DType::kBF16, {per, m_.hidden}}, nullptr};
    d.fill = [this, canonical, r, per](std::byte* out) -> Status {
      ASSIGN_OR_RETURN(ByteSpan c, Canonical(canonical));
      const uint64_t row = m_.hidden * kE;
      for (uint64_t i = 0; i < per; ++i) {
        const uint64_t g = r * per + i;
        if (g < m_.vocab) {
          std::memcpy(out + i * row, c.data() + g * row, row);
        } else {
          std::memset(out + i * row, 0, row);  // padding rows
        }
      }
      return Status::Ok();
    };
    return d;
  }

  LocalDef Qkv(const std::string& local, const std::string& prefix, uint64_t r) const {
    const uint64_t hpg = m_.heads / m_.kv_heads, hd = m_.head_dim;
    const uint64_t blk = (hpg + 2) * hd, per = (m_.heads + 2 * m_.kv_heads) * hd / s_.tp;
    LocalDef d{{local, DType::kBF16, {per, m_.hidden}}, nullptr};
    d.fill = [=, this](std::byte* out) -> Status {
      ASSIGN_OR_RETURN(ByteSpan q, Canonical(prefix + "self_attn.q_proj.weight"));
      ASSIGN_OR_RETURN(ByteSpan k, Canonical(prefix + "self_attn.k_proj.weight"));
      ASSIGN_OR_RETURN(ByteSpan v, Canonical(prefix + "self_attn.v_proj.weight"));
      const uint64_t row = m_.hidden * kE;
      for (uint64_t i = 0; i < per; ++i) {
        const uint64_t j = r * per + i;
        const uint64_t g = j / blk, s = (j % blk) / hd, dd = j % hd;
        const std::byte* src = s < hpg    ? q.data() + ((g * hpg + s) * hd + dd) * row
                               : s == hpg ? k.data() + (g * hd + dd) * row
                                          : v.data() + (g * hd + dd) * row;
        std::memcpy(out + i * row, src, row);
      }
      return Status::Ok();
    };
    return d;
  }

  LocalDef RowSplit(const std::string& local, const std::string& canonical, uint64_t rows,
                    uint64_t cols, uint64_t r, uint64_t tp) const {
    const uint64_t w = cols / tp;
    LocalDef d{{local, DType::kBF16, {rows, w}}, nullptr};
    d.fill = [=, this](std::byte* out) -> Status {
      ASSIGN_OR_RETURN(ByteSpan c, Canonical(canonical));
      for (uint64_t o = 0; o < rows; ++o) {
        std::memcpy(out + o * w * kE, c.data() + (o * cols + r * w) * kE, w * kE);
      }
      return Status::Ok();
    };
    return d;
  }

  LocalDef GateUp(const std::string& local, const std::string& prefix, uint64_t rows, uint64_t r,
                  uint64_t tp) const {
    const uint64_t per = rows / tp;
    LocalDef d{{local, DType::kBF16, {2 * per, m_.hidden}}, nullptr};
    d.fill = [=, this](std::byte* out) -> Status {
      ASSIGN_OR_RETURN(ByteSpan gate, Canonical(prefix + "gate_proj.weight"));
      ASSIGN_OR_RETURN(ByteSpan up, Canonical(prefix + "up_proj.weight"));
      const uint64_t bytes = per * m_.hidden * kE;
      std::memcpy(out, gate.data() + r * bytes, bytes);
      std::memcpy(out + bytes, up.data() + r * bytes, bytes);
      return Status::Ok();
    };
    return d;
  }

  LocalDef Fsdp2(const TensorSpec& t, uint64_t f) const {
    const uint64_t rows = t.shape.empty() ? 1 : t.shape[0];
    const uint64_t row = t.ElementCount() / std::max<uint64_t>(rows, 1) * ElementSize(t.dtype);
    const uint64_t c = (rows + s_.fsdp - 1) / s_.fsdp;
    const uint64_t first = std::min(rows, f * c), end = std::min(rows, first + c);
    LocalDef d{t, nullptr};
    if (!d.info.shape.empty()) d.info.shape[0] = end - first;
    d.fill = [=, this, name = t.name](std::byte* out) -> Status {
      ASSIGN_OR_RETURN(ByteSpan src, Canonical(name));
      std::memcpy(out, src.data() + first * row, (end - first) * row);
      return Status::Ok();
    };
    return d;
  }

  const apply::CheckpointDirStore& store_;
  ShardModel m_;
  ShardSpec s_;
};

Status WriteRank(const fs::path& path, const std::vector<LocalDef>& defs) {
  std::vector<TensorSpec> infos;
  for (const auto& d : defs) infos.push_back(d.info);
  ASSIGN_OR_RETURN(auto writer, apply::SafetensorsWriter::Create(path, infos, {{"format", "pt"}}));
  std::vector<std::byte> buffer;
  for (const auto& d : defs) {
    buffer.resize(d.info.ByteSize());
    RETURN_IF_ERROR(d.fill(buffer.data()));
    RETURN_IF_ERROR(writer->Append(buffer));
  }
  return writer->Finish();
}

std::string CanonicalJson(const std::vector<TensorSpec>& tensors) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& t : tensors) {
    list.push_back(
        {{"name", t.name}, {"dtype", std::string(DTypeName(t.dtype))}, {"shape", t.shape}});
  }
  return nlohmann::json{{"tensors", list}}.dump(1) + "\n";
}

}  // namespace

Result<ShardSpec> ParseShardSpec(std::string_view text) {
  ShardSpec spec;
  spec.requested = true;
  std::map<std::string, uint64_t*> axes = {
      {"tp", &spec.tp}, {"pp", &spec.pp}, {"dp", &spec.dp}, {"ep", &spec.ep}, {"fsdp", &spec.fsdp}};
  std::map<std::string, bool> seen;
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("bad --shards '" + std::string(text) + "': " + why +
                                   " (e.g. tp=2,pp=2 or ep=2,tp=2 or fsdp=4)");
  };
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string_view item = text.substr(at, comma - at);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return bad("'" + std::string(item) + "' is not axis=N");
    const std::string axis(item.substr(0, eq));
    auto it = axes.find(axis);
    if (it == axes.end()) return bad("unknown axis '" + axis + "'");
    if (seen[axis]) return bad("axis '" + axis + "' given twice");
    seen[axis] = true;
    uint64_t value = 0;
    const std::string_view number = item.substr(eq + 1);
    if (number.empty() || number.size() > 6) return bad("'" + std::string(item) + "'");
    for (char c : number) {
      if (c < '0' || c > '9') return bad("'" + std::string(item) + "' is not a number");
      value = value * 10 + static_cast<uint64_t>(c - '0');
    }
    if (value == 0) return bad("axis '" + axis + "' must be at least 1");
    *it->second = value;
    at = comma + 1;
  }
  if (spec.fsdp > 0 && spec.tp * spec.pp * spec.dp * spec.ep != 1) {
    return bad("fsdp=W shards Hugging Face tensors over W ranks and takes no other axis");
  }
  return spec;
}

fs::path ShardDirOf(const fs::path& step_dir) {
  fs::path p = step_dir;
  if (!p.has_filename()) p = p.parent_path();
  return p.parent_path() / (p.filename().string() + ".shards");
}

std::string RankFileStem(uint64_t rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05llu", static_cast<unsigned long long>(rank));
  return buf;
}

Status WriteShards(const fs::path& step_dir, const ShardModel& model, const ShardSpec& spec) {
  ASSIGN_OR_RETURN(auto store, apply::CheckpointDirStore::Open(
                                   step_dir, apply::CheckpointDirStore::Access::kReadOnly));
  Sharder sharder(*store, model, spec);
  RETURN_IF_ERROR(sharder.Check());
  const fs::path out = ShardDirOf(step_dir);
  std::error_code ec;
  fs::remove_all(out, ec);
  fs::create_directories(out, ec);
  if (ec)
    return Status::IoError("synth --shards: cannot create " + out.string() + ": " + ec.message());
  RETURN_IF_ERROR(WriteFile(out / "canonical.json", AsBytes(CanonicalJson(store->tensors()))));
  const uint64_t tp = spec.fsdp ? 1 : spec.tp, pp = spec.fsdp ? 1 : spec.pp;
  const uint64_t dp = spec.fsdp ? spec.fsdp : spec.dp, ep = spec.fsdp ? 1 : spec.ep;
  for (uint64_t p = 0; p < pp; ++p) {
    for (uint64_t d = 0; d < dp; ++d) {
      for (uint64_t e = 0; e < ep; ++e) {
        for (uint64_t t = 0; t < tp; ++t) {
          const Rank r{t, p, d, e};
          const uint64_t rank = t + tp * (e + ep * (d + dp * p));
          const fs::path file = out / (RankFileStem(rank) + ".safetensors");
          if (spec.fsdp == 0 && d > 0) {
            // A data-parallel replica holds the same bytes as its dp=0 peer.
            const uint64_t peer = t + tp * (e + ep * (0 + dp * p));
            fs::create_hard_link(out / (RankFileStem(peer) + ".safetensors"), file, ec);
            if (ec) {
              return Status::IoError("synth --shards: cannot link " + file.string() + ": " +
                                     ec.message());
            }
          } else {
            RETURN_IF_ERROR(WriteRank(file, sharder.Defs(r)));
          }
          RETURN_IF_ERROR(
              WriteFile(out / (RankFileStem(rank) + ".toml"), AsBytes(sharder.LayoutToml(r))));
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace deltacast::agent
