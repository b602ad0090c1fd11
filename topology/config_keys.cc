#include "topology/config_keys.h"

#include <map>
#include <string>

namespace deltacast::topology {
namespace {

// Defaults here must equal the parser's (cluster_config.h, objstore_config.h,
// coordination_config.h):
// tests/topology/config_keys_test.cc writes each literal default into a config
// and checks the parsed value does not change.
constexpr ConfigTable kTables[] = {
    {"cluster", false, true, "the cluster's name and where the shared token comes from"},
    {"tree", false, false, "the relay tree's shape, pacing, commit policy and timeouts"},
    {"region", true, false, "the WAN link into each region other than the source's"},
    {"node", true, true, "every node: the source and the receivers"},
    {"transport", false, false, "settings of the UCX and libfabric backends"},
    {"link", true, false, "per-hop transport overrides, first match wins"},
    {"limits", false, false, "what a peer may cost a node, before and after it authenticates"},
    {"security", false, false, "TLS certificates and the source's signing keys"},
    {"objstore", false, false, "the S3-compatible bucket that bridge nodes' hops go through"},
    {"coordination", false, false, "the etcd cluster that keeps each refit's commit record"},
};

constexpr ConfigKey kKeys[] = {
    // [cluster]
    {"cluster", "name", "string", true, "", true, "the cluster's name (logs; [objstore] prefix)"},
    {"cluster", "auth_token_env", "string", false, "\"DELTACAST_TOKEN\"", true,
     "NAME of the environment variable holding the shared token"},
    // [tree]
    {"tree", "fanout", "\"auto\" | integer", false, "\"auto\"", true,
     "children per relay inside a region; auto: the planner's choice"},
    {"tree", "stripes", "\"auto\" | integer", false, "\"auto\"", true,
     "stripes of the delta, each over its own tree from its own root (1-64); auto: the number "
     "of senders (1 without), capped by the fewest gateways of a region that lists several"},
    {"tree", "chunk_size", "size", false, "\"4MiB\"", true,
     "a chunk is sent once it holds this many bytes (4KiB-1GiB)"},
    {"tree", "window", "integer", false, "8", true, "chunks in flight per link (1-4096)"},
    {"tree", "commit_policy", "\"all\" | \"available\"", false, "\"all\"", true,
     "all: every node must prepare; available: nodes that are away do not block"},
    {"tree", "hop_latency", "duration", false, "\"1ms\"", true,
     "one-way latency of a hop inside a region (planner model)"},
    {"tree", "connect_timeout", "duration", false, "\"10s\"", true,
     "how long a missing child is waited for before it is reported"},
    {"tree", "idle_timeout", "duration", false, "\"30s\"", true,
     "a link silent this long is dropped and resumed"},
    {"tree", "commit_timeout", "duration", false, "\"120s\"", true,
     "BEGIN to every node PREPARED, else the source aborts"},
    {"tree", "default_uplink", "bandwidth", false, "\"10Gbit\"", true,
     "egress bandwidth of a node that sets no uplink (planner model)"},
    // [[region]]
    {"region", "name", "string", true, "", true, "the region's name, as nodes' region names it"},
    {"region", "wan_bandwidth", "bandwidth", true, "", true, "bandwidth of the WAN link into it"},
    {"region", "wan_latency", "duration", true, "", true, "one-way latency of that link"},
    {"region", "flow_bandwidth", "bandwidth", false, "wan_bandwidth", false,
     "what one flow (TCP connection) into it can get; stripes cross as several flows"},
    // [[node]]
    {"node", "id", "string", true, "", true, "unique id (A-Z a-z 0-9 . _ -, 1-128 characters)"},
    {"node", "host", "string", true, "", true, "host name or address it listens on"},
    {"node", "port", "integer", true, "", true,
     "tcp port; ucx listens on port + 1, ofi on port + 2"},
    {"node", "region", "string", false, "the source's region (\"default\" if it has none)", false,
     "the region it sits in"},
    {"node", "role", "\"source\" | \"receiver\" | \"sender\"", false, "\"receiver\"", true,
     "exactly one node is the source; a sender (source's region) roots a stripe, holds no "
     "weights"},
    {"node", "uplink", "bandwidth", false, "[tree] default_uplink", false,
     "its egress bandwidth (planner model: fast uplinks relay)"},
    {"node", "transports", "array of strings", false, "[\"tcp\"]", true,
     "backends it listens on and prefers, in order: tcp, ucx, ofi, inproc"},
    {"node", "parent", "string", false, "the planner's choice", false, "manual parent: a node id"},
    {"node", "gateway", "boolean", false, "false", true,
     "a receiver in a remote region that stripes may cross the WAN to; list several"},
    {"node", "apply", "\"on-arrival\" | \"staged\"", false, "\"on-arrival\"", true,
     "a receiver's writes: each chunk as it comes, or all at COMMIT (an engine serving from the "
     "weights pauses only for that; docs/serving.md)"},
    {"node", "staged_memory", "size", false, "\"1GiB\"", true,
     "staged: memory for records decoded before COMMIT; what does not fit decodes in the pause"},
    {"node", "checkpoint", "\"in-place\" | \"snapshot\"", false, "\"in-place\"", true,
     "a --store directory kept current on disk (each commit written back: O(model) per refit), "
     "or a snapshot plus the committed deltas, patched in memory (O(delta); docs/config.md)"},
    {"node", "snapshot_every", "integer", false, "50", true,
     "snapshot store: a new snapshot after this many refits (0: by chain size only)"},
    {"node", "snapshot_chain_percent", "integer", false, "100", true,
     "snapshot store: a new snapshot once the chain's files pass this % of the model (0: by "
     "count only)"},
    {"node", "snapshot_rate", "size", false, "\"256MiB\"", true,
     "snapshot store: bytes per second a snapshot build copies (0: unlimited)"},
    // [transport]
    {"transport", "ucx_provider", "string", false, "\"\"", true,
     "UCX transports (UCX_TLS syntax); empty: UCX's choice"},
    {"transport", "ofi_provider", "string", false, "\"\"", true,
     "libfabric provider; empty: libfabric's first reliable-datagram provider"},
    // [[link]]
    {"link", "from", "string", false, "\"*\"", true,
     "parent side of the hop: a node id, \"region:NAME\" or \"*\""},
    {"link", "to", "string", false, "\"*\"", true, "child side of the hop, same forms"},
    {"link", "scope", "\"any\" | \"intra-region\" | \"cross-region\"", false, "\"any\"", true,
     "which hops the rule applies to"},
    {"link", "transports", "array of strings", true, "", true,
     "transports such hops may use, in preference order"},
    // [limits]
    {"limits", "handshake_timeout", "duration", false, "\"5s\"", true,
     "a link not through the handshake by then is dropped"},
    {"limits", "max_pending_handshakes", "integer", false, "64", true,
     "links in the handshake at once, over all peers"},
    {"limits", "max_handshakes_per_address", "integer", false, "8", true,
     "links in the handshake at once from one address"},
    {"limits", "max_connections_per_address", "integer", false, "64", true,
     "open links from one address"},
    {"limits", "handshake_max_message", "size", false, "\"128KiB\"", true,
     "largest frame read before the peer authenticates"},
    {"limits", "receive_pool", "size", false, "\"256MiB\"", true,
     "received buffers kept for reuse"},
    {"limits", "receive_pool_idle", "duration", false, "\"2s\"", true,
     "how long an unused buffer is kept"},
    // [security]
    {"security", "tls", "\"cross-region\" | \"all\" | \"none\"", false, "\"cross-region\"", true,
     "which tcp hops run TLS 1.3 with mutual certificates"},
    {"security", "ca", "path", false, "not set", false, "the cluster CA's certificate (PEM)"},
    {"security", "cert", "path", false, "not set", false,
     "a node's certificate; {node} is replaced by its id"},
    {"security", "key", "path", false, "not set", false,
     "a node's private key; {node} is replaced by its id"},
    {"security", "signing_key", "path", false, "not set", false,
     "the source's Ed25519 private key: versions go out signed"},
    {"security", "verify_key", "path", false, "not set", false,
     "its public key: nodes check BEGIN, chunks and decisions"},
    {"security", "producer_region", "string", false, "the source's region", false,
     "where producers sit for tls = \"cross-region\""},
    // [objstore]
    {"objstore", "endpoint", "string", true, "", true, "http:// or https:// URL of the S3 service"},
    {"objstore", "bucket", "string", true, "", true, "the bucket"},
    {"objstore", "region", "string", false, "\"us-east-1\"", true, "SigV4 signing region"},
    {"objstore", "prefix", "string", false, "[cluster] name", false, "prefix of every key"},
    {"objstore", "access_key_env", "string", false, "\"DELTACAST_S3_ACCESS_KEY\"", true,
     "NAME of the environment variable holding the access key"},
    {"objstore", "secret_key_env", "string", false, "\"DELTACAST_S3_SECRET_KEY\"", true,
     "NAME of the environment variable holding the secret key"},
    {"objstore", "bridges", "array of strings", true, "", true,
     "receiver nodes whose hop from their parent is the bucket"},
    {"objstore", "parallel", "integer", false, "8", true, "S3 requests in flight (1-256)"},
    {"objstore", "keep_refits", "integer", false, "4", true,
     "committed refits kept in the bucket for catch-up (0-1024)"},
    {"objstore", "poll", "duration", false, "\"20ms\"", true,
     "how often the bucket is asked while an object is due"},
    {"objstore", "poll_max", "duration", false, "\"250ms\"", true,
     "the longest wait between polls when idle (at least poll)"},
    {"objstore", "request_timeout", "duration", false, "\"30s\"", true,
     "how long a FETCH passed up through the bucket waits for its answer"},
    // [coordination]
    {"coordination", "endpoints", "array of strings", true, "", true,
     "etcd client URLs (http://host:port or https), tried in order"},
    {"coordination", "prefix", "string", false, "\"/deltacast\"", true,
     "prefix of every key; the cluster name follows it"},
    {"coordination", "source_timeout", "duration", false, "\"10s\"", true,
     "a source silent this long counts as lost (its announcement's time to live)"},
    {"coordination", "request_timeout", "duration", false, "\"2s\"", true,
     "how long one etcd request may take"},
    {"coordination", "poll_interval", "duration", false, "\"1s\"", true,
     "how often a prepared node awaiting a decision, and the standby coordinator, read etcd"},
    {"coordination", "keep_records", "integer", false, "1000", true,
     "records kept when the source prunes older ones (at least 64)"},
    {"coordination", "ca_file", "path", false, "not set", false,
     "CA certificate that signed etcd's (https endpoints); unset: the system's"},
    {"coordination", "cert_file", "path", false, "not set", false,
     "client certificate for etcd (with key_file)"},
    {"coordination", "key_file", "path", false, "not set", false, "its private key"},
};

}  // namespace

std::span<const ConfigTable> ConfigTables() { return kTables; }

std::span<const ConfigKey> ConfigKeys() { return kKeys; }

const std::vector<std::string_view>& ConfigKeyNames(std::string_view table) {
  static const auto* const kByTable = [] {
    auto* by_table = new std::map<std::string, std::vector<std::string_view>, std::less<>>;
    for (const ConfigTable& t : kTables) (*by_table)[std::string(t.name)];
    for (const ConfigKey& k : kKeys) (*by_table)[std::string(k.table)].push_back(k.key);
    return by_table;
  }();
  static const std::vector<std::string_view> kNone;
  const auto it = kByTable->find(table);
  return it == kByTable->end() ? kNone : it->second;
}

const std::vector<std::string_view>& ConfigTableNames() {
  static const std::vector<std::string_view> kNames = [] {
    std::vector<std::string_view> names;
    for (const ConfigTable& t : kTables) names.push_back(t.name);
    return names;
  }();
  return kNames;
}

const ConfigKey* FindConfigKey(std::string_view table, std::string_view key) {
  for (const ConfigKey& k : kKeys) {
    if (k.table == table && k.key == key) return &k;
  }
  return nullptr;
}

}  // namespace deltacast::topology
