#include "topology/cluster_config.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <span>
#include <string>
#include <utility>

#include "common/file_util.h"
#include "common/toml_text.h"
#include "topology/config_keys.h"
#include "topology/internal/config_text.h"
#include "topology/internal/coordination_config_parse.h"
#include "topology/internal/objstore_config_parse.h"
#include "topology/internal/security_config.h"
#include "topology/units.h"

namespace deltacast::topology {
namespace {

using internal::IsValidEnvName;
using internal::IsValidId;
using internal::kMaxFanout;
using internal::kMaxIdLength;
using internal::kMaxStripes;
using internal::kMaxWindow;
using internal::LowerAscii;
using internal::Quoted;

constexpr uint64_t kMaxConfigBytes = uint64_t{16} << 20;

using toml_text::LineOf;
using toml_text::TypeName;

// Turns one TOML document into a ClusterConfig, reporting the first problem with its
// line. Cross-entry checks are left to ValidateClusterConfig.
class Parser {
 public:
  explicit Parser(std::string_view source_name) : reader_(source_name), source_(source_name) {}

  Status Error(int line, std::string_view message) const { return reader_.Error(line, message); }

  Result<ClusterConfig> Parse(const toml::table& root) {
    ClusterConfig config;
    config.source_file = source_;
    RETURN_IF_ERROR(CheckKeys(root, "the top level", ConfigTableNames()));

    const toml::node* cluster = root.get("cluster");
    if (cluster == nullptr) return Error(0, "missing required table [cluster]");
    ASSIGN_OR_RETURN(const toml::table* cluster_table, AsTable(*cluster, "cluster", "[cluster]"));
    RETURN_IF_ERROR(ParseCluster(*cluster_table, config));

    if (const toml::node* tree = root.get("tree")) {
      ASSIGN_OR_RETURN(const toml::table* tree_table, AsTable(*tree, "tree", "[tree]"));
      RETURN_IF_ERROR(ParseTree(*tree_table, config.tree));
    }

    if (const toml::node* regions = root.get("region")) {
      ASSIGN_OR_RETURN(std::vector<const toml::table*> tables, AsTableArray(*regions, "region"));
      for (const toml::table* t : tables) {
        ASSIGN_OR_RETURN(RegionConfig region, ParseRegion(*t));
        config.regions.push_back(std::move(region));
      }
    }

    if (const toml::node* transport = root.get("transport")) {
      ASSIGN_OR_RETURN(const toml::table* table, AsTable(*transport, "transport", "[transport]"));
      RETURN_IF_ERROR(ParseTransport(*table, config.transport));
    }

    RETURN_IF_ERROR(internal::ParseLimitsAndSecurity(root, source_, config));
    RETURN_IF_ERROR(internal::ParseObjectStore(root, source_, config));
    RETURN_IF_ERROR(internal::ParseCoordination(root, source_, config));

    if (const toml::node* links = root.get("link")) {
      ASSIGN_OR_RETURN(std::vector<const toml::table*> tables, AsTableArray(*links, "link"));
      for (const toml::table* t : tables) {
        ASSIGN_OR_RETURN(LinkRule rule, ParseLink(*t));
        config.links.push_back(std::move(rule));
      }
    }

    const toml::node* nodes = root.get("node");
    if (nodes == nullptr) return Error(0, "no [[node]] entries: a cluster needs a source");
    ASSIGN_OR_RETURN(std::vector<const toml::table*> tables, AsTableArray(*nodes, "node"));
    std::vector<bool> region_given;
    for (const toml::table* t : tables) {
      ASSIGN_OR_RETURN(NodeConfig node, ParseNode(*t, config.tree));
      region_given.push_back(!node.region.empty());
      config.nodes.push_back(std::move(node));
    }
    // A node without a region is in the source's region, so one-region clusters need
    // not repeat it. With no unique source, ValidateClusterConfig reports that instead.
    const NodeConfig* source = nullptr;
    int sources = 0;
    for (const NodeConfig& n : config.nodes) {
      if (n.role == Role::kSource) {
        source = &n;
        ++sources;
      }
    }
    if (sources == 1) {
      const std::string source_region = source->region.empty() ? "default" : source->region;
      for (size_t i = 0; i < config.nodes.size(); ++i) {
        if (!region_given[i]) config.nodes[i].region = source_region;
      }
    }
    return config;
  }

 private:
  // Fails on the first key of `table` that is not in `known`, suggesting the nearest.
  Status CheckKeys(const toml::table& table, std::string_view where,
                   std::span<const std::string_view> known) const {
    const toml::key* unknown = toml_text::FirstUnknownKey(table, known);
    if (unknown != nullptr && where == "[cluster]" &&
        toml_text::NearestKey(unknown->str(), known).empty() &&
        LowerAscii(unknown->str()).find("token") != std::string::npos) {
      return Error(static_cast<int>(unknown->source().begin.line),
                   "unknown key " + Quoted(unknown->str()) +
                       " in [cluster]: the token must never be "
                       "written in the config; put it in an environment variable and name that "
                       "variable in auth_token_env");
    }
    return reader_.CheckKeys(table, where, known);
  }

  Result<const toml::table*> AsTable(const toml::node& node, std::string_view key,
                                     std::string_view header) const {
    const toml::table* table = node.as_table();
    if (table == nullptr) {
      return Error(LineOf(node), Quoted(key) + " must be a table " + std::string(header) +
                                     ", got " + std::string(TypeName(node.type())));
    }
    return table;
  }

  Result<std::vector<const toml::table*>> AsTableArray(const toml::node& node,
                                                       std::string_view key) const {
    const toml::array* array = node.as_array();
    if (array == nullptr) {
      return Error(LineOf(node), "\"" + std::string(key) +
                                     "\" must be an array of tables: write [[" + std::string(key) +
                                     "]], not [" + std::string(key) + "]");
    }
    std::vector<const toml::table*> tables;
    for (const toml::node& element : *array) {
      const toml::table* table = element.as_table();
      if (table == nullptr) {
        return Error(LineOf(element), "each " + std::string(key) + " entry must be a table, got " +
                                          std::string(TypeName(element.type())));
      }
      tables.push_back(table);
    }
    return tables;
  }

  // A field: its node (nullptr when absent) and where to report problems.
  struct Field {
    const toml::node* node = nullptr;
    int line = 0;
    std::string name;  // "[tree] window", "node 'a1' port"
  };

  Result<Field> Get(const toml::table& table, std::string_view key, std::string_view where,
                    bool required) const {
    Field field;
    field.name = std::string(where) + " " + std::string(key);
    field.node = table.get(key);
    if (field.node == nullptr) {
      field.line = LineOf(table);
      if (required) {
        return Error(field.line, std::string(where) + " is missing required key " + Quoted(key));
      }
      return field;
    }
    field.line = LineOf(*field.node);
    return field;
  }

  Status WrongType(const Field& f, std::string_view expected) const {
    return Error(f.line, f.name + " must be " + std::string(expected) + ", got " +
                             std::string(TypeName(f.node->type())));
  }

  Result<std::string> String(const Field& f) const {
    const auto* s = f.node->as_string();
    if (s == nullptr) return WrongType(f, "a string");
    return s->get();
  }

  Result<int64_t> Integer(const Field& f, int64_t min, int64_t max) const {
    const auto* i = f.node->as_integer();
    if (i == nullptr) return WrongType(f, "an integer");
    const int64_t v = i->get();
    if (v < min || v > max) {
      return Error(f.line, f.name + " = " + std::to_string(v) + " is out of range [" +
                               std::to_string(min) + ", " + std::to_string(max) + "]");
    }
    return v;
  }

  // Wraps a units.h parse error with where it happened.
  template <typename T>
  Result<T> WithField(const Field& f, Result<T> parsed) const {
    if (!parsed.ok()) return Error(f.line, f.name + ": " + parsed.status().message());
    return parsed;
  }

  Result<uint64_t> Size(const Field& f) const {
    if (const auto* i = f.node->as_integer()) {
      if (i->get() < 0)
        return Error(f.line, f.name + " = " + std::to_string(i->get()) + " is negative");
      return static_cast<uint64_t>(i->get());
    }
    if (f.node->as_string() == nullptr) return WrongType(f, "a size such as \"4MiB\"");
    return WithField(f, ParseSize(f.node->as_string()->get()));
  }

  Result<double> Bandwidth(const Field& f) const {
    if (f.node->as_string() == nullptr) return WrongType(f, "a bandwidth such as \"10Gbit\"");
    return WithField(f, ParseBandwidth(f.node->as_string()->get()));
  }

  Result<std::chrono::milliseconds> Duration(const Field& f, bool allow_zero) const {
    if (f.node->as_string() == nullptr) return WrongType(f, "a duration such as \"10s\"");
    ASSIGN_OR_RETURN(auto d, WithField(f, ParseDuration(f.node->as_string()->get())));
    if (!allow_zero && d.count() == 0) return Error(f.line, f.name + " must be greater than zero");
    return d;
  }

  Result<std::string> Identifier(const Field& f, std::string_view what) const {
    ASSIGN_OR_RETURN(std::string s, String(f));
    if (!IsValidId(s)) {
      return Error(f.line, f.name + " = " + Quoted(s) + " is not a valid " + std::string(what) +
                               " (1-" + std::to_string(kMaxIdLength) +
                               " characters from A-Z a-z 0-9 . _ -)");
    }
    return s;
  }

  Status ParseCluster(const toml::table& t, ClusterConfig& config) const {
    RETURN_IF_ERROR(CheckKeys(t, "[cluster]", ConfigKeyNames("cluster")));
    ASSIGN_OR_RETURN(Field name, Get(t, "name", "[cluster]", true));
    ASSIGN_OR_RETURN(config.name, String(name));
    if (config.name.empty()) return Error(name.line, "[cluster] name must not be empty");
    ASSIGN_OR_RETURN(Field env, Get(t, "auth_token_env", "[cluster]", false));
    if (env.node != nullptr) {
      ASSIGN_OR_RETURN(config.auth_token_env, String(env));
      if (!IsValidEnvName(config.auth_token_env)) {
        return Error(env.line, "[cluster] auth_token_env = " + Quoted(config.auth_token_env) +
                                   " is not an environment variable name (letters, digits and _, "
                                   "not starting with a digit); it names the variable that holds "
                                   "the token, not the token itself");
      }
    }
    return Status::Ok();
  }

  Status ParseTree(const toml::table& t, TreeConfig& tree) const {
    constexpr std::string_view kWhere = "[tree]";
    RETURN_IF_ERROR(CheckKeys(t, kWhere, ConfigKeyNames("tree")));

    ASSIGN_OR_RETURN(Field fanout, Get(t, "fanout", kWhere, false));
    if (fanout.node != nullptr) {
      if (const auto* s = fanout.node->as_string()) {
        if (s->get() != "auto") {
          return Error(fanout.line, "[tree] fanout = " + Quoted(s->get()) +
                                        ": must be \"auto\" or an integer >= 1");
        }
        tree.fanout.reset();
      } else if (fanout.node->is_integer()) {
        ASSIGN_OR_RETURN(int64_t k, Integer(fanout, 1, kMaxFanout));
        tree.fanout = static_cast<int>(k);
      } else {
        return WrongType(fanout, "\"auto\" or an integer >= 1");
      }
    }

    ASSIGN_OR_RETURN(Field stripes, Get(t, "stripes", kWhere, false));
    if (stripes.node != nullptr) {
      tree.stripes_line = stripes.line;
      if (const auto* s = stripes.node->as_string()) {
        if (s->get() != "auto") {
          return Error(stripes.line, "[tree] stripes = " + Quoted(s->get()) +
                                         ": must be \"auto\" or an integer >= 1");
        }
        tree.stripes.reset();
      } else if (stripes.node->is_integer()) {
        ASSIGN_OR_RETURN(int64_t k, Integer(stripes, 1, kMaxStripes));
        tree.stripes = static_cast<int>(k);
      } else {
        return WrongType(stripes, "\"auto\" or an integer >= 1");
      }
    }

    ASSIGN_OR_RETURN(Field chunk, Get(t, "chunk_size", kWhere, false));
    if (chunk.node != nullptr) {
      ASSIGN_OR_RETURN(tree.chunk_size, Size(chunk));
      if (tree.chunk_size < kMinChunkSize || tree.chunk_size > kMaxChunkSize) {
        return Error(chunk.line, "[tree] chunk_size = " + FormatSize(tree.chunk_size) +
                                     " is out of range [" + FormatSize(kMinChunkSize) + ", " +
                                     FormatSize(kMaxChunkSize) + "]");
      }
    }

    ASSIGN_OR_RETURN(Field window, Get(t, "window", kWhere, false));
    if (window.node != nullptr) {
      ASSIGN_OR_RETURN(int64_t w, Integer(window, 1, kMaxWindow));
      tree.window = static_cast<int>(w);
    }

    ASSIGN_OR_RETURN(Field policy, Get(t, "commit_policy", kWhere, false));
    if (policy.node != nullptr) {
      ASSIGN_OR_RETURN(std::string p, String(policy));
      if (p == "all") {
        tree.commit_policy = CommitPolicy::kAll;
      } else if (p == "available") {
        tree.commit_policy = CommitPolicy::kAvailable;
      } else {
        return Error(policy.line,
                     "[tree] commit_policy = " + Quoted(p) + ": must be \"all\" or \"available\"");
      }
    }

    struct DurationKey {
      std::string_view key;
      std::chrono::milliseconds* out;
      bool allow_zero;
    };
    const DurationKey durations[] = {
        {"hop_latency", &tree.hop_latency, true},
        {"connect_timeout", &tree.connect_timeout, false},
        {"idle_timeout", &tree.idle_timeout, false},
        {"commit_timeout", &tree.commit_timeout, false},
    };
    for (const DurationKey& d : durations) {
      ASSIGN_OR_RETURN(Field f, Get(t, d.key, kWhere, false));
      if (f.node != nullptr) {
        ASSIGN_OR_RETURN(*d.out, Duration(f, d.allow_zero));
      }
    }

    ASSIGN_OR_RETURN(Field uplink, Get(t, "default_uplink", kWhere, false));
    if (uplink.node != nullptr) {
      ASSIGN_OR_RETURN(tree.default_uplink_bps, Bandwidth(uplink));
    }
    return Status::Ok();
  }

  Result<RegionConfig> ParseRegion(const toml::table& t) const {
    RegionConfig region;
    region.line = LineOf(t);
    RETURN_IF_ERROR(CheckKeys(t, "[[region]]", ConfigKeyNames("region")));
    ASSIGN_OR_RETURN(Field name, Get(t, "name", "[[region]]", true));
    ASSIGN_OR_RETURN(region.name, Identifier(name, "region name"));
    const std::string where = "[[region]] " + Quoted(region.name);
    ASSIGN_OR_RETURN(Field bandwidth, Get(t, "wan_bandwidth", where, true));
    ASSIGN_OR_RETURN(region.wan_bps, Bandwidth(bandwidth));
    ASSIGN_OR_RETURN(Field latency, Get(t, "wan_latency", where, true));
    ASSIGN_OR_RETURN(region.wan_latency, Duration(latency, true));
    ASSIGN_OR_RETURN(Field flow, Get(t, "flow_bandwidth", where, false));
    if (flow.node != nullptr) {
      ASSIGN_OR_RETURN(region.flow_bps, Bandwidth(flow));
      if (!(region.flow_bps > 0)) return Error(flow.line, flow.name + " must be greater than zero");
    }
    return region;
  }

  Result<NodeConfig> ParseNode(const toml::table& t, const TreeConfig& tree) const {
    NodeConfig node;
    node.line = LineOf(t);
    RETURN_IF_ERROR(CheckKeys(t, "[[node]]", ConfigKeyNames("node")));
    ASSIGN_OR_RETURN(Field id, Get(t, "id", "[[node]]", true));
    ASSIGN_OR_RETURN(node.id, Identifier(id, "node id"));
    const std::string where = "[[node]] " + Quoted(node.id);

    ASSIGN_OR_RETURN(Field host, Get(t, "host", where, true));
    ASSIGN_OR_RETURN(node.host, String(host));
    if (node.host.empty() || node.host.size() > 253 ||
        std::any_of(node.host.begin(), node.host.end(), [](char c) {
          return std::isspace(static_cast<unsigned char>(c)) ||
                 std::iscntrl(static_cast<unsigned char>(c));
        })) {
      return Error(host.line,
                   host.name + " = " + Quoted(node.host) + " is not a host name or address");
    }

    ASSIGN_OR_RETURN(Field port, Get(t, "port", where, true));
    ASSIGN_OR_RETURN(int64_t port_value, Integer(port, 1, 65535));
    node.port = static_cast<uint16_t>(port_value);

    ASSIGN_OR_RETURN(Field region, Get(t, "region", where, false));
    if (region.node != nullptr) {
      ASSIGN_OR_RETURN(node.region, Identifier(region, "region name"));
    }

    ASSIGN_OR_RETURN(Field role, Get(t, "role", where, false));
    if (role.node != nullptr) {
      ASSIGN_OR_RETURN(std::string r, String(role));
      if (r == "source") {
        node.role = Role::kSource;
      } else if (r == "receiver") {
        node.role = Role::kReceiver;
      } else if (r == "sender") {
        node.role = Role::kSender;
      } else {
        return Error(role.line, role.name + " = " + Quoted(r) +
                                    ": must be \"source\", \"receiver\" or \"sender\"");
      }
    }

    node.uplink_bps = tree.default_uplink_bps;
    ASSIGN_OR_RETURN(Field uplink, Get(t, "uplink", where, false));
    if (uplink.node != nullptr) {
      ASSIGN_OR_RETURN(node.uplink_bps, Bandwidth(uplink));
    }

    node.transports = {"tcp"};
    ASSIGN_OR_RETURN(Field transports, Get(t, "transports", where, false));
    if (transports.node != nullptr) {
      ASSIGN_OR_RETURN(node.transports, TransportList(transports));
    }

    ASSIGN_OR_RETURN(Field parent, Get(t, "parent", where, false));
    if (parent.node != nullptr) {
      ASSIGN_OR_RETURN(std::string p, Identifier(parent, "node id"));
      node.parent = std::move(p);
      node.parent_line = parent.line;
    }

    ASSIGN_OR_RETURN(Field gateway, Get(t, "gateway", where, false));
    if (gateway.node != nullptr) {
      const auto* b = gateway.node->as_boolean();
      if (b == nullptr) return WrongType(gateway, "true or false");
      node.gateway = b->get();
    }

    ASSIGN_OR_RETURN(Field apply, Get(t, "apply", where, false));
    if (apply.node != nullptr) {
      ASSIGN_OR_RETURN(std::string a, String(apply));
      if (a == "on-arrival") {
        node.apply_mode = ApplyMode::kOnArrival;
      } else if (a == "staged") {
        node.apply_mode = ApplyMode::kStaged;
      } else {
        return Error(apply.line,
                     apply.name + " = " + Quoted(a) + ": must be \"on-arrival\" or \"staged\"");
      }
    }
    ASSIGN_OR_RETURN(Field staged_memory, Get(t, "staged_memory", where, false));
    if (staged_memory.node != nullptr) {
      ASSIGN_OR_RETURN(node.staged_memory, Size(staged_memory));
    }
    ASSIGN_OR_RETURN(Field checkpoint, Get(t, "checkpoint", where, false));
    if (checkpoint.node != nullptr) {
      ASSIGN_OR_RETURN(std::string c, String(checkpoint));
      if (c == "in-place") {
        node.checkpoint = CheckpointMode::kInPlace;
      } else if (c == "snapshot") {
        node.checkpoint = CheckpointMode::kSnapshot;
      } else {
        return Error(checkpoint.line, checkpoint.name + " = " + Quoted(c) +
                                          ": must be \"in-place\" or \"snapshot\"");
      }
    }
    ASSIGN_OR_RETURN(Field every, Get(t, "snapshot_every", where, false));
    if (every.node != nullptr) {
      ASSIGN_OR_RETURN(int64_t k, Integer(every, 0, 1'000'000));
      node.snapshot_every = static_cast<uint32_t>(k);
    }
    ASSIGN_OR_RETURN(Field chain, Get(t, "snapshot_chain_percent", where, false));
    if (chain.node != nullptr) {
      ASSIGN_OR_RETURN(int64_t p, Integer(chain, 0, 10'000));
      node.snapshot_chain_percent = static_cast<uint32_t>(p);
    }
    ASSIGN_OR_RETURN(Field rate, Get(t, "snapshot_rate", where, false));
    if (rate.node != nullptr) {
      ASSIGN_OR_RETURN(node.snapshot_rate, Size(rate));
    }
    return node;
  }

  // A non-empty array of distinct known transport names.
  Result<std::vector<std::string>> TransportList(const Field& f) const {
    const toml::array* array = f.node->as_array();
    if (array == nullptr) return WrongType(f, "an array of strings");
    if (array->empty()) return Error(f.line, f.name + " must not be empty");
    std::vector<std::string> list;
    for (const toml::node& element : *array) {
      const auto* s = element.as_string();
      if (s == nullptr) {
        return Error(f.line,
                     f.name + " must hold strings, got " + std::string(TypeName(element.type())));
      }
      const auto& known = KnownTransports();
      if (std::find(known.begin(), known.end(), s->get()) == known.end()) {
        return Error(f.line, f.name + ": unknown transport " + Quoted(s->get()) +
                                 " (known: tcp, ucx, ofi, inproc)");
      }
      if (std::find(list.begin(), list.end(), s->get()) != list.end()) {
        return Error(f.line, f.name + " lists " + Quoted(s->get()) + " twice");
      }
      list.push_back(s->get());
    }
    return list;
  }

  Status ParseTransport(const toml::table& t, TransportSettings& settings) const {
    constexpr std::string_view kWhere = "[transport]";
    RETURN_IF_ERROR(CheckKeys(t, kWhere, ConfigKeyNames("transport")));
    ASSIGN_OR_RETURN(Field ucx, Get(t, "ucx_provider", kWhere, false));
    if (ucx.node != nullptr) {
      ASSIGN_OR_RETURN(settings.ucx_provider, String(ucx));
    }
    ASSIGN_OR_RETURN(Field ofi, Get(t, "ofi_provider", kWhere, false));
    if (ofi.node != nullptr) {
      ASSIGN_OR_RETURN(settings.ofi_provider, String(ofi));
    }
    return Status::Ok();
  }

  Result<LinkRule> ParseLink(const toml::table& t) const {
    constexpr std::string_view kWhere = "[[link]]";
    LinkRule rule;
    rule.line = LineOf(t);
    RETURN_IF_ERROR(CheckKeys(t, kWhere, ConfigKeyNames("link")));
    for (auto [key, out] : {std::pair{"from", &rule.from}, std::pair{"to", &rule.to}}) {
      ASSIGN_OR_RETURN(Field f, Get(t, key, kWhere, false));
      if (f.node != nullptr) {
        ASSIGN_OR_RETURN(*out, String(f));
      }
    }
    ASSIGN_OR_RETURN(Field scope, Get(t, "scope", kWhere, false));
    if (scope.node != nullptr) {
      ASSIGN_OR_RETURN(std::string s, String(scope));
      if (s == "any") {
        rule.scope = LinkScope::kAny;
      } else if (s == "intra-region") {
        rule.scope = LinkScope::kIntraRegion;
      } else if (s == "cross-region") {
        rule.scope = LinkScope::kCrossRegion;
      } else {
        return Error(scope.line, "[[link]] scope = " + Quoted(s) +
                                     ": must be \"any\", \"intra-region\" or \"cross-region\"");
      }
    }
    ASSIGN_OR_RETURN(Field transports, Get(t, "transports", kWhere, true));
    ASSIGN_OR_RETURN(rule.transports, TransportList(transports));
    return rule;
  }

  toml_text::Reader reader_;
  std::string source_;
};

// A [[link]] side: "*", a node id, or "region:NAME" of a declared or used region.
bool SelectorMatches(std::string_view selector, const NodeConfig& node) {
  if (selector == "*") return true;
  if (selector.starts_with("region:")) return selector.substr(7) == node.region;
  return selector == node.id;
}

}  // namespace

uint16_t TransportPortOffset(std::string_view transport) {
  if (transport == "ucx") return 1;
  if (transport == "ofi") return 2;
  return 0;  // tcp, inproc
}

std::vector<std::string> HopTransports(const ClusterConfig& config, const NodeConfig& parent,
                                       const NodeConfig& child) {
  const std::vector<std::string>* wanted = &child.transports;
  const bool cross_region = parent.region != child.region;
  for (const LinkRule& rule : config.links) {
    if (rule.scope == LinkScope::kIntraRegion && cross_region) continue;
    if (rule.scope == LinkScope::kCrossRegion && !cross_region) continue;
    if (!SelectorMatches(rule.from, parent) || !SelectorMatches(rule.to, child)) continue;
    wanted = &rule.transports;
    break;
  }
  std::vector<std::string> hop;
  for (const std::string& t : *wanted) {
    const bool both =
        std::find(parent.transports.begin(), parent.transports.end(), t) !=
            parent.transports.end() &&
        std::find(child.transports.begin(), child.transports.end(), t) != child.transports.end();
    if (both) hop.push_back(t);
  }
  return hop;
}

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kSource:
      return "source";
    case Role::kReceiver:
      return "receiver";
    case Role::kSender:
      return "sender";
  }
  return "unknown";
}

std::string_view ApplyModeName(ApplyMode mode) {
  return mode == ApplyMode::kStaged ? "staged" : "on-arrival";
}

std::string_view CheckpointModeName(CheckpointMode mode) {
  return mode == CheckpointMode::kSnapshot ? "snapshot" : "in-place";
}

std::string_view CommitPolicyName(CommitPolicy policy) {
  switch (policy) {
    case CommitPolicy::kAll:
      return "all";
    case CommitPolicy::kAvailable:
      return "available";
  }
  return "unknown";
}

const std::vector<std::string_view>& KnownTransports() {
  static const std::vector<std::string_view> kKnown = {"tcp", "ucx", "ofi", "inproc"};
  return kKnown;
}

const NodeConfig* ClusterConfig::FindNode(std::string_view id) const {
  for (const NodeConfig& n : nodes) {
    if (n.id == id) return &n;
  }
  return nullptr;
}

const RegionConfig* ClusterConfig::FindRegion(std::string_view region_name) const {
  for (const RegionConfig& r : regions) {
    if (r.name == region_name) return &r;
  }
  return nullptr;
}

const NodeConfig* ClusterConfig::Source() const {
  for (const NodeConfig& n : nodes) {
    if (n.role == Role::kSource) return &n;
  }
  return nullptr;
}

Result<ClusterConfig> ParseClusterConfig(std::string_view toml_text, std::string_view source_name) {
  Parser parser(source_name);
  ASSIGN_OR_RETURN(const toml::table root, toml_text::Reader(source_name).Parse(toml_text));
  ASSIGN_OR_RETURN(ClusterConfig config, parser.Parse(root));
  RETURN_IF_ERROR(ValidateClusterConfig(config));
  return config;
}

Result<ClusterConfig> LoadClusterConfig(const std::filesystem::path& path) {
  ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadFile(path, kMaxConfigBytes));
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return ParseClusterConfig(text, path.string());
}

Result<std::string> ReadAuthToken(const ClusterConfig& config) {
  const std::string& name = config.auth_token_env;
  const char* value = std::getenv(name.c_str());
  if (value == nullptr || *value == '\0') {
    return Status::FailedPrecondition(
        "the cluster's shared token is missing: environment variable " + name +
        (value == nullptr ? " is not set" : " is empty") +
        " (named by [cluster] auth_token_env in " + config.source_file.string() + ")");
  }
  return std::string(value);
}

}  // namespace deltacast::topology
