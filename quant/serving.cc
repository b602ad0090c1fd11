#include "quant/serving.h"

#include <fnmatch.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/file_util.h"
#include "common/toml_text.h"

namespace deltacast::quant {
namespace {

constexpr uint64_t kMaxServingBytes = uint64_t{1} << 20;
constexpr std::string_view kServingKeys[] = {"scheme", "quantize", "not_converted"};

bool Matches(const std::string& pattern, const std::string& name) {
  return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}
bool MatchesAny(std::span<const std::string> patterns, const std::string& name) {
  return std::any_of(patterns.begin(), patterns.end(),
                     [&](const std::string& p) { return Matches(p, name); });
}

std::string Shape(std::span<const uint64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}
std::string Quoted(std::string_view s) { return "'" + std::string(s) + "'"; }

class Parser {
 public:
  explicit Parser(std::string_view source) : reader_(source) {}

  Status Error(const toml::node* at, std::string_view message) const {
    return reader_.Error(at != nullptr ? toml_text::LineOf(*at) : 0, message);
  }

  Result<ServingDescription> Parse(const toml::table& root) {
    ServingDescription d;
    d.source = reader_.source();
    for (auto&& [key, value] : root) {
      if (key.str() != "serving") {
        return Error(&value, "unknown table " + Quoted(key.str()) +
                                 " (a serving description "
                                 "has one table, [serving])");
      }
    }
    const toml::table* serving = root["serving"].as_table();
    if (serving == nullptr) return Error(nullptr, "missing required table [serving]");
    RETURN_IF_ERROR(reader_.CheckKeys(*serving, "[serving]", kServingKeys));
    const toml::node* scheme = serving->get("scheme");
    if (scheme == nullptr) return Error(serving, "[serving] is missing required key 'scheme'");
    if (!scheme->is_string()) return Error(scheme, "[serving] scheme must be a string");
    const std::string name = scheme->as_string()->get();
    d.scheme = FindFp8Scheme(name);
    if (d.scheme == nullptr) {
      return Error(scheme, "unknown scheme " + Quoted(name) + " (known: " + Fp8SchemeNames() + ")");
    }
    ASSIGN_OR_RETURN(d.quantize, Patterns(*serving, "quantize", true));
    ASSIGN_OR_RETURN(d.not_converted, Patterns(*serving, "not_converted", false));
    return d;
  }

 private:
  Result<std::vector<std::string>> Patterns(const toml::table& t, std::string_view key,
                                            bool required) const {
    std::vector<std::string> out;
    const toml::node* node = t.get(key);
    if (node == nullptr) {
      if (required) return Error(&t, "[serving] is missing required key " + Quoted(key));
      return out;
    }
    const toml::array* array = node->as_array();
    if (array == nullptr) {
      return Error(node, "[serving] " + std::string(key) + " must be an array of strings");
    }
    for (const toml::node& e : *array) {
      if (!e.is_string() || e.as_string()->get().empty()) {
        return Error(&e, "[serving] " + std::string(key) + " holds a non-string or empty entry");
      }
      out.push_back(e.as_string()->get());
    }
    if (required && out.empty()) {
      return Error(node,
                   "[serving] " + std::string(key) + " is empty: nothing is served quantized");
    }
    return out;
  }

  toml_text::Reader reader_;
};

std::string ModuleOf(const std::string& tensor) {
  constexpr std::string_view kSuffix = ".weight";
  if (tensor.size() > kSuffix.size() && tensor.ends_with(kSuffix)) {
    return tensor.substr(0, tensor.size() - kSuffix.size());
  }
  return tensor;
}

}  // namespace

Result<ServingDescription> ParseServing(std::string_view toml_text, std::string_view source_name) {
  if (toml_text.size() > kMaxServingBytes) {
    return Status::InvalidArgument(std::string(source_name) + ": larger than 1 MiB");
  }
  ASSIGN_OR_RETURN(const toml::table root, toml_text::Reader(source_name).Parse(toml_text));
  return Parser(source_name).Parse(root);
}

Result<ServingDescription> LoadServing(const std::filesystem::path& path) {
  ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadFile(path, kMaxServingBytes));
  const std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return ParseServing(text, path.string());
}

Result<std::vector<ServedTensor>> PlanServing(const ServingDescription& d,
                                              std::span<const TensorSpec> canonical) {
  if (d.scheme == nullptr) return Status::InvalidArgument(d.source + ": no scheme");
  std::set<std::string> names;
  for (const TensorSpec& t : canonical) names.insert(t.name);
  std::vector<bool> pattern_used(d.quantize.size(), false);
  std::vector<ServedTensor> plan;
  plan.reserve(canonical.size());
  for (const TensorSpec& t : canonical) {
    ServedTensor s;
    s.canonical = t;
    s.weight = t;
    bool quantize = false;
    if (!MatchesAny(d.not_converted, t.name)) {
      for (size_t i = 0; i < d.quantize.size(); ++i) {
        if (Matches(d.quantize[i], t.name)) {
          pattern_used[i] = true;
          quantize = true;
        }
      }
    }
    if (quantize) {
      const std::string who = d.source + ": tensor " + Quoted(t.name);
      if (t.shape.size() != 2) {
        return Status::InvalidArgument(who + " has shape " + Shape(t.shape) + ": " +
                                       std::string(d.scheme->name) +
                                       " quantizes 2-D tensors only (list it in not_converted)");
      }
      if (t.dtype != DType::kBF16) {
        return Status::InvalidArgument(who + " is " + std::string(DTypeName(t.dtype)) +
                                       ": FP8 serving weights are made from BF16 tensors");
      }
      s.scheme = d.scheme;
      s.weight.dtype = d.scheme->element;
      s.scale.name = t.name + "_scale_inv";
      s.scale.dtype = d.scheme->scale_dtype;
      s.scale.shape = d.scheme->ScaleShape(t.shape[0], t.shape[1]);
      if (names.contains(s.scale.name)) {
        return Status::InvalidArgument(who + ": its scale name " + Quoted(s.scale.name) +
                                       " is already a canonical tensor");
      }
    }
    plan.push_back(std::move(s));
  }
  for (size_t i = 0; i < d.quantize.size(); ++i) {
    if (!pattern_used[i]) {
      return Status::InvalidArgument(d.source + ": quantize pattern " + Quoted(d.quantize[i]) +
                                     " matches no tensor to quantize");
    }
  }
  return plan;
}

Result<QuantizationConfig> ParseQuantizationConfig(std::string_view config_json,
                                                   std::string_view source_name) {
  const std::string src(source_name);
  const nlohmann::json root = nlohmann::json::parse(config_json, nullptr, false);
  if (root.is_discarded() || !root.is_object()) {
    return Status::InvalidArgument(src + ": not a JSON object");
  }
  const auto q = root.find("quantization_config");
  if (q == root.end()) return Status::NotFound(src + " has no quantization_config");
  if (!q->is_object()) return Status::InvalidArgument(src + ": quantization_config is no object");
  QuantizationConfig c;
  auto string_field = [&](const char* key, std::string& out) -> Status {
    const auto it = q->find(key);
    if (it == q->end()) return Status::Ok();
    if (!it->is_string()) {
      return Status::InvalidArgument(src + ": quantization_config." + key + " must be a string");
    }
    out = it->get<std::string>();
    return Status::Ok();
  };
  RETURN_IF_ERROR(string_field("quant_method", c.quant_method));
  RETURN_IF_ERROR(string_field("fmt", c.fmt));
  RETURN_IF_ERROR(string_field("scale_fmt", c.scale_fmt));
  if (const auto it = q->find("weight_block_size"); it != q->end() && !it->is_null()) {
    if (!it->is_array()) {
      return Status::InvalidArgument(src +
                                     ": quantization_config.weight_block_size must be a list");
    }
    for (const auto& v : *it) {
      if (!v.is_number_unsigned()) {
        return Status::InvalidArgument(
            src + ": quantization_config.weight_block_size holds a non-integer");
      }
      c.weight_block_size.push_back(v.get<uint64_t>());
    }
  }
  if (const auto it = q->find("modules_to_not_convert"); it != q->end() && it->is_array()) {
    for (const auto& v : *it) {
      if (v.is_string()) c.modules_to_not_convert.push_back(v.get<std::string>());
    }
  }
  return c;
}

std::string QuantizationConfigJson(std::span<const ServedTensor> plan) {
  const Fp8Scheme* scheme = nullptr;
  nlohmann::json kept = nlohmann::json::array();
  for (const ServedTensor& s : plan) {
    if (s.quantized()) {
      scheme = s.scheme;
    } else if (s.canonical.shape.size() == 2) {
      kept.push_back(ModuleOf(s.canonical.name));
    }
  }
  nlohmann::json q = nlohmann::json::object();
  q["quant_method"] = "fp8";
  q["fmt"] = "e4m3";
  q["activation_scheme"] = "dynamic";
  if (scheme != nullptr) {
    q["weight_block_size"] = {scheme->block_rows, scheme->block_cols};
    if (!scheme->scale_fmt.empty()) q["scale_fmt"] = std::string(scheme->scale_fmt);
  }
  q["modules_to_not_convert"] = kept;
  return q.dump();
}

Status CheckServedCheckpoint(std::span<const ServedTensor> plan,
                             std::span<const TensorSpec> checkpoint,
                             const QuantizationConfig& receiver) {
  const Fp8Scheme* scheme = nullptr;
  for (const ServedTensor& s : plan) {
    if (s.quantized()) scheme = s.scheme;
  }
  if (scheme != nullptr) {
    if (receiver.quant_method != "fp8" || receiver.fmt != "e4m3") {
      return Status::InvalidArgument("the receiver's checkpoint is quant_method '" +
                                     receiver.quant_method + "', fmt '" + receiver.fmt +
                                     "': scheme " + std::string(scheme->name) + " serves fp8 e4m3");
    }
    const std::vector<uint64_t> block = {scheme->block_rows, scheme->block_cols};
    if (receiver.weight_block_size != block) {
      return Status::InvalidArgument(
          "the receiver's checkpoint uses weight_block_size " + Shape(receiver.weight_block_size) +
          "; scheme " + std::string(scheme->name) + " makes blocks of " + Shape(block));
    }
    if (receiver.scale_fmt != scheme->scale_fmt) {
      return Status::InvalidArgument("the receiver's checkpoint has scale_fmt '" +
                                     receiver.scale_fmt + "'; scheme " + std::string(scheme->name) +
                                     " writes '" + std::string(scheme->scale_fmt) + "'");
    }
  }
  std::map<std::string, const TensorSpec*> have;
  for (const TensorSpec& t : checkpoint) have[t.name] = &t;
  auto expect = [&](const TensorSpec& want, std::string_view what) -> Status {
    const auto it = have.find(want.name);
    if (it == have.end()) {
      return Status::InvalidArgument("the receiver's checkpoint lacks " + std::string(what) + " " +
                                     Quoted(want.name));
    }
    const TensorSpec& got = *it->second;
    if (got.dtype != want.dtype || got.shape != want.shape) {
      return Status::InvalidArgument(
          "the receiver's " + std::string(what) + " " + Quoted(want.name) + " is " +
          std::string(DTypeName(got.dtype)) + " " + Shape(got.shape) + "; expected " +
          std::string(DTypeName(want.dtype)) + " " + Shape(want.shape));
    }
    have.erase(it);
    return Status::Ok();
  };
  for (const ServedTensor& s : plan) {
    if (!s.quantized()) {
      RETURN_IF_ERROR(expect(s.weight, "tensor"));
      continue;
    }
    RETURN_IF_ERROR(expect(s.weight, "FP8 weight"));
    RETURN_IF_ERROR(expect(s.scale, "scale tensor"));
  }
  if (!have.empty()) {
    return Status::InvalidArgument("the receiver's checkpoint holds tensor " +
                                   Quoted(have.begin()->first) +
                                   " that the serving plan does not make");
  }
  return Status::Ok();
}

Status CheckFp8Checkpoint(std::span<const TensorSpec> checkpoint,
                          const QuantizationConfig& config) {
  if (config.quant_method != "fp8" || config.weight_block_size.empty()) return Status::Ok();
  const std::vector<uint64_t>& block = config.weight_block_size;
  if (block.size() != 2 || block[0] == 0 || block[1] == 0 || block[0] > UINT32_MAX ||
      block[1] > UINT32_MAX) {
    return Status::InvalidArgument("quantization_config.weight_block_size " + Shape(block) +
                                   " is not two positive block dimensions");
  }
  if (config.fmt != "e4m3") {
    return Status::InvalidArgument("quantization_config.fmt '" + config.fmt +
                                   "': deltacast checks block-scaled e4m3 checkpoints");
  }
  // The checkpoint's own scheme: the table's row if one has its geometry, else the
  // default row with the config's block (its scale shapes are all the check needs).
  Fp8Scheme scheme = Fp8Schemes().front();
  for (const Fp8Scheme& row : Fp8Schemes()) {
    if (row.block_rows == block[0] && row.block_cols == block[1] &&
        row.scale_fmt == config.scale_fmt) {
      scheme = row;
      break;
    }
  }
  scheme.block_rows = static_cast<uint32_t>(block[0]);
  scheme.block_cols = static_cast<uint32_t>(block[1]);
  scheme.scale_fmt = config.scale_fmt;

  std::map<std::string, const TensorSpec*> by_name;
  for (const TensorSpec& t : checkpoint) by_name[t.name] = &t;
  constexpr std::string_view kScaleSuffix = "_scale_inv";
  std::vector<ServedTensor> plan;
  for (const TensorSpec& t : checkpoint) {
    if (t.name.ends_with(kScaleSuffix)) {
      const std::string weight = t.name.substr(0, t.name.size() - kScaleSuffix.size());
      const auto it = by_name.find(weight);
      if (it == by_name.end() || it->second->dtype != scheme.element) {
        return Status::InvalidArgument(
            "scale tensor " + Quoted(t.name) + " belongs to no FP8 weight: " + Quoted(weight) +
            (it == by_name.end() ? " is missing"
                                 : " is " + std::string(DTypeName(it->second->dtype))));
      }
      continue;
    }
    ServedTensor s;
    s.canonical = t;
    s.weight = t;
    if (t.dtype == scheme.element) {
      if (t.shape.size() != 2) {
        return Status::InvalidArgument("FP8 weight " + Quoted(t.name) + " has shape " +
                                       Shape(t.shape) + ": block-scaled weights are 2-D");
      }
      const std::string module = ModuleOf(t.name);
      if (std::find(config.modules_to_not_convert.begin(), config.modules_to_not_convert.end(),
                    module) != config.modules_to_not_convert.end()) {
        return Status::InvalidArgument(
            "tensor " + Quoted(t.name) + " is " + std::string(DTypeName(t.dtype)) + " but module " +
            Quoted(module) + " is in quantization_config.modules_to_not_convert");
      }
      s.canonical.dtype = DType::kBF16;
      s.scheme = &scheme;
      s.scale.name = t.name + std::string(kScaleSuffix);
      s.scale.dtype = scheme.scale_dtype;
      s.scale.shape = scheme.ScaleShape(t.shape[0], t.shape[1]);
    }
    plan.push_back(std::move(s));
  }
  return CheckServedCheckpoint(plan, checkpoint, config);
}

}  // namespace deltacast::quant
