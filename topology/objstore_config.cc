#include "topology/objstore_config.h"

#include <algorithm>
#include <set>

#include "topology/cluster_config.h"
#include "topology/config_keys.h"
#include "topology/internal/objstore_config_parse.h"
#include "topology/internal/section_parser.h"
#include "topology/tree_plan.h"

namespace deltacast::topology {
namespace {

bool EnvName(std::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

std::string Where(const ClusterConfig& config, int line) {
  return config.source_file.string() + (line > 0 ? ":" + std::to_string(line) : "") +
         ": [objstore] ";
}

}  // namespace

bool IsBridge(const ClusterConfig& config, std::string_view node_id) {
  if (!config.objstore) return false;
  const auto& b = config.objstore->bridges;
  return std::find(b.begin(), b.end(), node_id) != b.end();
}

Status ValidateObjectStoreConfig(const ClusterConfig& config) {
  if (!config.objstore) return Status::Ok();
  const ObjectStoreConfig& o = *config.objstore;
  std::set<std::string> seen;
  for (const std::string& id : o.bridges) {
    const NodeConfig* node = config.FindNode(id);
    if (!node) {
      return Status::InvalidArgument(Where(config, o.line) + "bridges names \"" + id +
                                     "\", which is not a [[node]]");
    }
    if (node->role != Role::kReceiver) {
      return Status::InvalidArgument(Where(config, o.line) + "bridges names \"" + id +
                                     "\", the source: a bridge is a receiver node");
    }
    if (!seen.insert(id).second) {
      return Status::InvalidArgument(Where(config, o.line) + "bridges names \"" + id + "\" twice");
    }
  }
  return Status::Ok();
}

Status CheckBridgePlan(const ClusterConfig& config, const TreePlan& plan) {
  if (!config.objstore) return Status::Ok();
  for (const std::string& id : config.objstore->bridges) {
    const PlannedNode* bridge = plan.Find(id);
    if (!bridge) continue;
    if (bridge->children.empty()) {
      return Status::InvalidArgument(
          "bridge " + id + " has no children: give its region's gateway parent = \"" + id + "\"");
    }
    for (const std::string& c : bridge->children) {
      const PlannedNode* child = plan.Find(c);
      if (child && child->region != bridge->region) {
        return Status::InvalidArgument("bridge " + id + " (region " + bridge->region +
                                       ") has child " + c + " in region " + child->region +
                                       ": a bridge serves its own region only");
      }
    }
  }
  return Status::Ok();
}

namespace internal {

Status ParseObjectStore(const toml::table& root, std::string_view source, ClusterConfig& config) {
  const toml::node* node = root.get("objstore");
  if (!node) return Status::Ok();
  SectionParser p(source, "[objstore]");
  const toml::table* t = node->as_table();
  if (!t) return p.Error(*node, "must be a table");
  RETURN_IF_ERROR(p.CheckKeys(*t, ConfigKeyNames("objstore")));
  ObjectStoreConfig o;
  o.line = static_cast<int>(t->source().begin.line);
  auto string_key = [&](std::string_view key, std::string& out, bool required) -> Status {
    const toml::node* n = t->get(key);
    if (!n) {
      return required ? p.Error(*t, "is missing required key " + std::string(key)) : Status::Ok();
    }
    ASSIGN_OR_RETURN(out, p.String(*n, key));
    if (out.empty()) return p.Error(*n, std::string(key) + " must not be empty");
    return Status::Ok();
  };
  RETURN_IF_ERROR(string_key("endpoint", o.endpoint, true));
  if (!o.endpoint.starts_with("http://") && !o.endpoint.starts_with("https://")) {
    return p.Error(*t->get("endpoint"),
                   "endpoint = \"" + o.endpoint + "\" must start with http:// or https://");
  }
  RETURN_IF_ERROR(string_key("bucket", o.bucket, true));
  RETURN_IF_ERROR(string_key("region", o.region, false));
  RETURN_IF_ERROR(string_key("prefix", o.prefix, false));
  RETURN_IF_ERROR(string_key("access_key_env", o.access_key_env, false));
  RETURN_IF_ERROR(string_key("secret_key_env", o.secret_key_env, false));
  for (std::string_view key : {"access_key_env", "secret_key_env"}) {
    const std::string& v = key == "access_key_env" ? o.access_key_env : o.secret_key_env;
    if (!EnvName(v)) {
      return p.Error(*t->get(key),
                     std::string(key) + " = \"" + v + "\" is not an environment variable name");
    }
  }
  const toml::node* bridges = t->get("bridges");
  if (!bridges) return p.Error(*t, "is missing required key bridges (a list of node ids)");
  const toml::array* list = bridges->as_array();
  if (!list || list->empty())
    return p.Error(*bridges, "bridges must be a non-empty list of node ids");
  for (const toml::node& b : *list) {
    ASSIGN_OR_RETURN(std::string id, p.String(b, "bridges[]"));
    o.bridges.push_back(std::move(id));
  }
  RETURN_IF_ERROR(p.Int(*t, "parallel", 1, 256, o.parallel));
  RETURN_IF_ERROR(p.Int(*t, "keep_refits", 0, 1024, o.keep_refits));
  RETURN_IF_ERROR(p.Duration(*t, "poll", o.poll));
  RETURN_IF_ERROR(p.Duration(*t, "poll_max", o.poll_max));
  if (o.poll_max < o.poll) {
    if (const toml::node* n = t->get("poll_max")) {
      return p.Error(*n, "poll_max must be at least poll");
    }
    o.poll_max = o.poll;  // a slow poll set alone: it is also the longest wait
  }
  RETURN_IF_ERROR(p.Duration(*t, "request_timeout", o.request_timeout));
  if (o.prefix.empty()) o.prefix = config.name;
  config.objstore = std::move(o);
  return Status::Ok();
}

}  // namespace internal
}  // namespace deltacast::topology
