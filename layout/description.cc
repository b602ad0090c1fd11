#include "layout/description.h"

#include <algorithm>
#include <span>
#include <string>

#include "common/file_util.h"
#include "common/toml_text.h"

namespace deltacast::layout {
namespace {

constexpr uint64_t kMaxLayoutBytes = uint64_t{16} << 20;
constexpr int64_t kMaxAxis = 1 << 20;
constexpr int64_t kMaxDim = int64_t{1} << 40;

constexpr std::string_view kTopKeys[] = {"layout", "model", "mesh", "rank", "tensor", "flat"};
constexpr std::string_view kLayoutKeys[] = {"canonical"};
constexpr std::string_view kModelKeys[] = {"hidden", "heads",   "kv_heads",          "head_dim",
                                           "layers", "experts", "vocab_pad_multiple"};
constexpr std::string_view kMeshKeys[] = {"tp", "pp", "dp", "ep", "etp", "fsdp", "ep_from"};
constexpr std::string_view kRankKeys[] = {"tp", "pp", "dp", "ep", "layer_offset"};
constexpr std::string_view kTensorKeys[] = {"local", "kind",  "canonical", "value",
                                            "pad",   "split", "expert",    "block"};
constexpr std::string_view kFlatKeys[] = {"local", "dtype", "params", "align"};

using toml_text::LineOf;
std::string Quoted(std::string_view s) { return "\"" + std::string(s) + "\""; }

class Parser {
 public:
  explicit Parser(std::string_view source) : reader_(source) {}

  Status Error(int line, std::string_view message) const { return reader_.Error(line, message); }

  Result<LayoutDescription> Parse(const toml::table& root) {
    LayoutDescription d;
    d.source = reader_.source();
    RETURN_IF_ERROR(CheckKeys(root, "the top level", kTopKeys));
    ASSIGN_OR_RETURN(const toml::table* layout, Table(root, "layout", true));
    RETURN_IF_ERROR(CheckKeys(*layout, "[layout]", kLayoutKeys));
    ASSIGN_OR_RETURN(const toml::node* canonical, Get(*layout, "canonical", "[layout]", true));
    ASSIGN_OR_RETURN(std::string path, String(*canonical, "[layout] canonical"));
    if (path.empty()) return Error(LineOf(*canonical), "[layout] canonical must not be empty");
    d.canonical = path;

    ASSIGN_OR_RETURN(const toml::table* model, Table(root, "model", true));
    RETURN_IF_ERROR(ParseModel(*model, d.model));
    ASSIGN_OR_RETURN(const toml::table* mesh, Table(root, "mesh", true));
    RETURN_IF_ERROR(ParseMesh(*mesh, d.mesh));
    ASSIGN_OR_RETURN(const toml::table* rank, Table(root, "rank", true));
    RETURN_IF_ERROR(ParseRank(*rank, d.mesh, d.model, d.rank));

    if (const toml::node* tensors = root.get("tensor")) {
      ASSIGN_OR_RETURN(auto tables, TableArray(*tensors, "tensor"));
      for (const toml::table* t : tables) {
        ASSIGN_OR_RETURN(Rule rule, ParseRule(*t, d));
        d.rules.push_back(std::move(rule));
      }
    }
    if (const toml::node* flats = root.get("flat")) {
      ASSIGN_OR_RETURN(auto tables, TableArray(*flats, "flat"));
      if (d.mesh.fsdp != Fsdp::kFlat) {
        return Error(LineOf(*tables.front()),
                     "[[flat]] buffers need [mesh] fsdp = \"flat\" (the dp ranks own ranges "
                     "of them)");
      }
      for (const toml::table* t : tables) {
        ASSIGN_OR_RETURN(FlatBuffer flat, ParseFlat(*t));
        d.flats.push_back(std::move(flat));
      }
    }
    if (d.rules.empty()) return Error(0, "no [[tensor]] rules: nothing maps to canonical tensors");
    return d;
  }

 private:
  Status CheckKeys(const toml::table& table, std::string_view where,
                   std::span<const std::string_view> known) const {
    return reader_.CheckKeys(table, where, known);
  }

  Result<const toml::table*> Table(const toml::table& root, std::string_view key,
                                   bool required) const {
    const toml::node* node = root.get(key);
    if (node == nullptr) {
      if (required) return Error(0, "missing required table [" + std::string(key) + "]");
      return static_cast<const toml::table*>(nullptr);
    }
    if (!node->is_table()) {
      return Error(LineOf(*node), Quoted(key) + " must be a table [" + std::string(key) + "]");
    }
    return node->as_table();
  }

  Result<std::vector<const toml::table*>> TableArray(const toml::node& node,
                                                     std::string_view key) const {
    const toml::array* array = node.as_array();
    if (array == nullptr) {
      return Error(LineOf(node),
                   Quoted(key) + " must be an array of tables: write [[" + std::string(key) + "]]");
    }
    std::vector<const toml::table*> out;
    for (const toml::node& e : *array) {
      if (!e.is_table()) return Error(LineOf(e), "each [[" + std::string(key) + "]] is a table");
      out.push_back(e.as_table());
    }
    return out;
  }

  Result<const toml::node*> Get(const toml::table& t, std::string_view key, std::string_view where,
                                bool required) const {
    const toml::node* node = t.get(key);
    if (node == nullptr && required) {
      return Error(LineOf(t), std::string(where) + " is missing required key " + Quoted(key));
    }
    return node;
  }

  Result<std::string> String(const toml::node& node, std::string_view what) const {
    if (!node.is_string()) return Error(LineOf(node), std::string(what) + " must be a string");
    return node.as_string()->get();
  }

  Result<uint64_t> Integer(const toml::node& node, std::string_view what, int64_t min,
                           int64_t max) const {
    if (!node.is_integer()) return Error(LineOf(node), std::string(what) + " must be an integer");
    const int64_t v = node.as_integer()->get();
    if (v < min || v > max) {
      return Error(LineOf(node), std::string(what) + " = " + std::to_string(v) +
                                     " is out of range [" + std::to_string(min) + ", " +
                                     std::to_string(max) + "]");
    }
    return static_cast<uint64_t>(v);
  }

  // An optional integer key: `out` keeps its default when absent.
  Status OptionalInteger(const toml::table& t, std::string_view key, std::string_view where,
                         int64_t min, int64_t max, uint64_t& out) const {
    if (const toml::node* n = t.get(key)) {
      ASSIGN_OR_RETURN(out, Integer(*n, std::string(where) + " " + std::string(key), min, max));
    }
    return Status::Ok();
  }

  Status ParseModel(const toml::table& t, ModelDims& m) const {
    RETURN_IF_ERROR(CheckKeys(t, "[model]", kModelKeys));
    for (auto [key, out] : {std::pair{"hidden", &m.hidden}, std::pair{"heads", &m.heads},
                            std::pair{"kv_heads", &m.kv_heads}, std::pair{"head_dim", &m.head_dim},
                            std::pair{"layers", &m.layers}}) {
      ASSIGN_OR_RETURN(const toml::node* n, Get(t, key, "[model]", true));
      ASSIGN_OR_RETURN(*out, Integer(*n, std::string("[model] ") + key, 1, kMaxDim));
    }
    RETURN_IF_ERROR(OptionalInteger(t, "experts", "[model]", 0, kMaxAxis, m.experts));
    RETURN_IF_ERROR(
        OptionalInteger(t, "vocab_pad_multiple", "[model]", 1, kMaxAxis, m.vocab_pad_multiple));
    if (m.heads % m.kv_heads != 0) {
      return Error(LineOf(t), "[model] heads = " + std::to_string(m.heads) +
                                  " is not a multiple of kv_heads = " + std::to_string(m.kv_heads));
    }
    return Status::Ok();
  }

  Status ParseMesh(const toml::table& t, Mesh& mesh) const {
    RETURN_IF_ERROR(CheckKeys(t, "[mesh]", kMeshKeys));
    for (auto [key, out] :
         {std::pair{"tp", &mesh.tp}, std::pair{"pp", &mesh.pp}, std::pair{"dp", &mesh.dp},
          std::pair{"ep", &mesh.ep}, std::pair{"etp", &mesh.etp}}) {
      RETURN_IF_ERROR(OptionalInteger(t, key, "[mesh]", 1, kMaxAxis, *out));
    }
    if (const toml::node* f = t.get("ep_from")) {
      ASSIGN_OR_RETURN(std::string from, String(*f, "[mesh] ep_from"));
      if (from == "dp") {
        mesh.ep_from = EpFrom::kDp;
      } else if (from == "tp_dp") {
        mesh.ep_from = EpFrom::kTpDp;
      } else {
        return Error(LineOf(*f), "[mesh] ep_from = " + Quoted(from) +
                                     ": must be \"dp\" (an axis of its own) or \"tp_dp\" (the "
                                     "tp x dp GPUs form the experts' ep x etp grid)");
      }
    }
    if (mesh.ep_from == EpFrom::kTpDp) {
      if (mesh.ep * mesh.etp != mesh.tp * mesh.dp) {
        return Error(LineOf(t), "[mesh] ep_from = \"tp_dp\" needs ep x etp = tp x dp; ep " +
                                    std::to_string(mesh.ep) + " x etp " + std::to_string(mesh.etp) +
                                    " != tp " + std::to_string(mesh.tp) + " x dp " +
                                    std::to_string(mesh.dp));
      }
    } else if (mesh.etp != 1 && mesh.etp != mesh.tp) {
      return Error(LineOf(*t.get("etp")), "[mesh] etp = " + std::to_string(mesh.etp) +
                                              " must be 1 or equal to tp (" +
                                              std::to_string(mesh.tp) + ")");
    }
    if (const toml::node* f = t.get("fsdp")) {
      ASSIGN_OR_RETURN(std::string kind, String(*f, "[mesh] fsdp"));
      if (kind == "none") {
        mesh.fsdp = Fsdp::kNone;
      } else if (kind == "fsdp2") {
        mesh.fsdp = Fsdp::kFsdp2;
      } else if (kind == "flat") {
        mesh.fsdp = Fsdp::kFlat;
      } else {
        return Error(LineOf(*f),
                     "[mesh] fsdp = " + Quoted(kind) + ": must be \"none\", \"fsdp2\" or \"flat\"");
      }
    }
    return Status::Ok();
  }

  Status ParseRank(const toml::table& t, const Mesh& mesh, const ModelDims& model,
                   RankCoords& rank) const {
    RETURN_IF_ERROR(CheckKeys(t, "[rank]", kRankKeys));
    for (auto [key, out, size] :
         {std::tuple{"tp", &rank.tp, mesh.tp}, std::tuple{"pp", &rank.pp, mesh.pp},
          std::tuple{"dp", &rank.dp, mesh.dp}, std::tuple{"ep", &rank.ep, mesh.ep}}) {
      ASSIGN_OR_RETURN(const toml::node* n, Get(t, key, "[rank]", true));
      ASSIGN_OR_RETURN(
          *out, Integer(*n, std::string("[rank] ") + key, 0, static_cast<int64_t>(size) - 1));
    }
    if (mesh.ep_from == EpFrom::kTpDp) {
      const uint64_t flat = rank.dp * mesh.tp + rank.tp;
      if (rank.ep != flat / mesh.etp) {
        return Error(LineOf(*t.get("ep")),
                     "[rank] ep = " + std::to_string(rank.ep) + ", but with ep_from = \"tp_dp\" " +
                         "the GPU at tp " + std::to_string(rank.tp) + ", dp " +
                         std::to_string(rank.dp) + " is EP rank " +
                         std::to_string(flat / mesh.etp) + " (flat rank " + std::to_string(flat) +
                         " / etp " + std::to_string(mesh.etp) + ")");
      }
    }
    if (const toml::node* n = t.get("layer_offset")) {
      ASSIGN_OR_RETURN(uint64_t offset, Integer(*n, "[rank] layer_offset", 0,
                                                static_cast<int64_t>(model.layers) - 1));
      rank.layer_offset = static_cast<int64_t>(offset);
    } else if (model.layers % mesh.pp != 0) {
      return Error(LineOf(t), "[model] layers = " + std::to_string(model.layers) +
                                  " does not divide by pp = " + std::to_string(mesh.pp) +
                                  ": give [rank] layer_offset");
    }
    return Status::Ok();
  }

  Result<std::vector<std::string>> Patterns(const toml::node& node, std::string_view what) const {
    std::vector<std::string> out;
    if (node.is_string()) {
      out.push_back(node.as_string()->get());
    } else if (const toml::array* a = node.as_array()) {
      for (const toml::node& e : *a) {
        ASSIGN_OR_RETURN(std::string s, String(e, what));
        out.push_back(std::move(s));
      }
    } else {
      return Error(LineOf(node), std::string(what) + " must be a string or an array of strings");
    }
    for (const auto& s : out) {
      if (s.empty()) return Error(LineOf(node), std::string(what) + " has an empty name");
      if (std::count(s.begin(), s.end(), '*') > 1) {
        return Error(LineOf(node), std::string(what) + " " + Quoted(s) + " has more than one '*'");
      }
    }
    return out;
  }

  Result<Rule> ParseRule(const toml::table& t, const LayoutDescription& d) const {
    Rule rule;
    rule.line = LineOf(t);
    RETURN_IF_ERROR(CheckKeys(t, "[[tensor]]", kTensorKeys));
    ASSIGN_OR_RETURN(const toml::node* local, Get(t, "local", "[[tensor]]", true));
    ASSIGN_OR_RETURN(auto locals, Patterns(*local, "[[tensor]] local"));
    if (locals.size() != 1) return Error(LineOf(*local), "[[tensor]] local must be one pattern");
    rule.local = locals.front();
    ASSIGN_OR_RETURN(const toml::node* kind, Get(t, "kind", "[[tensor]]", true));
    ASSIGN_OR_RETURN(std::string k, String(*kind, "[[tensor]] kind"));
    static constexpr std::pair<std::string_view, Kind> kKinds[] = {
        {"column", Kind::kColumn},         {"row", Kind::kRow},
        {"replicated", Kind::kReplicated}, {"qkv", Kind::kQkv},
        {"gate_up", Kind::kGateUp},        {"tied", Kind::kTied},
        {"gathered", Kind::kGathered},     {"qkv_heads", Kind::kQkvHeads}};
    auto found = std::find_if(std::begin(kKinds), std::end(kKinds),
                              [&](const auto& e) { return e.first == k; });
    if (found == std::end(kKinds)) {
      return Error(LineOf(*kind), "[[tensor]] kind = " + Quoted(k) +
                                      ": must be one of column, row, replicated, qkv, qkv_heads, "
                                      "gate_up, tied, gathered");
    }
    rule.kind = found->second;
    ASSIGN_OR_RETURN(const toml::node* canonical, Get(t, "canonical", "[[tensor]]", true));
    ASSIGN_OR_RETURN(rule.canonical, Patterns(*canonical, "[[tensor]] canonical"));
    const size_t parts = rule.kind == Kind::kQkv || rule.kind == Kind::kQkvHeads ? 3
                         : rule.kind == Kind::kGateUp                            ? 2
                                                                                 : 1;
    if (rule.canonical.size() != parts) {
      return Error(LineOf(*canonical), "[[tensor]] kind " + Quoted(k) + " needs " +
                                           std::to_string(parts) + " canonical name" +
                                           (parts > 1 ? "s" : "") + ", got " +
                                           std::to_string(rule.canonical.size()));
    }
    const bool local_star = rule.local.find('*') != std::string::npos;
    for (const auto& c : rule.canonical) {
      if ((c.find('*') != std::string::npos) != local_star) {
        return Error(LineOf(*canonical),
                     "[[tensor]] '*' must appear in both local and canonical names or in neither");
      }
      if (c.find("{layer}") != std::string::npos &&
          rule.local.find("{layer}") == std::string::npos) {
        return Error(LineOf(*canonical), "[[tensor]] canonical names {layer} but local " +
                                             Quoted(rule.local) + " does not");
      }
    }
    if (const toml::node* v = t.get("value")) {
      ASSIGN_OR_RETURN(std::string value, String(*v, "[[tensor]] value"));
      if (value == "bits") {
        rule.value = Value::kBits;
      } else if (value == "cast") {
        rule.value = Value::kCast;
      } else if (value == "add_one") {
        rule.value = Value::kAddOne;
      } else {
        return Error(LineOf(*v), "[[tensor]] value = " + Quoted(value) +
                                     ": must be \"bits\", \"cast\" or \"add_one\"");
      }
    }
    if (const toml::node* p = t.get("pad")) {
      ASSIGN_OR_RETURN(std::string pad, String(*p, "[[tensor]] pad"));
      if (pad == "vocab") {
        rule.pad = VocabPad::kMegatron;
      } else if (pad == "vocab_then_split") {
        rule.pad = VocabPad::kEngine;
      } else if (pad != "none") {
        return Error(LineOf(*p), "[[tensor]] pad = " + Quoted(pad) +
                                     ": must be \"vocab\" (rows padded to a multiple of "
                                     "vocab_pad_multiple * tp, clipped), \"vocab_then_split\" "
                                     "(padded to a multiple of vocab_pad_multiple, then split "
                                     "evenly) or \"none\"");
      }
      if (rule.pad != VocabPad::kNone && rule.kind != Kind::kColumn && rule.kind != Kind::kTied) {
        return Error(LineOf(*p), "[[tensor]] pad = " + Quoted(pad) + " needs kind \"column\"");
      }
    }
    if (const toml::node* s = t.get("split")) {
      ASSIGN_OR_RETURN(std::string split, String(*s, "[[tensor]] split"));
      if (split != "even" && split != "ceil") {
        return Error(LineOf(*s), "[[tensor]] split = " + Quoted(split) +
                                     ": must be \"even\" or \"ceil\" (torch.chunk)");
      }
      rule.split = split == "ceil" ? SplitMode::kCeil : SplitMode::kEven;
    }
    if (const toml::node* b = t.get("block")) {
      const auto block = b->value<int64_t>();
      if (!b->is_integer() || !block || *block < 1 || *block > kMaxAxis) {
        return Error(LineOf(*b), "[[tensor]] block must be an integer in [1, " +
                                     std::to_string(kMaxAxis) + "]");
      }
      const bool grid_kind = rule.kind == Kind::kColumn || rule.kind == Kind::kRow ||
                             rule.kind == Kind::kGateUp || rule.kind == Kind::kQkvHeads;
      if (*block > 1 && !grid_kind) {
        return Error(LineOf(*b), "[[tensor]] block = " + std::to_string(*block) + " needs kind " +
                                     "\"column\", \"row\", \"gate_up\" or \"qkv_heads\"");
      }
      rule.block = static_cast<uint64_t>(*block);
    }
    rule.expert = rule.local.find("{expert}") != std::string::npos;
    for (const auto& c : rule.canonical) rule.expert |= c.find("{expert}") != std::string::npos;
    if (const toml::node* e = t.get("expert")) {
      if (!e->is_boolean()) return Error(LineOf(*e), "[[tensor]] expert must be true or false");
      if (!e->as_boolean()->get() && rule.expert) {
        return Error(LineOf(*e), "[[tensor]] expert = false, but a name holds {expert}");
      }
      rule.expert = e->as_boolean()->get();
    }
    if (rule.expert && d.model.experts == 0) {
      return Error(rule.line, "[[tensor]] is an expert tensor but [model] experts is not set");
    }
    if (rule.expert && d.model.experts % d.mesh.ep != 0) {
      return Error(rule.line, "[model] experts = " + std::to_string(d.model.experts) +
                                  " does not divide by ep = " + std::to_string(d.mesh.ep));
    }
    return rule;
  }

  Result<FlatBuffer> ParseFlat(const toml::table& t) const {
    FlatBuffer f;
    f.line = LineOf(t);
    RETURN_IF_ERROR(CheckKeys(t, "[[flat]]", kFlatKeys));
    ASSIGN_OR_RETURN(const toml::node* local, Get(t, "local", "[[flat]]", true));
    ASSIGN_OR_RETURN(f.local, String(*local, "[[flat]] local"));
    ASSIGN_OR_RETURN(const toml::node* dtype, Get(t, "dtype", "[[flat]]", true));
    ASSIGN_OR_RETURN(std::string name, String(*dtype, "[[flat]] dtype"));
    auto parsed = ParseDType(name);
    if (!parsed) return Error(LineOf(*dtype), "[[flat]] dtype " + Quoted(name) + " is unknown");
    f.dtype = *parsed;
    ASSIGN_OR_RETURN(const toml::node* params, Get(t, "params", "[[flat]]", true));
    ASSIGN_OR_RETURN(f.params, Patterns(*params, "[[flat]] params"));
    RETURN_IF_ERROR(OptionalInteger(t, "align", "[[flat]]", 1, kMaxAxis, f.align));
    return f;
  }

  toml_text::Reader reader_;
};

}  // namespace

std::string_view KindName(Kind kind) {
  switch (kind) {
    case Kind::kColumn:
      return "column";
    case Kind::kRow:
      return "row";
    case Kind::kReplicated:
      return "replicated";
    case Kind::kQkv:
      return "qkv";
    case Kind::kGateUp:
      return "gate_up";
    case Kind::kTied:
      return "tied";
    case Kind::kGathered:
      return "gathered";
    case Kind::kQkvHeads:
      return "qkv_heads";
  }
  return "unknown";
}

std::string_view ValueName(Value value) {
  switch (value) {
    case Value::kBits:
      return "bits";
    case Value::kCast:
      return "cast";
    case Value::kAddOne:
      return "add_one";
  }
  return "unknown";
}

uint64_t ExpertTpCoord(const Mesh& mesh, const RankCoords& rank) {
  if (mesh.ep_from == EpFrom::kTpDp) return (rank.dp * mesh.tp + rank.tp) % mesh.etp;
  return mesh.etp == 1 ? 0 : rank.tp;
}

std::string LayoutDescription::Where(int line) const {
  return line > 0 ? source + ":" + std::to_string(line) : source;
}

uint64_t LayoutDescription::LayerOffset() const {
  if (rank.layer_offset >= 0) return static_cast<uint64_t>(rank.layer_offset);
  return rank.pp * (model.layers / mesh.pp);
}

std::string LayoutDescription::RankName() const {
  return "tp=" + std::to_string(rank.tp) + " pp=" + std::to_string(rank.pp) +
         " dp=" + std::to_string(rank.dp) + " ep=" + std::to_string(rank.ep);
}

Result<LayoutDescription> ParseLayout(std::string_view toml_text, std::string_view source_name) {
  ASSIGN_OR_RETURN(const toml::table root, toml_text::Reader(source_name).Parse(toml_text));
  return Parser(source_name).Parse(root);
}

Result<LayoutDescription> LoadLayout(const std::filesystem::path& path) {
  ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadFile(path, kMaxLayoutBytes));
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return ParseLayout(text, path.string());
}

}  // namespace deltacast::layout
