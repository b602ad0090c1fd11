#include "topology/config_explain.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

// toml++ throws toml::parse_error on syntax errors; ParseClusterConfig has already
// accepted the text when it is parsed here again, and the catch below is a guard.
#include <toml++/toml.h>

#include "common/file_util.h"
#include "topology/config_keys.h"
#include "topology/units.h"

namespace deltacast::topology {
namespace {

using json = nlohmann::ordered_json;

constexpr uint64_t kMaxConfigBytes = uint64_t{16} << 20;

// One table of the effective config: [name], or one element of [[name]].
struct Section {
  std::string_view table;
  int index = -1;                           // element of an array of tables; -1 for a plain table
  std::map<std::string_view, json> values;  // keys without a value are absent
};

json Strings(const std::vector<std::string>& list) {
  json out = json::array();
  for (const std::string& s : list) out.push_back(s);
  return out;
}

std::string AbsolutePath(const std::filesystem::path& p) {
  return std::filesystem::absolute(p).lexically_normal().string();
}

std::vector<Section> Sections(const ClusterConfig& c) {
  std::vector<Section> out;
  auto add = [&](std::string_view table, int index = -1) -> auto& {
    out.push_back(Section{table, index, {}});
    return out.back().values;
  };
  {
    auto& v = add("cluster");
    v["name"] = c.name;
    v["auth_token_env"] = c.auth_token_env;
  }
  {
    auto& v = add("tree");
    v["fanout"] = c.tree.fanout ? json(*c.tree.fanout) : json("auto");
    v["stripes"] = c.tree.stripes ? json(*c.tree.stripes) : json("auto");
    v["chunk_size"] = ExactSize(c.tree.chunk_size);
    v["window"] = c.tree.window;
    v["commit_policy"] = std::string(CommitPolicyName(c.tree.commit_policy));
    v["hop_latency"] = ExactDuration(c.tree.hop_latency);
    v["connect_timeout"] = ExactDuration(c.tree.connect_timeout);
    v["idle_timeout"] = ExactDuration(c.tree.idle_timeout);
    v["commit_timeout"] = ExactDuration(c.tree.commit_timeout);
    v["default_uplink"] = ExactBandwidth(c.tree.default_uplink_bps);
  }
  for (size_t i = 0; i < c.regions.size(); ++i) {
    const RegionConfig& r = c.regions[i];
    auto& v = add("region", static_cast<int>(i));
    v["name"] = r.name;
    v["wan_bandwidth"] = ExactBandwidth(r.wan_bps);
    v["wan_latency"] = ExactDuration(r.wan_latency);
    v["flow_bandwidth"] = ExactBandwidth(r.flow_bps > 0 ? r.flow_bps : r.wan_bps);
  }
  for (size_t i = 0; i < c.nodes.size(); ++i) {
    const NodeConfig& n = c.nodes[i];
    auto& v = add("node", static_cast<int>(i));
    v["id"] = n.id;
    v["host"] = n.host;
    v["port"] = n.port;
    v["region"] = n.region;
    v["role"] = std::string(RoleName(n.role));
    v["uplink"] = ExactBandwidth(n.uplink_bps);
    v["transports"] = Strings(n.transports);
    if (n.parent) v["parent"] = *n.parent;
    if (n.role == Role::kReceiver) {  // how a receiver writes; a source writes nothing
      v["gateway"] = n.gateway;
      v["apply"] = std::string(ApplyModeName(n.apply_mode));
      v["staged_memory"] = ExactSize(n.staged_memory);
      v["checkpoint"] = std::string(CheckpointModeName(n.checkpoint));
      v["snapshot_every"] = static_cast<int64_t>(n.snapshot_every);
      v["snapshot_chain_percent"] = static_cast<int64_t>(n.snapshot_chain_percent);
      v["snapshot_rate"] = ExactSize(n.snapshot_rate);
    }
  }
  {
    auto& v = add("transport");
    v["ucx_provider"] = c.transport.ucx_provider;
    v["ofi_provider"] = c.transport.ofi_provider;
  }
  for (size_t i = 0; i < c.links.size(); ++i) {
    const LinkRule& l = c.links[i];
    auto& v = add("link", static_cast<int>(i));
    v["from"] = l.from;
    v["to"] = l.to;
    v["scope"] = l.scope == LinkScope::kAny           ? "any"
                 : l.scope == LinkScope::kIntraRegion ? "intra-region"
                                                      : "cross-region";
    v["transports"] = Strings(l.transports);
  }
  {
    const LimitsConfig& l = c.limits;
    auto& v = add("limits");
    v["handshake_timeout"] = ExactDuration(l.handshake_timeout);
    v["max_pending_handshakes"] = l.max_pending_handshakes;
    v["max_handshakes_per_address"] = l.max_handshakes_per_address;
    v["max_connections_per_address"] = l.max_connections_per_address;
    v["handshake_max_message"] = ExactSize(l.handshake_max_message);
    v["receive_pool"] = ExactSize(l.receive_pool);
    v["receive_pool_idle"] = ExactDuration(l.receive_pool_idle);
  }
  {
    const SecurityConfig& s = c.security;
    auto& v = add("security");
    v["tls"] = std::string(TlsHopsName(s.tls));
    const std::pair<std::string_view, const std::filesystem::path*> paths[] = {
        {"ca", &s.ca},
        {"cert", &s.cert},
        {"key", &s.key},
        {"signing_key", &s.signing_key},
        {"verify_key", &s.verify_key}};
    for (const auto& [key, path] : paths) {
      if (!path->empty()) v[key] = AbsolutePath(*path);
    }
    v["producer_region"] = ProducerRegion(c);  // the source's unless the file says
  }
  if (c.objstore) {
    const ObjectStoreConfig& o = *c.objstore;
    auto& v = add("objstore");
    v["endpoint"] = o.endpoint;
    v["bucket"] = o.bucket;
    v["region"] = o.region;
    v["prefix"] = o.prefix;
    v["access_key_env"] = o.access_key_env;
    v["secret_key_env"] = o.secret_key_env;
    v["bridges"] = Strings(o.bridges);
    v["parallel"] = o.parallel;
    v["keep_refits"] = o.keep_refits;
    v["poll"] = ExactDuration(o.poll);
    v["poll_max"] = ExactDuration(o.poll_max);
    v["request_timeout"] = ExactDuration(o.request_timeout);
  }
  if (c.coordination) {
    const CoordinationConfig& o = *c.coordination;
    auto& v = add("coordination");
    v["endpoints"] = Strings(o.endpoints);
    v["prefix"] = o.prefix;
    v["source_timeout"] = ExactDuration(o.source_timeout);
    v["request_timeout"] = ExactDuration(o.request_timeout);
    v["poll_interval"] = ExactDuration(o.poll_interval);
    v["keep_records"] = static_cast<int64_t>(o.keep_records);
    const std::pair<std::string_view, const std::string*> paths[] = {
        {"ca_file", &o.ca_file}, {"cert_file", &o.cert_file}, {"key_file", &o.key_file}};
    for (const auto& [key, path] : paths) {
      if (!path->empty()) v[key] = AbsolutePath(*path);
    }
  }
  return out;
}

// Whether the file itself sets `key` in `section`.
bool SetInFile(const toml::table& root, const Section& section, std::string_view key) {
  const toml::node* table = root.get(section.table);
  if (table == nullptr) return false;
  if (section.index >= 0) {
    const toml::array* array = table->as_array();
    if (array == nullptr || static_cast<size_t>(section.index) >= array->size()) return false;
    table = array->get(static_cast<size_t>(section.index));
  }
  const toml::table* t = table ? table->as_table() : nullptr;
  return t != nullptr && t->get(key) != nullptr;
}

std::string TomlString(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned char>(c));
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string TomlValue(const json& v) {
  if (v.is_string()) return TomlString(v.get<std::string>());
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + TomlValue(v[i]);
    return out + "]";
  }
  return v.dump();  // integers
}

std::string Header(const ConfigTable& t) {
  return t.array ? "[[" + std::string(t.name) + "]]" : "[" + std::string(t.name) + "]";
}

const ConfigTable& TableOf(std::string_view name) {
  for (const ConfigTable& t : ConfigTables()) {
    if (t.name == name) return t;
  }
  return ConfigTables().front();  // unreachable: every section names a known table
}

std::string RenderToml(const ClusterConfig& config, const std::vector<Section>& sections,
                       const toml::table& root) {
  std::string out = "# The effective config of " + config.source_file.string() +
                    ": every key, defaults filled in.\n"
                    "# \"# default\" marks a key the file does not set; docs/config.md "
                    "describes each key.\n";
  for (const Section& section : sections) {
    out += "\n" + Header(TableOf(section.table)) + "\n";
    for (std::string_view key : ConfigKeyNames(section.table)) {
      const ConfigKey& k = *FindConfigKey(section.table, key);
      const auto it = section.values.find(key);
      if (it == section.values.end()) {
        // Not set and without a value to show: a manual parent nobody chose, or a
        // receiver's setting on the source.
        const bool receivers_only = key == "apply" || key == "staged_memory" || key == "gateway" ||
                                    key == "checkpoint" || key.starts_with("snapshot_");
        out += "# " + std::string(key) + ": " +
               (receivers_only ? "receivers only" : std::string(k.default_value)) + "\n";
        continue;
      }
      std::string line = std::string(key) + " = " + TomlValue(it->second);
      if (!SetInFile(root, section, key)) {
        line.resize(std::max<size_t>(line.size(), 40), ' ');
        line += "  # default";
        if (!k.default_literal) line += ": " + std::string(k.default_value);
      }
      out += line + "\n";
    }
  }
  return out;
}

std::string RenderJson(const ClusterConfig& config, const std::vector<Section>& sections,
                       const toml::table& root) {
  json out = json::object();
  out["source"] = config.source_file.string();
  json defaulted = json::array();
  // Every table in reference order; a plain table the config lacks ([objstore]) stays null.
  for (const ConfigTable& table : ConfigTables()) {
    out[std::string(table.name)] = table.array ? json::array() : json(nullptr);
  }
  for (const Section& section : sections) {
    json values = json::object();
    for (std::string_view key : ConfigKeyNames(section.table)) {
      const auto it = section.values.find(key);
      values[std::string(key)] = it == section.values.end() ? json(nullptr) : it->second;
      if (it != section.values.end() && !SetInFile(root, section, key)) {
        std::string name(section.table);
        if (section.index >= 0) name += "[" + std::to_string(section.index) + "]";
        defaulted.push_back(name + "." + std::string(key));
      }
    }
    if (section.index >= 0) {
      out[std::string(section.table)].push_back(std::move(values));
    } else {
      out[std::string(section.table)] = std::move(values);
    }
  }
  out["defaulted"] = std::move(defaulted);
  return out.dump(2) + "\n";
}

// `value` with `unit` when value / scale writes exactly (and parses back to it).
std::optional<std::string> ExactIn(double value, double scale, std::string_view unit) {
  char text[64];
  std::snprintf(text, sizeof text, "%.12g", value / scale);
  if (std::string_view(text).find_first_of("eE") != std::string_view::npos) return std::nullopt;
  std::string candidate = std::string(text) + std::string(unit);
  auto parsed = ParseBandwidth(candidate);
  if (!parsed.ok() || *parsed != value) return std::nullopt;
  return candidate;
}

}  // namespace

std::string ExactSize(uint64_t bytes) {
  constexpr std::pair<uint64_t, std::string_view> kUnits[] = {{uint64_t{1} << 40, "TiB"},
                                                              {uint64_t{1} << 30, "GiB"},
                                                              {uint64_t{1} << 20, "MiB"},
                                                              {uint64_t{1} << 10, "KiB"}};
  for (const auto& [scale, unit] : kUnits) {
    if (bytes != 0 && bytes % scale == 0) return std::to_string(bytes / scale) + std::string(unit);
  }
  return std::to_string(bytes) + "B";
}

std::string ExactDuration(std::chrono::milliseconds duration) {
  const int64_t ms = duration.count();
  if (ms != 0 && ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

std::string ExactBandwidth(double bits_per_second) {
  constexpr std::pair<double, std::string_view> kUnits[] = {
      {1e12, "Tbit"}, {1e9, "Gbit"}, {1e6, "Mbit"}, {1e3, "Kbit"}, {1, "bit"}};
  for (const auto& [scale, unit] : kUnits) {
    if (bits_per_second < scale) continue;
    if (auto exact = ExactIn(bits_per_second, scale, unit)) return *exact;
  }
  char text[64];
  std::snprintf(text, sizeof text, "%.17gbit", bits_per_second);
  return text;
}

Result<std::string> ExplainClusterConfig(std::string_view toml_text, std::string_view source_name,
                                         ExplainFormat format) {
  ASSIGN_OR_RETURN(ClusterConfig config, ParseClusterConfig(toml_text, source_name));
  toml::table root;
  try {
    root = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& e) {
    return Status::Internal(std::string(source_name) +
                            ": parsed once, not twice: " + std::string(e.description()));
  }
  const std::vector<Section> sections = Sections(config);
  return format == ExplainFormat::kJson ? RenderJson(config, sections, root)
                                        : RenderToml(config, sections, root);
}

Result<std::string> ExplainClusterConfigFile(const std::filesystem::path& path,
                                             ExplainFormat format) {
  ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadFile(path, kMaxConfigBytes));
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return ExplainClusterConfig(text, path.string(), format);
}

std::string ConfigReference(ExplainFormat format) {
  if (format == ExplainFormat::kJson) {
    json out = json::array();
    for (const ConfigKey& k : ConfigKeys()) {
      out.push_back({{"table", k.table},
                     {"key", k.key},
                     {"type", k.type},
                     {"required", k.required},
                     {"default", k.required ? json(nullptr) : json(k.default_value)},
                     {"default_literal", !k.required && k.default_literal},
                     {"summary", k.summary}});
    }
    return out.dump(2) + "\n";
  }
  std::string out =
      "# Every table and key of a deltacast cluster config, with its default\n"
      "# (docs/config.md says what each does and when to change it).\n";
  for (const ConfigTable& t : ConfigTables()) {
    out += "\n" + Header(t) + "  # " + (t.required ? "required" : "optional") +
           (t.array ? ", one per entry" : "") + ": " + std::string(t.summary) + "\n";
    for (const ConfigKey& k : ConfigKeys()) {
      if (k.table != t.name) continue;
      std::string line;
      if (k.required) {
        line = "# " + std::string(k.key) + " = (required)";
      } else if (!k.default_literal) {
        line = "# " + std::string(k.key) + " = (" + std::string(k.default_value) + ")";
      } else {
        line = std::string(k.key) + " = " + std::string(k.default_value);
      }
      line.resize(std::max<size_t>(line.size(), 40), ' ');
      out += line + "  # " + std::string(k.type) + ": " + std::string(k.summary) + "\n";
    }
  }
  return out;
}

}  // namespace deltacast::topology
