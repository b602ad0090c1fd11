#include "layout/placement.h"

#include <algorithm>
#include <map>
#include <optional>

#include "common/hash.h"
#include "layout/internal/coverage.h"
#include "layout/internal/kinds.h"

namespace deltacast::layout {
namespace {

using internal::Target;
using internal::TpRuns;

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

uint64_t Product(const std::vector<uint64_t>& shape, size_t from = 0) {
  uint64_t n = 1;
  for (size_t i = from; i < shape.size(); ++i) n *= shape[i];
  return n;
}

bool IsFloat(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

// What a pattern captured from a local name.
struct Captures {
  std::optional<uint64_t> layer;
  std::optional<uint64_t> expert;
  std::string star;
};

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Backtracking match of "{layer}", "{expert}" (decimal digits) and one "*".
bool MatchAt(std::string_view pat, std::string_view name, Captures& caps) {
  if (pat.empty()) return name.empty();
  for (std::string_view token : {std::string_view("{layer}"), std::string_view("{expert}")}) {
    if (!pat.starts_with(token)) continue;
    size_t digits = 0;
    while (digits < name.size() && digits < 12 && IsDigit(name[digits])) ++digits;
    for (size_t n = digits; n >= 1; --n) {
      if (n > 1 && name[0] == '0') continue;  // no leading zeros: "01" is not layer 1
      Captures c = caps;
      const uint64_t v = std::stoull(std::string(name.substr(0, n)));
      (token == "{layer}" ? c.layer : c.expert) = v;
      if (MatchAt(pat.substr(token.size()), name.substr(n), c)) {
        caps = c;
        return true;
      }
    }
    return false;
  }
  if (pat.front() == '*') {
    for (size_t n = name.size() + 1; n-- > 0;) {
      Captures c = caps;
      c.star = std::string(name.substr(0, n));
      if (MatchAt(pat.substr(1), name.substr(n), c)) {
        caps = c;
        return true;
      }
    }
    return false;
  }
  return !name.empty() && name.front() == pat.front() &&
         MatchAt(pat.substr(1), name.substr(1), caps);
}

std::string Substitute(std::string_view pattern, uint64_t layer, std::optional<uint64_t> expert,
                       std::string_view star) {
  std::string out;
  for (size_t i = 0; i < pattern.size();) {
    if (pattern.substr(i).starts_with("{layer}")) {
      out += std::to_string(layer);
      i += 7;
    } else if (pattern.substr(i).starts_with("{expert}")) {
      out += std::to_string(expert.value_or(0));
      i += 8;
    } else if (pattern[i] == '*') {
      out += star;
      ++i;
    } else {
      out += pattern[i++];
    }
  }
  return out;
}

// A stable replica to scan a replicated tensor: chosen by name hash, so scanning
// spreads over replicas and every rank agrees without talking.
uint64_t Pick(std::string_view name, std::string_view axis, uint64_t size) {
  if (size <= 1) return 0;
  std::string key(name);
  key += '/';
  key += axis;
  return Hash64(AsBytes(key)) % size;
}

// An axis a tensor is replicated over: this rank's coordinate on it, its size and
// the coordinate that scans.
struct ReplicaAxis {
  uint64_t coord = 0, size = 1, pick = 0;
};

// 0 on the scanning replica; otherwise 1 + the rank's mixed-radix index over the
// axes, so the ranks holding copy c of a tensor together hold one whole copy.
uint32_t CopyNumber(const std::vector<ReplicaAxis>& axes) {
  bool scanner = true;
  uint64_t index = 0, radix = 1;
  for (const ReplicaAxis& a : axes) {
    scanner &= a.coord == a.pick;
    index += a.coord * radix;
    radix *= a.size;
  }
  return scanner ? 0 : static_cast<uint32_t>(1 + index);
}

class Expander {
 public:
  Expander(const LayoutDescription& d, const std::vector<TensorSpec>& canonical)
      : d_(d), canonical_(canonical) {}

  Status Error(int line, const std::string& message) const {
    return Status::InvalidArgument(d_.Where(line) + ": " + message);
  }

  std::optional<uint32_t> Find(std::string_view name) const {
    auto it = std::lower_bound(canonical_.begin(), canonical_.end(), name,
                               [](const TensorSpec& t, std::string_view n) { return t.name < n; });
    if (it == canonical_.end() || it->name != name) return std::nullopt;
    return static_cast<uint32_t>(it - canonical_.begin());
  }

  const Rule* Match(std::string_view name, Captures& caps) const {
    for (const Rule& rule : d_.rules) {
      Captures c;
      if (MatchAt(rule.local, name, c)) {
        caps = c;
        return &rule;
      }
    }
    return nullptr;
  }

  // The full TP-local tensor a rule gives `name` (before FSDP): its shape and runs.
  // `scanned` says whether this rank is the one replica that scans it.
  Result<TpRuns> Expand(const Rule& rule, const Captures& caps, std::string_view name,
                        bool& scanned) const {
    const Mesh& mesh = d_.mesh;
    const RankCoords& rank = d_.rank;
    if (rule.local.find("{layer}") != std::string::npos &&
        d_.LayerOffset() + *caps.layer >= d_.model.layers) {
      return Error(rule.line, "local '" + std::string(name) + "' is layer " +
                                  std::to_string(*caps.layer) + " of a stage starting at layer " +
                                  std::to_string(d_.LayerOffset()) + ", beyond the model's " +
                                  std::to_string(d_.model.layers));
    }
    const uint64_t layer = d_.LayerOffset() + caps.layer.value_or(0);
    const bool local_per_expert = rule.local.find("{expert}") != std::string::npos;
    const uint64_t experts_here = rule.expert ? d_.model.experts / mesh.ep : 1;
    if (local_per_expert && *caps.expert >= experts_here) {
      return Error(rule.line, "local '" + std::string(name) + "' is local expert " +
                                  std::to_string(*caps.expert) + " but an EP rank holds " +
                                  std::to_string(experts_here));
    }
    const uint64_t slabs = rule.expert && !local_per_expert ? experts_here : 1;
    const uint64_t axis = rule.expert ? mesh.etp : mesh.tp;
    const uint64_t coord = rule.expert ? ExpertTpCoord(mesh, rank) : rank.tp;

    TpRuns out;
    std::vector<char> kv_copy;  // parallel to out.runs: a copy of a replicated KV head
    std::vector<uint64_t> slab_shape;
    for (uint64_t s = 0; s < slabs; ++s) {
      std::optional<uint64_t> global_expert;
      if (rule.expert) {
        global_expert = rank.ep * experts_here + (local_per_expert ? *caps.expert : s);
      }
      std::vector<Target> targets;
      for (const std::string& pattern : rule.canonical) {
        Target t;
        t.name = Substitute(pattern, layer, global_expert, caps.star);
        auto index = Find(t.name);
        if (!index) {
          return Error(rule.line, "local '" + std::string(name) + "' maps to canonical '" + t.name +
                                      "', which the canonical table does not have");
        }
        t.index = *index;
        t.shape = canonical_[*index].shape;
        if (rule.expert && pattern.find("{expert}") == std::string::npos) {
          // A stacked canonical tensor [experts, ...]: this expert is one slab.
          if (t.shape.empty() || t.shape[0] != d_.model.experts) {
            return Error(rule.line, "stacked expert tensor '" + t.name + "' " + ShapeText(t.shape) +
                                        " should have dim 0 = " + std::to_string(d_.model.experts) +
                                        " experts");
          }
          t.shape.erase(t.shape.begin());
          t.base = *global_expert * Product(t.shape);
        }
        targets.push_back(std::move(t));
      }
      auto runs = internal::KindRuns(rule, d_.model, targets, axis, coord);
      if (!runs.ok()) {
        return Error(rule.line, "local '" + std::string(name) + "': " + runs.status().message());
      }
      slab_shape = runs->local_shape;
      kv_replicas_ = runs->kv_replicas;
      kv_index_ = runs->kv_index;
      const uint64_t slab_elements = Product(slab_shape);
      for (Run r : runs->runs) {
        kv_copy.push_back(runs->kv_replicas > 1 && r.canonical != targets[0].index);
        r.src += s * slab_elements;
        r.value = rule.value;
        r.line = rule.line;
        out.runs.push_back(r);
      }
      if (s == 0) {
        scanned_name_ = targets[0].name;
        for (const Target& t : targets) {
          if (rule.value == Value::kBits) continue;
          if (!IsFloat(canonical_[t.index].dtype)) {
            return Error(rule.line, "value \"" + std::string(ValueName(rule.value)) +
                                        "\" needs a float canonical tensor; '" + t.name + "' is " +
                                        std::string(DTypeName(canonical_[t.index].dtype)));
          }
        }
        target_dtypes_.clear();
        for (const Target& t : targets) target_dtypes_.push_back(canonical_[t.index].dtype);
      }
    }
    out.local_shape = slab_shape;
    if (rule.expert && !local_per_expert) out.local_shape.insert(out.local_shape.begin(), slabs);

    // Exactly one replica scans: on every axis the tensor is replicated over, the
    // coordinate its name hash picks (a replicated KV head: its first rank). The
    // others number their copies by their coordinates on those axes.
    std::vector<ReplicaAxis> axes;
    const bool engine_expert = rule.expert && mesh.ep_from == EpFrom::kTpDp;
    if (mesh.fsdp == Fsdp::kNone && !engine_expert) {
      axes.push_back({rank.dp, mesh.dp, Pick(scanned_name_, "dp", mesh.dp)});
    }
    if (rule.kind == Kind::kReplicated || (rule.expert && axis == 1 && !engine_expert)) {
      axes.push_back({rank.tp, mesh.tp, Pick(scanned_name_, "tp", mesh.tp)});
    }
    if (!rule.expert && mesh.ep_from == EpFrom::kDp) {
      axes.push_back({rank.ep, mesh.ep, Pick(scanned_name_, "ep", mesh.ep)});
    }
    const uint32_t copy = CopyNumber(axes);
    scanned = copy == 0;
    axes.push_back({kv_index_, kv_replicas_, 0});
    const uint32_t kv = CopyNumber(axes);
    for (size_t i = 0; i < out.runs.size(); ++i) out.runs[i].copy = kv_copy[i] ? kv : copy;
    return out;
  }

  std::string scanned_name() const { return scanned_name_; }
  const std::vector<DType>& target_dtypes() const { return target_dtypes_; }

 private:
  const LayoutDescription& d_;
  const std::vector<TensorSpec>& canonical_;
  mutable std::string scanned_name_;
  mutable std::vector<DType> target_dtypes_;
  mutable uint64_t kv_replicas_ = 1, kv_index_ = 0;
};

Role RoleFor(const Rule& rule) {
  if (rule.kind == Kind::kTied) return Role::kTied;
  if (rule.kind == Kind::kGathered) return Role::kGathered;
  return rule.value == Value::kBits ? Role::kProjected : Role::kResidual;
}

}  // namespace

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kProjected:
      return "projected";
    case Role::kResidual:
      return "residual";
    case Role::kGathered:
      return "gathered";
    case Role::kReplica:
      return "replica";
    case Role::kTied:
      return "tied";
    case Role::kFlat:
      return "flat";
    case Role::kUnmatched:
      return "unmatched";
  }
  return "unknown";
}

void PlacementMap::Index() {
  std::stable_sort(runs_.begin(), runs_.end(), [](const Run& a, const Run& b) {
    return a.local != b.local ? a.local < b.local : a.src < b.src;
  });
  local_begin_.assign(locals_.size() + 1, runs_.size());
  for (size_t i = runs_.size(); i-- > 0;) local_begin_[runs_[i].local] = i;
  for (size_t t = locals_.size(); t-- > 0;) {
    local_begin_[t] = std::min(local_begin_[t], local_begin_[t + 1]);
  }
  by_canonical_.resize(runs_.size());
  for (uint32_t i = 0; i < runs_.size(); ++i) by_canonical_[i] = i;
  std::sort(by_canonical_.begin(), by_canonical_.end(), [&](uint32_t a, uint32_t b) {
    const Run &x = runs_[a], &y = runs_[b];
    return x.canonical != y.canonical ? x.canonical < y.canonical : x.dst < y.dst;
  });
}

std::span<const Run> PlacementMap::RunsOf(uint32_t local) const {
  if (local >= locals_.size()) return {};
  return std::span<const Run>(runs_).subspan(local_begin_[local],
                                             local_begin_[local + 1] - local_begin_[local]);
}

std::optional<CanonicalPosition> PlacementMap::ToCanonical(uint32_t local, uint64_t index) const {
  for (const Run& r : RunsOf(local)) {
    if (r.src > index) break;
    if (auto e = Project(r, index)) return CanonicalPosition{r.canonical, *e};
  }
  return std::nullopt;
}

std::vector<Run> PlacementMap::ShardPieces(uint32_t canonical, uint64_t begin, uint64_t end) const {
  std::vector<Run> out;
  auto first = std::lower_bound(by_canonical_.begin(), by_canonical_.end(), canonical,
                                [&](uint32_t i, uint32_t c) { return runs_[i].canonical < c; });
  for (auto it = first; it != by_canonical_.end() && runs_[*it].canonical == canonical; ++it) {
    const Run& r = runs_[*it];
    if (r.dst >= end) break;
    if (r.DstEnd() <= begin) continue;
    for (const Run& piece : ClipDestination(r, begin, end)) out.push_back(piece);
  }
  std::sort(out.begin(), out.end(), [](const Run& a, const Run& b) { return a.dst < b.dst; });
  return out;
}

std::vector<uint32_t> PlacementMap::CoveredCanonical() const {
  std::vector<uint32_t> out;
  for (uint32_t i : by_canonical_) {
    if (out.empty() || out.back() != runs_[i].canonical) out.push_back(runs_[i].canonical);
  }
  return out;
}

uint64_t PlacementMap::CoveredElements(uint32_t canonical) const {
  uint64_t n = 0;
  for (const Run& r : runs_) n += r.canonical == canonical ? r.Elements() : 0;
  return n;
}

Result<PlacementMap> ExpandPlacement(const LayoutDescription& d, std::vector<TensorSpec> canonical,
                                     std::vector<TensorSpec> local, PlacementUse use) {
  const bool load = use == PlacementUse::kLoad;
  PlacementMap map;
  map.name_ = d.source + " (" + d.RankName() + ")";
  std::sort(canonical.begin(), canonical.end(),
            [](const TensorSpec& a, const TensorSpec& b) { return a.name < b.name; });
  for (size_t i = 1; i < canonical.size(); ++i) {
    if (canonical[i].name == canonical[i - 1].name) {
      return Status::InvalidArgument("the canonical table lists '" + canonical[i].name + "' twice");
    }
  }
  map.canonical_ = std::move(canonical);
  Expander expander(d, map.canonical_);
  const Mesh& mesh = d.mesh;

  std::map<std::string, const FlatBuffer*> flats;
  for (const FlatBuffer& f : d.flats) flats[f.local] = &f;

  for (uint32_t li = 0; li < local.size(); ++li) {
    LocalTensor lt;
    lt.spec = local[li];
    const std::string& name = lt.spec.name;
    if (auto flat = flats.find(name); flat != flats.end()) {
      lt.role = Role::kFlat;
      lt.line = flat->second->line;
      map.locals_.push_back(std::move(lt));
      continue;  // expanded below, once every local is known
    }
    Captures caps;
    const Rule* rule = expander.Match(name, caps);
    if (rule == nullptr) {
      map.locals_.push_back(std::move(lt));  // unmatched: fails closed, never guessed
      continue;
    }
    lt.line = rule->line;
    bool scanned = false;
    ASSIGN_OR_RETURN(TpRuns tp, expander.Expand(*rule, caps, name, scanned));
    std::vector<uint64_t> expected = tp.local_shape;
    std::vector<Run> runs = std::move(tp.runs);
    if (mesh.fsdp == Fsdp::kFsdp2 && rule->kind != Kind::kGathered) {
      // torch.chunk on dim 0 over the dp ranks: c = ceil(N0 / W) rows each.
      if (expected.empty()) return expander.Error(rule->line, "FSDP2 of a scalar '" + name + "'");
      const uint64_t rows = expected[0], row = Product(expected, 1);
      const uint64_t c = (rows + mesh.dp - 1) / mesh.dp;
      const uint64_t first = std::min(rows, d.rank.dp * c), end = std::min(rows, first + c);
      std::vector<Run> clipped;
      for (const Run& r : runs) {
        for (const Run& piece : ClipSource(r, first * row, end * row, 0)) clipped.push_back(piece);
      }
      runs = std::move(clipped);
      expected[0] = end - first;
    }
    if (expected != lt.spec.shape) {
      return expander.Error(rule->line, "local '" + name + "' has shape " +
                                            ShapeText(lt.spec.shape) + "; its rule (" +
                                            std::string(KindName(rule->kind)) + " of '" +
                                            expander.scanned_name() + "' at " + d.RankName() +
                                            ") implies " + ShapeText(expected));
    }
    for (DType t : expander.target_dtypes()) {
      if (rule->value == Value::kBits && t != lt.spec.dtype) {
        return expander.Error(rule->line, "local '" + name + "' is " +
                                              std::string(DTypeName(lt.spec.dtype)) +
                                              " but canonical '" + expander.scanned_name() +
                                              "' is " + std::string(DTypeName(t)) +
                                              ": a dtype change is residual (value = \"cast\")");
      }
      if (rule->value != Value::kBits && !IsFloat(lt.spec.dtype)) {
        return expander.Error(rule->line, "value \"" + std::string(ValueName(rule->value)) +
                                              "\" needs a float local tensor; '" + name + "' is " +
                                              std::string(DTypeName(lt.spec.dtype)));
      }
    }
    lt.role = scanned ? RoleFor(*rule) : Role::kReplica;
    for (Run& r : runs) {
      if (r.copy != 0 && !load) continue;
      r.local = li;
      map.runs_.push_back(r);
    }
    map.locals_.push_back(std::move(lt));
  }

  for (const FlatBuffer& f : d.flats) {
    auto it = std::find_if(map.locals_.begin(), map.locals_.end(),
                           [&](const LocalTensor& t) { return t.spec.name == f.local; });
    if (it == map.locals_.end()) {
      return expander.Error(f.line, "flat buffer '" + f.local + "' is not in the shard");
    }
    const uint32_t li = static_cast<uint32_t>(it - map.locals_.begin());
    struct Param {
      uint64_t offset = 0, size = 0;
      std::vector<Run> runs;
    };
    std::vector<Param> params;
    uint64_t total = 0;
    for (const std::string& pname : f.params) {
      Captures caps;
      const Rule* rule = expander.Match(pname, caps);
      if (rule == nullptr) {
        return expander.Error(f.line, "flat buffer '" + f.local + "' parameter '" + pname +
                                          "' matches no [[tensor]] rule");
      }
      bool scanned = false;
      ASSIGN_OR_RETURN(TpRuns tp, expander.Expand(*rule, caps, pname, scanned));
      for (DType t : expander.target_dtypes()) {
        if (rule->value == Value::kBits && t != f.dtype) {
          return expander.Error(f.line, "flat buffer '" + f.local + "' is " +
                                            std::string(DTypeName(f.dtype)) + " but '" + pname +
                                            "' maps to a " + std::string(DTypeName(t)) +
                                            " tensor with value = \"bits\"");
        }
      }
      Param p;
      p.offset = (total + f.align - 1) / f.align * f.align;
      p.size = Product(tp.local_shape);
      for (const Run& r : tp.runs) {
        if (r.copy == 0 || load) p.runs.push_back(r);
      }
      total = p.offset + p.size;
      params.push_back(std::move(p));
    }
    // Padded so every dp rank owns the same number of elements.
    const uint64_t per = (total + mesh.dp - 1) / mesh.dp;
    const uint64_t own_begin = d.rank.dp * per, own_end = own_begin + per;
    if (it->spec.shape != std::vector<uint64_t>{per} || it->spec.dtype != f.dtype) {
      return expander.Error(f.line, "flat buffer '" + f.local + "' is " +
                                        std::string(DTypeName(it->spec.dtype)) + " " +
                                        ShapeText(it->spec.shape) + "; its parameters imply " +
                                        std::string(DTypeName(f.dtype)) + " [" +
                                        std::to_string(per) + "] per dp rank");
    }
    for (const Param& p : params) {
      const uint64_t a = std::max(own_begin, p.offset), b = std::min(own_end, p.offset + p.size);
      if (a >= b) continue;
      for (const Run& r : p.runs) {
        for (Run piece : ClipSource(r, a - p.offset, b - p.offset, a - own_begin)) {
          piece.local = li;
          map.runs_.push_back(piece);
        }
      }
    }
  }

  map.Index();
  // One rank must not map two of its elements onto one canonical element.
  const internal::RankRuns self{&map.name_, map.runs_};
  RETURN_IF_ERROR(internal::CheckOverlaps(map.canonical_, std::span(&self, 1)));
  return map;
}

Result<std::vector<ExpectedLocal>> ExpectedLocals(const LayoutDescription& d,
                                                  std::vector<TensorSpec> canonical) {
  std::sort(canonical.begin(), canonical.end(),
            [](const TensorSpec& a, const TensorSpec& b) { return a.name < b.name; });
  Expander expander(d, canonical);
  const uint64_t first_layer = d.LayerOffset();
  const uint64_t stage_layers = d.mesh.pp == 1 ? d.model.layers : d.model.layers / d.mesh.pp;
  const uint64_t experts_here = d.model.experts / d.mesh.ep;
  // A parameter of a flat buffer lies inside the buffer, not as a tensor of its own.
  auto in_flat = [&](const std::string& name) {
    for (const FlatBuffer& f : d.flats) {
      if (std::find(f.params.begin(), f.params.end(), name) != f.params.end()) return true;
    }
    return false;
  };
  std::map<std::string, ExpectedLocal> out;
  for (const Rule& rule : d.rules) {
    if (rule.kind == Kind::kTied || rule.kind == Kind::kGathered) continue;
    const bool local_expert = rule.local.find("{expert}") != std::string::npos;
    for (const TensorSpec& c : canonical) {
      for (const std::string& pattern : rule.canonical) {
        Captures caps;
        if (!MatchAt(pattern, c.name, caps)) continue;
        uint64_t layer = 0;
        if (caps.layer) {
          if (*caps.layer < first_layer || *caps.layer >= first_layer + stage_layers) break;
          layer = *caps.layer - first_layer;
        }
        std::vector<std::optional<uint64_t>> experts{std::nullopt};
        if (rule.expert && caps.expert) {
          if (experts_here == 0 || *caps.expert / experts_here != d.rank.ep) break;
          if (local_expert) experts = {*caps.expert % experts_here};
        } else if (rule.expert && local_expert) {
          experts.clear();  // a stacked canonical tensor: every local expert
          for (uint64_t e = 0; e < experts_here; ++e) experts.push_back(e);
        }
        for (const auto& e : experts) {
          const std::string name = Substitute(rule.local, layer, e, caps.star);
          if (out.contains(name) || in_flat(name)) continue;
          Captures local_caps;
          if (expander.Match(name, local_caps) != &rule) continue;
          bool scanned = false;
          ASSIGN_OR_RETURN(TpRuns tp, expander.Expand(rule, local_caps, name, scanned));
          ExpectedLocal x{name, c.name, rule.line, {}};
          if (d.mesh.fsdp == Fsdp::kNone) x.shape = tp.local_shape;
          out.emplace(name, std::move(x));
        }
        break;
      }
    }
  }
  std::vector<ExpectedLocal> list;
  for (auto& [name, x] : out) list.push_back(std::move(x));
  return list;
}

Result<PlacementMap> MapWhole(std::vector<TensorSpec> canonical, std::vector<std::string> names) {
  PlacementMap map;
  map.name_ = "whole tensors";
  std::sort(canonical.begin(), canonical.end(),
            [](const TensorSpec& a, const TensorSpec& b) { return a.name < b.name; });
  map.canonical_ = std::move(canonical);
  if (names.empty()) {
    for (const auto& t : map.canonical_) names.push_back(t.name);
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  for (const std::string& name : names) {
    auto it =
        std::lower_bound(map.canonical_.begin(), map.canonical_.end(), name,
                         [](const TensorSpec& t, const std::string& n) { return t.name < n; });
    if (it == map.canonical_.end() || it->name != name) {
      return Status::InvalidArgument("tensor '" + name + "' is not in the canonical table");
    }
    const auto c = static_cast<uint32_t>(it - map.canonical_.begin());
    const auto li = static_cast<uint32_t>(map.locals_.size());
    map.locals_.push_back(LocalTensor{*it, Role::kProjected, 0});
    if (it->ElementCount() == 0) continue;
    Run r;
    r.local = li;
    r.canonical = c;
    r.count = 1;
    r.len = r.src_stride = r.dst_stride = it->ElementCount();
    map.runs_.push_back(r);
  }
  map.Index();
  return map;
}

Result<PlacementMap> MapRuns(std::string name, std::vector<TensorSpec> canonical,
                             std::vector<LocalTensor> locals, std::vector<Run> runs) {
  for (size_t i = 1; i < canonical.size(); ++i) {
    if (!(canonical[i - 1].name < canonical[i].name)) {
      return Status::InvalidArgument(name + ": the canonical table is not sorted by name");
    }
  }
  for (const Run& r : runs) {
    if (r.local >= locals.size() || r.canonical >= canonical.size() || r.count == 0 ||
        r.SrcEnd() > locals[r.local].spec.ElementCount() ||
        r.DstEnd() > canonical[r.canonical].ElementCount()) {
      return Status::InvalidArgument(name + ": a run lies outside its tensors");
    }
  }
  PlacementMap map;
  map.name_ = std::move(name);
  map.canonical_ = std::move(canonical);
  map.locals_ = std::move(locals);
  map.runs_ = std::move(runs);
  map.Index();
  return map;
}

Result<PlacementMap> MapRanges(std::vector<TensorSpec> canonical, std::vector<ElementRange> ranges,
                               std::string name) {
  PlacementMap map;
  map.name_ = std::move(name);
  std::sort(canonical.begin(), canonical.end(),
            [](const TensorSpec& a, const TensorSpec& b) { return a.name < b.name; });
  map.canonical_ = std::move(canonical);
  for (const ElementRange& range : ranges) {
    auto it =
        std::lower_bound(map.canonical_.begin(), map.canonical_.end(), range.tensor,
                         [](const TensorSpec& t, const std::string& n) { return t.name < n; });
    if (it == map.canonical_.end() || it->name != range.tensor) {
      return Status::InvalidArgument("tensor '" + range.tensor + "' is not in the canonical table");
    }
    if (range.begin >= range.end || range.end > it->ElementCount()) {
      return Status::InvalidArgument(map.name_ + ": range [" + std::to_string(range.begin) + ", " +
                                     std::to_string(range.end) + ") of tensor '" + range.tensor +
                                     "' is empty or past its " + std::to_string(it->ElementCount()) +
                                     " elements");
    }
    const auto li = static_cast<uint32_t>(map.locals_.size());
    const uint64_t n = range.end - range.begin;
    map.locals_.push_back(LocalTensor{
        {range.tensor + "[" + std::to_string(range.begin) + ":" + std::to_string(range.end) + "]",
         it->dtype,
         {n}},
        Role::kProjected,
        0});
    Run r;
    r.local = li;
    r.canonical = static_cast<uint32_t>(it - map.canonical_.begin());
    r.dst = range.begin;
    r.count = 1;
    r.len = r.src_stride = r.dst_stride = n;
    map.runs_.push_back(r);
  }
  map.Index();
  const internal::RankRuns self{&map.name_, map.runs_};
  RETURN_IF_ERROR(internal::CheckOverlaps(map.canonical_, std::span(&self, 1)));
  return map;
}

Status CheckCoverage(std::span<const PlacementMap* const> maps) {
  if (maps.empty()) return Status::InvalidArgument("no placement maps to check");
  for (const PlacementMap* m : maps) {
    if (m->canonical() != maps.front()->canonical()) {
      return Status::InvalidArgument(m->name() + " was expanded against another canonical table");
    }
  }
  std::vector<internal::RankRuns> ranks;
  for (const PlacementMap* m : maps) ranks.push_back({&m->name(), m->runs()});
  RETURN_IF_ERROR(internal::CheckOverlaps(maps.front()->canonical(), ranks));
  return internal::CheckGaps(maps.front()->canonical(), ranks);
}

CanonicalRuns CanonicalRunsOf(const PlacementMap& map, std::string name) {
  return {std::move(name), map.runs()};
}

Status CheckCoverage(const std::vector<TensorSpec>& canonical,
                     std::span<const CanonicalRuns> ranks) {
  if (ranks.empty()) return Status::InvalidArgument("no ranks to check");
  std::vector<internal::RankRuns> views;
  for (const CanonicalRuns& r : ranks) views.push_back({&r.name, r.runs});
  RETURN_IF_ERROR(internal::CheckOverlaps(canonical, views));
  return internal::CheckGaps(canonical, views);
}

}  // namespace deltacast::layout
