#include "topology/coordination_config.h"

#include <filesystem>
#include <string>

#include "topology/cluster_config.h"
#include "topology/config_keys.h"
#include "topology/internal/coordination_config_parse.h"
#include "topology/internal/section_parser.h"

namespace deltacast::topology::internal {
namespace {

// "http://host:port" or https, with a host and a port and nothing after them: etcd's
// gateway paths (/v3/...) are appended to it.
bool EndpointShape(std::string_view url) {
  std::string_view rest;
  if (url.starts_with("http://")) {
    rest = url.substr(7);
  } else if (url.starts_with("https://")) {
    rest = url.substr(8);
  } else {
    return false;
  }
  if (rest.ends_with("/")) rest.remove_suffix(1);
  const size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == rest.size()) return false;
  if (rest.find('/') != std::string_view::npos) return false;
  for (char c : rest.substr(colon + 1)) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

Status ParseCoordination(const toml::table& root, std::string_view source, ClusterConfig& config) {
  const toml::node* node = root.get("coordination");
  if (!node) return Status::Ok();
  SectionParser p(source, "[coordination]");
  const toml::table* t = node->as_table();
  if (!t) return p.Error(*node, "must be a table");
  // Said before the unknown-key check, which would only call them unknown.
  for (std::string_view key : {"user", "password"}) {
    if (const toml::node* n = t->get(key)) {
      return p.Error(*n, std::string(key) +
                             " must not be in the file: etcd's credentials come only from the "
                             "environment (" +
                             kEtcdUserEnv + ", " + kEtcdPasswordEnv + ")");
    }
  }
  RETURN_IF_ERROR(p.CheckKeys(*t, ConfigKeyNames("coordination")));
  CoordinationConfig c;
  c.line = static_cast<int>(t->source().begin.line);
  const toml::node* endpoints = t->get("endpoints");
  if (!endpoints) {
    return p.Error(*t, "is missing required key endpoints (a list of etcd client URLs)");
  }
  const toml::array* list = endpoints->as_array();
  if (!list || list->empty()) {
    return p.Error(*endpoints, "endpoints must be a non-empty list of URLs");
  }
  for (const toml::node& e : *list) {
    ASSIGN_OR_RETURN(std::string url, p.String(e, "endpoints[]"));
    if (!EndpointShape(url)) {
      return p.Error(
          e, "endpoints has \"" + url + "\": each must be http://host:port or https://host:port");
    }
    if (url.ends_with("/")) url.pop_back();
    c.endpoints.push_back(std::move(url));
  }
  if (const toml::node* n = t->get("prefix")) {
    ASSIGN_OR_RETURN(c.prefix, p.String(*n, "prefix"));
    if (!c.prefix.starts_with("/") || (c.prefix.size() > 1 && c.prefix.ends_with("/"))) {
      return p.Error(*n, "prefix = \"" + c.prefix +
                             "\" must start with / and not end with / (e.g. \"/deltacast\")");
    }
  }
  RETURN_IF_ERROR(p.Duration(*t, "source_timeout", c.source_timeout));
  RETURN_IF_ERROR(p.Duration(*t, "request_timeout", c.request_timeout));
  RETURN_IF_ERROR(p.Duration(*t, "poll_interval", c.poll_interval));
  // etcd's leases count whole seconds.
  if (c.source_timeout < std::chrono::seconds(1)) {
    return p.Error(*t->get("source_timeout"),
                   "source_timeout must be at least 1s (etcd leases count whole seconds)");
  }
  if (const toml::node* n = t->get("keep_records")) {
    const auto* i = n->as_integer();
    if (!i) return p.Error(*n, "keep_records must be an integer");
    if (i->get() < static_cast<int64_t>(kRecordsReadOnRestart)) {
      return p.Error(*n, "keep_records = " + std::to_string(i->get()) + " is below " +
                             std::to_string(kRecordsReadOnRestart) +
                             ", the records a restarted source reads (its lineage)");
    }
    c.keep_records = static_cast<size_t>(i->get());
  }
  const std::filesystem::path dir = std::filesystem::path(source).parent_path();
  std::filesystem::path ca, cert, key;
  RETURN_IF_ERROR(p.Path(*t, "ca_file", dir, ca));
  RETURN_IF_ERROR(p.Path(*t, "cert_file", dir, cert));
  RETURN_IF_ERROR(p.Path(*t, "key_file", dir, key));
  if (cert.empty() != key.empty()) {
    return p.Error(*t, "cert_file and key_file go together: set both or neither");
  }
  c.ca_file = ca.string();
  c.cert_file = cert.string();
  c.key_file = key.string();
  config.coordination = std::move(c);
  return Status::Ok();
}

}  // namespace deltacast::topology::internal
