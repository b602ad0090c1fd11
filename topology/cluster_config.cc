#include "topology/cluster_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <span>
#include <string>
#include <utility>

// toml++ reports syntax errors by throwing toml::parse_error (the Debian build has
// exceptions on); they are caught in ParseClusterConfig and never leave this file.
#include <toml++/toml.h>

#include "common/file_util.h"
#include "topology/internal/objstore_config_parse.h"
#include "topology/internal/security_config.h"
#include "topology/units.h"

namespace deltacast::topology {
namespace {

constexpr uint64_t kMaxConfigBytes = uint64_t{16} << 20;
constexpr int kMaxWindow = 4096;
constexpr int kMaxFanout = 65535;
constexpr size_t kMaxIdLength = 128;

constexpr std::string_view kTopKeys[] = {"cluster",   "tree", "region", "node",
                                         "transport", "link", "limits", "security",
                                         "objstore"};
constexpr std::string_view kTransportKeys[] = {"ucx_provider", "ofi_provider"};
constexpr std::string_view kLinkKeys[] = {"from", "to", "scope", "transports"};
constexpr std::string_view kClusterKeys[] = {"name", "auth_token_env"};
constexpr std::string_view kTreeKeys[] = {
    "fanout",          "chunk_size",   "window",         "commit_policy",  "hop_latency",
    "connect_timeout", "idle_timeout", "commit_timeout", "default_uplink",
};
constexpr std::string_view kRegionKeys[] = {"name", "wan_bandwidth", "wan_latency"};
constexpr std::string_view kNodeKeys[] = {"id",   "host",   "port",       "region",
                                          "role", "uplink", "transports", "parent"};

int LineOf(const toml::node& node) { return static_cast<int>(node.source().begin.line); }

std::string Quoted(std::string_view s) { return "\"" + std::string(s) + "\""; }

std::string_view TypeName(toml::node_type type) {
  switch (type) {
    case toml::node_type::none:
      return "nothing";
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
  }
  return "an unknown type";
}

// Levenshtein distance, for "did you mean" hints on misspelled keys.
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

bool IsValidId(std::string_view id) {
  if (id.empty() || id.size() > kMaxIdLength) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

bool IsValidEnvName(std::string_view name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

std::string LowerAscii(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Turns one TOML document into a ClusterConfig, reporting the first problem with its
// line. Cross-entry checks are left to ValidateClusterConfig.
class Parser {
 public:
  explicit Parser(std::string_view source_name) : source_(source_name) {}

  Status Error(int line, std::string_view message) const {
    std::string where = source_;
    if (line > 0) where += ":" + std::to_string(line);
    return Status::InvalidArgument(where + ": " + std::string(message));
  }

  Result<ClusterConfig> Parse(const toml::table& root) {
    ClusterConfig config;
    config.source_file = source_;
    RETURN_IF_ERROR(CheckKeys(root, "the top level", kTopKeys));

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
    for (auto&& [key, value] : table) {
      const std::string_view name = key.str();
      if (std::find(known.begin(), known.end(), name) != known.end()) continue;
      std::string message = "unknown key " + Quoted(name) + " in " + std::string(where);
      std::string_view best;
      size_t best_distance = 3;
      for (std::string_view k : known) {
        const size_t d = EditDistance(name, k);
        if (d < best_distance) {
          best_distance = d;
          best = k;
        }
      }
      if (!best.empty()) {
        message += " (did you mean " + Quoted(best) + "?)";
      } else if (where == "[cluster]" && LowerAscii(name).find("token") != std::string::npos) {
        message +=
            ": the token must never be written in the config; put it in an environment "
            "variable and name that variable in auth_token_env";
      } else {
        message += " (known keys:";
        for (std::string_view k : known) message += " " + std::string(k);
        message += ")";
      }
      return Error(static_cast<int>(key.source().begin.line), message);
    }
    return Status::Ok();
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
    RETURN_IF_ERROR(CheckKeys(t, "[cluster]", kClusterKeys));
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
    RETURN_IF_ERROR(CheckKeys(t, kWhere, kTreeKeys));

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
    RETURN_IF_ERROR(CheckKeys(t, "[[region]]", kRegionKeys));
    ASSIGN_OR_RETURN(Field name, Get(t, "name", "[[region]]", true));
    ASSIGN_OR_RETURN(region.name, Identifier(name, "region name"));
    const std::string where = "[[region]] " + Quoted(region.name);
    ASSIGN_OR_RETURN(Field bandwidth, Get(t, "wan_bandwidth", where, true));
    ASSIGN_OR_RETURN(region.wan_bps, Bandwidth(bandwidth));
    ASSIGN_OR_RETURN(Field latency, Get(t, "wan_latency", where, true));
    ASSIGN_OR_RETURN(region.wan_latency, Duration(latency, true));
    return region;
  }

  Result<NodeConfig> ParseNode(const toml::table& t, const TreeConfig& tree) const {
    NodeConfig node;
    node.line = LineOf(t);
    RETURN_IF_ERROR(CheckKeys(t, "[[node]]", kNodeKeys));
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
      } else {
        return Error(role.line,
                     role.name + " = " + Quoted(r) + ": must be \"source\" or \"receiver\"");
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
    RETURN_IF_ERROR(CheckKeys(t, kWhere, kTransportKeys));
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
    RETURN_IF_ERROR(CheckKeys(t, kWhere, kLinkKeys));
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

  std::string source_;
};

// "file:line: message", or "file: message" when the line is unknown (built in code).
Status ConfigError(const ClusterConfig& config, int line, std::string_view message) {
  std::string where = config.source_file.empty() ? "cluster config" : config.source_file.string();
  if (line > 0) where += ":" + std::to_string(line);
  return Status::InvalidArgument(where + ": " + std::string(message));
}

std::string NodeName(const NodeConfig& n) { return "[[node]] " + Quoted(n.id); }

// Manual parents: each must name another existing node, the source has none, and
// following them from any node must end at a node the planner places (one without a
// manual parent, or the source), never loop.
Status ValidateParents(const ClusterConfig& config) {
  std::map<std::string_view, const NodeConfig*> by_id;
  for (const NodeConfig& n : config.nodes) by_id.emplace(n.id, &n);
  for (const NodeConfig& n : config.nodes) {
    if (!n.parent) continue;
    const int line = n.parent_line > 0 ? n.parent_line : n.line;
    if (n.role == Role::kSource) {
      return ConfigError(config, line,
                         NodeName(n) + " is the source and cannot have a parent (parent = " +
                             Quoted(*n.parent) + ")");
    }
    if (*n.parent == n.id) {
      return ConfigError(
          config, line, NodeName(n) + ": parent = " + Quoted(*n.parent) + " names the node itself");
    }
    if (by_id.find(*n.parent) == by_id.end()) {
      return ConfigError(
          config, line,
          NodeName(n) + ": parent = " + Quoted(*n.parent) + " is not a node in this config");
    }
  }
  // Walk each chain of manual parents. Chains that loop are reported first, at the
  // first (in file order) node on the loop, so the message names the loop itself.
  Status unreachable = Status::Ok();
  for (const NodeConfig& n : config.nodes) {
    std::vector<const NodeConfig*> chain;
    std::set<std::string_view> seen;
    const NodeConfig* at = &n;
    while (at->parent && seen.insert(at->id).second) {
      chain.push_back(at);
      at = by_id.at(*at->parent);
    }
    if (!at->parent) continue;  // reached a planned node or the source
    // `at` is the first repeated node: the loop is the chain from `at` onwards.
    if (at == &n) {
      std::string path;
      for (const NodeConfig* c : chain) path += c->id + " -> ";
      path += n.id;
      return ConfigError(config, n.parent_line > 0 ? n.parent_line : n.line,
                         NodeName(n) + ": parent = " + Quoted(*n.parent) +
                             " makes a cycle of manual parents: " + path);
    }
    if (unreachable.ok()) {
      std::string path;
      for (const NodeConfig* c : chain) path += c->id + " -> ";
      path += at->id;
      unreachable = ConfigError(config, n.parent_line > 0 ? n.parent_line : n.line,
                                NodeName(n) + " (parent = " + Quoted(*n.parent) +
                                    ") is not reachable from the source: its parent chain " + path +
                                    " loops");
    }
  }
  return unreachable;
}

// A [[link]] side: "*", a node id, or "region:NAME" of a declared or used region.
bool SelectorMatches(std::string_view selector, const NodeConfig& node) {
  if (selector == "*") return true;
  if (selector.starts_with("region:")) return selector.substr(7) == node.region;
  return selector == node.id;
}

Status ValidateLinks(const ClusterConfig& config,
                     const std::map<std::string_view, const RegionConfig*>& regions) {
  for (const LinkRule& rule : config.links) {
    for (const std::string& selector : {rule.from, rule.to}) {
      if (selector == "*") continue;
      if (selector.starts_with("region:")) {
        const std::string_view region = std::string_view(selector).substr(7);
        const bool known = regions.contains(region) ||
                           std::any_of(config.nodes.begin(), config.nodes.end(),
                                       [&](const NodeConfig& n) { return n.region == region; });
        if (!known) {
          return ConfigError(config, rule.line,
                             "[[link]] " + Quoted(selector) + " names no region of any node");
        }
      } else if (config.FindNode(selector) == nullptr) {
        return ConfigError(
            config, rule.line,
            "[[link]] " + Quoted(selector) + " is not a node id (or \"region:NAME\", or \"*\")");
      }
    }
    if (rule.transports.empty()) {
      return ConfigError(config, rule.line, "[[link]] transports must not be empty");
    }
    for (const std::string& t : rule.transports) {
      const auto& known = KnownTransports();
      if (std::find(known.begin(), known.end(), t) == known.end()) {
        return ConfigError(config, rule.line, "[[link]] unknown transport " + Quoted(t));
      }
    }
  }
  return Status::Ok();
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
  }
  return "unknown";
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

Status ValidateClusterConfig(const ClusterConfig& config) {
  if (config.name.empty()) return ConfigError(config, 0, "[cluster] name must not be empty");
  if (!IsValidEnvName(config.auth_token_env)) {
    return ConfigError(config, 0,
                       "[cluster] auth_token_env = " + Quoted(config.auth_token_env) +
                           " is not an environment variable name");
  }
  const TreeConfig& tree = config.tree;
  if (tree.fanout && (*tree.fanout < 1 || *tree.fanout > kMaxFanout)) {
    return ConfigError(config, 0,
                       "[tree] fanout = " + std::to_string(*tree.fanout) + " is out of range [1, " +
                           std::to_string(kMaxFanout) + "]");
  }
  if (tree.window < 1 || tree.window > kMaxWindow) {
    return ConfigError(config, 0,
                       "[tree] window = " + std::to_string(tree.window) + " is out of range [1, " +
                           std::to_string(kMaxWindow) + "]");
  }
  if (tree.chunk_size < kMinChunkSize || tree.chunk_size > kMaxChunkSize) {
    return ConfigError(
        config, 0, "[tree] chunk_size = " + std::to_string(tree.chunk_size) + " is out of range");
  }
  if (tree.hop_latency.count() < 0 || tree.connect_timeout.count() <= 0 ||
      tree.idle_timeout.count() <= 0 || tree.commit_timeout.count() <= 0) {
    return ConfigError(config, 0, "[tree] latencies must be >= 0 and timeouts > 0");
  }

  if (config.nodes.empty()) return ConfigError(config, 0, "no [[node]] entries");
  std::map<std::string_view, const NodeConfig*> ids;
  std::map<std::string, std::string> listeners;  // host:port -> which node and transport
  const NodeConfig* source = nullptr;
  for (const NodeConfig& n : config.nodes) {
    if (!IsValidId(n.id)) {
      return ConfigError(config, n.line,
                         "[[node]] id = " + Quoted(n.id) + " is not a valid node id");
    }
    if (auto [it, inserted] = ids.emplace(n.id, &n); !inserted) {
      return ConfigError(config, n.line,
                         "[[node]] id = " + Quoted(n.id) + " is already used by the node at line " +
                             std::to_string(it->second->line));
    }
    if (n.host.empty()) return ConfigError(config, n.line, NodeName(n) + ": host is empty");
    if (n.port == 0) return ConfigError(config, n.line, NodeName(n) + ": port 0 is not allowed");
    // Host names are case-insensitive; "localhost" vs "127.0.0.1" is beyond a config
    // check and surfaces as a bind error instead. Each transport listens on its own
    // port (port + offset), and no two listeners may share one.
    for (const std::string& t : n.transports) {
      const uint32_t port = uint32_t{n.port} + TransportPortOffset(t);
      if (port > 65535) {
        return ConfigError(config, n.line,
                           NodeName(n) + ": port " + std::to_string(n.port) + " + " +
                               std::to_string(TransportPortOffset(t)) + " for its " + t +
                               " listener is above 65535");
      }
      const std::string address = LowerAscii(n.host) + ":" + std::to_string(port);
      const std::string what = NodeName(n) + " (" + t + ")";
      if (auto [it, inserted] = listeners.emplace(address, what); !inserted) {
        return ConfigError(config, n.line,
                           what + ": host:port " + n.host + ":" + std::to_string(port) +
                               " is already used by " + it->second +
                               " (a node listens on port + 1 for ucx, port + 2 for ofi)");
      }
    }
    if (!(n.uplink_bps > 0) || !std::isfinite(n.uplink_bps)) {
      return ConfigError(config, n.line, NodeName(n) + ": uplink must be greater than zero");
    }
    if (n.transports.empty()) {
      return ConfigError(config, n.line, NodeName(n) + ": transports must not be empty");
    }
    for (const std::string& t : n.transports) {
      const auto& known = KnownTransports();
      if (std::find(known.begin(), known.end(), t) == known.end()) {
        return ConfigError(config, n.line, NodeName(n) + ": unknown transport " + Quoted(t));
      }
    }
    if (n.role == Role::kSource) {
      if (source != nullptr) {
        return ConfigError(config, n.line,
                           NodeName(n) + " has role = \"source\" but " + NodeName(*source) +
                               " (line " + std::to_string(source->line) +
                               ") is already the source; a cluster has exactly one source");
      }
      source = &n;
    }
  }
  if (source == nullptr) {
    return ConfigError(config, 0, "no [[node]] has role = \"source\"; exactly one must");
  }

  std::map<std::string_view, const RegionConfig*> regions;
  for (const RegionConfig& r : config.regions) {
    if (!IsValidId(r.name)) {
      return ConfigError(config, r.line, "[[region]] name = " + Quoted(r.name) + " is not valid");
    }
    if (auto [it, inserted] = regions.emplace(r.name, &r); !inserted) {
      return ConfigError(config, r.line,
                         "[[region]] name = " + Quoted(r.name) + " is already declared at line " +
                             std::to_string(it->second->line));
    }
    if (!(r.wan_bps > 0) || !std::isfinite(r.wan_bps) || r.wan_latency.count() < 0) {
      return ConfigError(
          config, r.line,
          "[[region]] " + Quoted(r.name) + ": wan_bandwidth must be > 0 and wan_latency >= 0");
    }
  }
  std::set<std::string_view> used_regions;
  for (const NodeConfig& n : config.nodes) {
    if (!IsValidId(n.region)) {
      return ConfigError(config, n.line,
                         NodeName(n) + ": region = " + Quoted(n.region) + " is not a valid name");
    }
    used_regions.insert(n.region);
    if (n.region != source->region && regions.find(n.region) == regions.end()) {
      return ConfigError(config, n.line,
                         NodeName(n) + ": region = " + Quoted(n.region) +
                             " is not the source's region (" + Quoted(source->region) +
                             ") and has no [[region]] entry giving its wan_bandwidth and "
                             "wan_latency");
    }
  }
  for (const RegionConfig& r : config.regions) {
    if (used_regions.count(r.name) == 0) {
      return ConfigError(config, r.line,
                         "[[region]] name = " + Quoted(r.name) +
                             " is not used by any [[node]] (a misspelled region name?)");
    }
  }
  RETURN_IF_ERROR(ValidateLinks(config, regions));
  RETURN_IF_ERROR(ValidateObjectStoreConfig(config));
  return ValidateParents(config);
}

Result<ClusterConfig> ParseClusterConfig(std::string_view toml_text, std::string_view source_name) {
  Parser parser(source_name);
  toml::table root;
  try {
    root = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& e) {
    const auto& begin = e.source().begin;
    return Status::InvalidArgument(std::string(source_name) + ":" + std::to_string(begin.line) +
                                   ":" + std::to_string(begin.column) +
                                   ": TOML syntax error: " + std::string(e.description()));
  }
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
