#include "layout/engine.h"

#include <algorithm>
#include <map>

// nlohmann is used without exceptions: parse(..., false) and typed checks.
#include <nlohmann/json.hpp>

#include "common/file_util.h"

namespace deltacast::layout {
namespace {

// vLLM's and SGLang's VocabParallelEmbedding pad the vocabulary to a multiple of
// this (DEFAULT_VOCAB_PADDING_SIZE in vocab_parallel_embedding.py).
constexpr uint64_t kVocabPadding = 64;

class Reader {
 public:
  Reader(const nlohmann::json& doc, std::string_view source) : doc_(doc), source_(source) {}

  Status Error(std::string_view key, const std::string& message) const {
    return Status::InvalidArgument(source_ + ": \"" + std::string(key) + "\" " + message);
  }

  // A positive integer; `fallback` when absent (or null) and fallback != 0.
  Result<uint64_t> Positive(std::string_view key, uint64_t fallback = 0) const {
    auto it = doc_.find(key);
    if (it == doc_.end() || it->is_null()) {
      if (fallback != 0) return fallback;
      return Error(key, "is missing");
    }
    if (!it->is_number_integer() || it->get<int64_t>() <= 0 ||
        it->get<int64_t>() > (int64_t{1} << 40)) {
      return Error(key, "must be a positive integer, not " + it->dump());
    }
    return it->get<uint64_t>();
  }

  // A non-negative integer, 0 when absent.
  Result<uint64_t> Count(std::string_view key) const {
    auto it = doc_.find(key);
    if (it == doc_.end() || it->is_null()) return uint64_t{0};
    if (!it->is_number_integer() || it->get<int64_t>() < 0 ||
        it->get<int64_t>() > (int64_t{1} << 40)) {
      return Error(key, "must be a non-negative integer, not " + it->dump());
    }
    return it->get<uint64_t>();
  }

  Result<bool> Flag(std::string_view key, bool fallback) const {
    auto it = doc_.find(key);
    if (it == doc_.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) return Error(key, "must be true or false, not " + it->dump());
    return it->get<bool>();
  }

  bool Has(std::string_view key) const { return doc_.contains(key); }

 private:
  const nlohmann::json& doc_;
  std::string source_;
};

Status Divides(std::string_view what, uint64_t n, std::string_view by, uint64_t d) {
  if (d != 0 && n % d == 0) return Status::Ok();
  return Status::InvalidArgument(std::string(what) + " = " + std::to_string(n) +
                                 " does not divide by " + std::string(by) + " = " +
                                 std::to_string(d));
}

std::string Quoted(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// One [[tensor]] rule.
void AddRule(std::string& out, std::string_view local, std::string_view kind,
             const std::vector<std::string>& canonical, std::string_view extra = "") {
  out += "\n[[tensor]]\nlocal = " + Quoted(local) + "\nkind = " + Quoted(kind) + "\ncanonical = ";
  if (canonical.size() == 1) {
    out += Quoted(canonical[0]);
  } else {
    out += "[";
    for (size_t i = 0; i < canonical.size(); ++i) out += (i ? ", " : "") + Quoted(canonical[i]);
    out += "]";
  }
  out += "\n";
  if (!extra.empty()) out += std::string(extra) + "\n";
}

// An FP8 weight's scale grid: "x.weight" -> "x.weight_scale_inv", and FusedMoE's
// "w13_weight" -> "w13_weight_scale_inv", as vLLM and SGLang name them.
std::string ScaleOf(const std::string& weight) { return weight + "_scale_inv"; }

// A decoder linear's rule, and with FP8 weights its scale grid's, split as the
// weight is (the engines' BlockQuantScaleParameter loads the grid's rows and
// columns as the weight's, divided by the block).
void AddLinear(std::string& out, const HfConfig& c, const std::string& local, std::string_view kind,
               const std::vector<std::string>& canonical) {
  AddRule(out, local, kind, canonical);
  if (c.fp8_block == 0) return;
  std::vector<std::string> scales;
  for (const auto& name : canonical) scales.push_back(ScaleOf(name));
  AddRule(out, ScaleOf(local), kind, scales, "block = " + std::to_string(c.fp8_block));
}

// The rules every GPU shares: the engines' parameter names (vLLM and SGLang name
// these modules alike) and the canonical Hugging Face names they hold.
std::string Rules(const HfConfig& c) {
  std::string r;
  const std::string l = "model.layers.{layer}.";
  AddRule(r, "model.embed_tokens.weight", "column", {"model.embed_tokens.weight"},
          "pad = \"vocab_then_split\"");
  if (!c.tied) {
    AddRule(r, "lm_head.weight", "column", {"lm_head.weight"}, "pad = \"vocab_then_split\"");
  }
  AddRule(r, "model.norm.weight", "replicated", {"model.norm.weight"});
  AddLinear(r, c, l + "self_attn.qkv_proj.weight", "qkv_heads",
            {l + "self_attn.q_proj.weight", l + "self_attn.k_proj.weight",
             l + "self_attn.v_proj.weight"});
  if (c.qkv_bias) {
    AddRule(
        r, l + "self_attn.qkv_proj.bias", "qkv_heads",
        {l + "self_attn.q_proj.bias", l + "self_attn.k_proj.bias", l + "self_attn.v_proj.bias"});
  }
  AddLinear(r, c, l + "self_attn.o_proj.weight", "row", {l + "self_attn.o_proj.weight"});
  if (c.qk_norm) {
    AddRule(r, l + "self_attn.q_norm.weight", "replicated", {l + "self_attn.q_norm.weight"});
    AddRule(r, l + "self_attn.k_norm.weight", "replicated", {l + "self_attn.k_norm.weight"});
  }
  AddRule(r, l + "input_layernorm.weight", "replicated", {l + "input_layernorm.weight"});
  AddRule(r, l + "post_attention_layernorm.weight", "replicated",
          {l + "post_attention_layernorm.weight"});
  if (c.intermediate != 0) {
    AddLinear(r, c, l + "mlp.gate_up_proj.weight", "gate_up",
              {l + "mlp.gate_proj.weight", l + "mlp.up_proj.weight"});
    AddLinear(r, c, l + "mlp.down_proj.weight", "row", {l + "mlp.down_proj.weight"});
  }
  if (c.experts != 0) {
    AddRule(r, l + "mlp.gate.weight", "replicated", {l + "mlp.gate.weight"});
    AddLinear(
        r, c, l + "mlp.experts.w13_weight", "gate_up",
        {l + "mlp.experts.{expert}.gate_proj.weight", l + "mlp.experts.{expert}.up_proj.weight"});
    AddLinear(r, c, l + "mlp.experts.w2_weight", "row",
              {l + "mlp.experts.{expert}.down_proj.weight"});
    if (c.shared_expert_intermediate != 0) {
      AddLinear(r, c, l + "mlp.shared_expert.gate_up_proj.weight", "gate_up",
                {l + "mlp.shared_expert.gate_proj.weight", l + "mlp.shared_expert.up_proj.weight"});
      AddLinear(r, c, l + "mlp.shared_expert.down_proj.weight", "row",
                {l + "mlp.shared_expert.down_proj.weight"});
      AddRule(r, l + "mlp.shared_expert_gate.weight", "replicated",
              {l + "mlp.shared_expert_gate.weight"});
    }
  }
  return r;
}

// With FP8 weights, the shares the engines check before loading must be whole
// blocks (vLLM's and SGLang's validate_fp8_block_shape): each part of a fused
// linear always (q, k, v; gate, up), and with tp > 1 each GPU's rows of a column
// split and columns of a row split. A dimension that is not split (hidden_size, or
// anything at tp 1) may end in a partial block: its grid is rounded up.
Status CheckFp8Blocks(const HfConfig& c, const EngineParallel& p, uint64_t etp) {
  const uint64_t b = c.fp8_block;
  if (b == 0) return Status::Ok();
  const uint64_t kv_here = c.kv_heads >= p.tp ? c.kv_heads / p.tp : 1;
  std::vector<std::pair<std::string, uint64_t>> shares = {
      {"each GPU's q rows (num_attention_heads / tp x head_dim)", c.heads / p.tp * c.head_dim},
      {"each GPU's k and v rows (its KV heads x head_dim)", kv_here * c.head_dim}};
  if (c.intermediate != 0) {
    shares.push_back(
        {"each GPU's gate and up rows (intermediate_size / tp)", c.intermediate / p.tp});
  }
  if (c.experts != 0 && etp > 1) {
    shares.push_back(
        {"each GPU's expert rows (moe_intermediate_size / the experts' tensor "
         "parallel)",
         c.moe_intermediate / etp});
  }
  if (c.shared_expert_intermediate != 0) {
    shares.push_back({"each GPU's shared-expert rows (shared_expert_intermediate_size / tp)",
                      c.shared_expert_intermediate / p.tp});
  }
  for (const auto& [what, n] : shares) {
    if (n % b != 0) {
      return Status::InvalidArgument(
          "FP8 weight_block_size [" + std::to_string(b) + ", " + std::to_string(b) + "]: " + what +
          " = " + std::to_string(n) +
          " is not a multiple of the block; the engines refuse a split that cuts a scale block");
    }
  }
  return Status::Ok();
}

}  // namespace

std::optional<Engine> ParseEngine(std::string_view name) {
  if (name == "vllm") return Engine::kVllm;
  if (name == "sglang") return Engine::kSglang;
  return std::nullopt;
}

std::string_view EngineName(Engine engine) { return engine == Engine::kVllm ? "vllm" : "sglang"; }

Result<HfConfig> ParseHfConfig(std::string_view json, std::string_view source) {
  const nlohmann::json doc = nlohmann::json::parse(json.begin(), json.end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return Status::InvalidArgument(std::string(source) + ": not a JSON object");
  }
  Reader in(doc, source);
  HfConfig c;
  if (auto it = doc.find("model_type"); it != doc.end() && it->is_string()) {
    c.model_type = it->get<std::string>();
  }
  for (std::string_view key : {"num_local_experts", "n_routed_experts", "kv_lora_rank"}) {
    if (in.Has(key)) {
      return in.Error(key,
                      "names a model family (Mixtral / DeepSeek) whose engine layout is not "
                      "generated; write its layout files by hand (docs/layout.md)");
    }
  }
  ASSIGN_OR_RETURN(c.hidden, in.Positive("hidden_size"));
  ASSIGN_OR_RETURN(c.heads, in.Positive("num_attention_heads"));
  ASSIGN_OR_RETURN(c.kv_heads, in.Positive("num_key_value_heads", c.heads));
  if (c.hidden % c.heads != 0 && !in.Has("head_dim")) {
    return in.Error("head_dim", "is missing and hidden_size does not divide by the heads");
  }
  ASSIGN_OR_RETURN(c.head_dim, in.Positive("head_dim", c.hidden / c.heads));
  ASSIGN_OR_RETURN(c.layers, in.Positive("num_hidden_layers"));
  ASSIGN_OR_RETURN(c.vocab, in.Positive("vocab_size"));
  ASSIGN_OR_RETURN(c.experts, in.Count("num_experts"));
  ASSIGN_OR_RETURN(c.intermediate, in.Count("intermediate_size"));
  if (c.experts == 0 && c.intermediate == 0) return in.Error("intermediate_size", "is missing");
  if (c.experts != 0) {
    ASSIGN_OR_RETURN(c.moe_intermediate, in.Positive("moe_intermediate_size"));
    ASSIGN_OR_RETURN(c.shared_expert_intermediate, in.Count("shared_expert_intermediate_size"));
  }
  if (c.heads % c.kv_heads != 0) {
    return in.Error("num_key_value_heads",
                    "= " + std::to_string(c.kv_heads) +
                        " does not divide num_attention_heads = " + std::to_string(c.heads));
  }
  ASSIGN_OR_RETURN(c.tied, in.Flag("tie_word_embeddings", false));
  // Qwen2's attention always has QKV biases (its config has no key for it).
  const bool qwen2 = c.model_type == "qwen2" || c.model_type == "qwen2_moe";
  ASSIGN_OR_RETURN(c.qkv_bias, in.Flag("attention_bias", qwen2));
  c.qk_norm = c.model_type == "qwen3" || c.model_type == "qwen3_moe";
  return c;
}

Result<std::vector<std::string>> EngineLayouts(const HfConfig& c, const EngineParallel& p,
                                               std::string_view canonical) {
  const std::string engine(EngineName(p.engine));
  if (p.tp == 0 || p.dp == 0 || p.ep == 0 || p.Gpus() > 4096) {
    return Status::InvalidArgument(engine +
                                   ": tp, dp and ep must be positive (and tp x dp at "
                                   "most 4096)");
  }
  // The experts' grid: ep ranks of etp GPUs each, over the tp x dp GPUs.
  uint64_t etp = p.Gpus();
  if (p.engine == Engine::kVllm) {
    // vLLM's FusedMoEParallelConfig: experts split over all tp x dp GPUs, or with
    // expert parallelism whole experts spread over all of them.
    if (p.ep != 1 && p.ep != p.Gpus()) {
      return Status::InvalidArgument(
          "vllm: ep = " + std::to_string(p.ep) +
          ": vLLM's expert parallelism spans all tp x dp = " + std::to_string(p.Gpus()) +
          " GPUs (--enable-expert-parallel), so ep is 1 or " + std::to_string(p.Gpus()));
    }
    etp = p.Gpus() / p.ep;
  } else {
    if (p.dp != 1) {
      return Status::InvalidArgument("sglang: dp = " + std::to_string(p.dp) +
                                     ": data-parallel attention is not generated (use dp = 1)");
    }
    RETURN_IF_ERROR(Divides("sglang: tp", p.tp, "ep", p.ep));
    etp = p.tp / p.ep;
  }
  if (c.experts == 0 && p.ep != 1) {
    return Status::InvalidArgument(engine + ": ep = " + std::to_string(p.ep) +
                                   " but the model has no experts (num_experts)");
  }
  RETURN_IF_ERROR(Divides("num_attention_heads", c.heads, "tp", p.tp));
  if (c.kv_heads < p.tp && p.tp % c.kv_heads != 0) {
    return Status::InvalidArgument(
        "num_key_value_heads = " + std::to_string(c.kv_heads) + " < tp = " + std::to_string(p.tp) +
        ": each KV head would be replicated on tp / num_key_value_heads = " + std::to_string(p.tp) +
        " / " + std::to_string(c.kv_heads) + " GPUs, which is not whole");
  }
  if (c.kv_heads >= p.tp) RETURN_IF_ERROR(Divides("num_key_value_heads", c.kv_heads, "tp", p.tp));
  if (c.intermediate != 0)
    RETURN_IF_ERROR(Divides("intermediate_size", c.intermediate, "tp", p.tp));
  if (c.experts != 0) {
    RETURN_IF_ERROR(Divides("num_experts", c.experts, "ep", p.ep));
    RETURN_IF_ERROR(
        Divides("moe_intermediate_size", c.moe_intermediate, "the experts' tensor parallel", etp));
    if (c.shared_expert_intermediate != 0) {
      RETURN_IF_ERROR(
          Divides("shared_expert_intermediate_size", c.shared_expert_intermediate, "tp", p.tp));
    }
  }
  const uint64_t padded = (c.vocab + kVocabPadding - 1) / kVocabPadding * kVocabPadding;
  RETURN_IF_ERROR(Divides("vocab_size padded to a multiple of 64", padded, "tp", p.tp));
  RETURN_IF_ERROR(CheckFp8Blocks(c, p, etp));

  std::string head = "[layout]\ncanonical = " + Quoted(canonical) + "\n\n[model]\n";
  head += "hidden = " + std::to_string(c.hidden) + "\nheads = " + std::to_string(c.heads) +
          "\nkv_heads = " + std::to_string(c.kv_heads) +
          "\nhead_dim = " + std::to_string(c.head_dim) + "\nlayers = " + std::to_string(c.layers) +
          "\n";
  if (c.experts != 0) head += "experts = " + std::to_string(c.experts) + "\n";
  head += "vocab_pad_multiple = " + std::to_string(kVocabPadding) + "\n\n[mesh]\n";
  head += "tp = " + std::to_string(p.tp) + "\ndp = " + std::to_string(p.dp) + "\n";
  if (c.experts != 0) {
    head += "ep = " + std::to_string(p.ep) + "\netp = " + std::to_string(etp) +
            "\nep_from = \"tp_dp\"\n";
  }
  const std::string rules = Rules(c);
  std::vector<std::string> out;
  for (uint64_t g = 0; g < p.Gpus(); ++g) {
    const uint64_t dp = g / p.tp, tp = g % p.tp, ep = c.experts != 0 ? g / etp : 0;
    std::string text = "# " + engine + " GPU " + std::to_string(g) + " of " +
                       std::to_string(p.Gpus()) + " (tp " + std::to_string(p.tp) + ", dp " +
                       std::to_string(p.dp) + ", ep " + std::to_string(p.ep) +
                       "), written by `deltacast layout engine`\n";
    text += head + "\n[rank]\ntp = " + std::to_string(tp) + "\npp = 0\ndp = " + std::to_string(dp) +
            "\nep = " + std::to_string(ep) + "\n" + rules;
    out.push_back(std::move(text));
  }
  return out;
}

Result<std::vector<std::filesystem::path>> WriteEngineLayouts(
    const HfConfig& config, const EngineParallel& p, const std::filesystem::path& canonical,
    const std::filesystem::path& out_dir) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return Status::IoError("cannot create " + out_dir.string() + ": " + ec.message());
  const std::filesystem::path base = std::filesystem::weakly_canonical(out_dir, ec);
  std::filesystem::path relative =
      std::filesystem::weakly_canonical(canonical, ec).lexically_relative(base);
  if (ec || relative.empty()) relative = std::filesystem::absolute(canonical);
  ASSIGN_OR_RETURN(std::vector<std::string> texts,
                   EngineLayouts(config, p, relative.generic_string()));
  std::vector<std::filesystem::path> paths;
  for (size_t g = 0; g < texts.size(); ++g) {
    const std::filesystem::path path = out_dir / ("gpu-" + std::to_string(g) + ".toml");
    RETURN_IF_ERROR(WriteFile(path, AsBytes(texts[g])));
    paths.push_back(path);
  }
  return paths;
}

}  // namespace deltacast::layout
