// The cluster config: which nodes exist, where they are, how fast their links are,
// and the relay tree's tuning. Every agent and the publisher read the same file, so
// it is validated strictly: a typo is an error, never a silently ignored key.
//
// The reference of every key, type and default is docs/config.md; the keys the
// parser accepts are listed once, in topology/config_keys.h.
//
// Format (TOML; configs/local-7.toml and configs/three-regions.toml are examples):
//   [cluster]   name (required), auth_token_env (default "DELTACAST_TOKEN": the NAME of
//               the environment variable that holds the shared token; the token itself
//               never appears in the file)
//   [tree]      optional; fanout ("auto" or integer >= 1), stripes ("auto" or integer
//               >= 1: the relay's stripes, topology/stripe_plan.h), chunk_size, window,
//               commit_policy ("all" | "available"), hop_latency, connect_timeout,
//               idle_timeout, commit_timeout, default_uplink
//   [[region]]  name, wan_bandwidth, wan_latency: the WAN link INTO that region;
//               flow_bandwidth (optional): what one TCP connection into it can get. Every
//               region a node uses, other than the source's, must be declared (the
//               planner needs its WAN figures, and it catches misspelled region names);
//               a declared region that no node uses is an error too, for the same reason.
//   [[node]]    id, host, port are required; role ("source" | "receiver", default
//               "receiver"; "sender": a trainer-side host in the source's region that roots
//               a stripe and holds no weights), region (default: the source's region),
//               uplink (default [tree] default_uplink: the node's egress, shared by every
//               flow it sends), transports (default ["tcp"]: the backends it listens on and
//               prefers, in order), parent (a manual override of the planner), gateway
//               (a receiver in a remote region that stripes may enter it through).
//   [transport] optional; ucx_provider (the UCX transports to use, UCX_TLS syntax, e.g.
//               "tcp" or "shm"; default "": UCX's own choice), ofi_provider (the libfabric
//               provider, e.g. "verbs;ofi_rxm", "efa", "tcp;ofi_rxm", "shm"; default "").
//   [[link]]    per-hop overrides of the transports, first match wins: from (the parent
//               side) and to (the child side), each a node id, "region:NAME" or "*"
//               (default); scope ("any" default, "intra-region", "cross-region");
//               transports (required, preference order). Example: ucx inside regions,
//               tcp across them: [[link]] scope = "cross-region", transports = ["tcp"].
//   [limits]    optional; what a peer may cost a node, before and after it proved who
//               it is (LimitsConfig below; each key has a safe default).
//   [security]  optional; TLS files (ca, cert, key; cert and key may contain "{node}",
//               replaced by the node id), which hops use TLS (tls = "cross-region"
//               (default), "all" or "none"), and the source's Ed25519 keys that sign
//               versions (signing_key: the private key, read by the source only;
//               verify_key: the public key every node checks BEGIN, chunks and
//               decisions against). Relative paths are relative to the config file.
//               `deltacast certs --config C --out DIR` writes every file.
//   [objstore]  optional; the bucket that bridge nodes' hops go through
//               (topology/objstore_config.h, docs/object-store.md).
//   [coordination] optional; the etcd cluster that keeps each refit's commit record
//               (topology/coordination_config.h, docs/recovery.md).
// A node listens on each of its transports at port + TransportPortOffset(transport).
// Units are those of topology/units.h.
//
// Every validation failure is kInvalidArgument with a message that starts with
// "FILE:LINE:" and names the key and the offending value.
//
// Thread safety: ClusterConfig is a value; concurrent const use is safe. The loaders
// are thread-safe. ReadAuthToken reads the environment (getenv).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "topology/coordination_config.h"
#include "topology/objstore_config.h"

namespace deltacast::topology {

// kSender: a trainer-side node that receives one stripe from the source over the
// source region's LAN and roots that stripe's tree; it holds no weights.
enum class Role { kSource, kReceiver, kSender };
enum class CommitPolicy {
  kAll,        // a version commits only when every node is PREPARED
  kAvailable,  // nodes that are down do not block; they catch up later
};

// How a receiver writes a refit's delta into its weights (docs/serving.md).
enum class ApplyMode {
  kOnArrival,  // each chunk as it arrives; PREPARED: the weights are at the target
  kStaged,     // checked as chunks arrive, written at COMMIT; PREPARED: a verified delta is held
};

// What a receiver's checkpoint directory holds on disk (docs/config.md, "checkpoint").
enum class CheckpointMode {
  kInPlace,   // the directory is the committed version: each commit is written back
  kSnapshot,  // a base snapshot plus the committed deltas; weights patched in memory
};

std::string_view RoleName(Role role);
std::string_view CheckpointModeName(CheckpointMode mode);
std::string_view CommitPolicyName(CommitPolicy policy);
std::string_view ApplyModeName(ApplyMode mode);

// Decoded records a staged node holds for its commit by default ([[node]] staged_memory).
inline constexpr uint64_t kDefaultStagedMemory = uint64_t{1} << 30;

// A snapshot store's defaults ([[node]] snapshot_every, snapshot_chain_percent,
// snapshot_rate; docs/config.md says what they cost).
inline constexpr uint32_t kDefaultSnapshotEvery = 50;
inline constexpr uint32_t kDefaultSnapshotChainPercent = 100;
inline constexpr uint64_t kDefaultSnapshotRate = uint64_t{256} << 20;

inline constexpr uint64_t kMinChunkSize = uint64_t{4} << 10;
inline constexpr uint64_t kMaxChunkSize = uint64_t{1} << 30;

struct NodeConfig {
  std::string id;  // [A-Za-z0-9._-]+, unique
  std::string host;
  uint16_t port = 0;
  std::string region;
  Role role = Role::kReceiver;
  double uplink_bps = 0;                // egress bandwidth, bits per second
  std::vector<std::string> transports;  // preference order; names from KnownTransports()
  std::optional<std::string> parent;    // manual override of the planned parent
  bool gateway = false;                 // a gateway candidate of its (remote) region
  ApplyMode apply_mode = ApplyMode::kOnArrival;
  // Staged: memory for records decoded ahead of the commit; the rest decode in the pause.
  uint64_t staged_memory = kDefaultStagedMemory;
  // With --store: in place, or a snapshot and the committed chain (relay/store/snapshot_store.h).
  CheckpointMode checkpoint = CheckpointMode::kInPlace;
  uint32_t snapshot_every = kDefaultSnapshotEvery;                 // refits; 0: by size only
  uint32_t snapshot_chain_percent = kDefaultSnapshotChainPercent;  // of the model; 0: by count
  uint64_t snapshot_rate = kDefaultSnapshotRate;  // bytes/s a snapshot build copies; 0: any
  int line = 0;         // line of this node's [[node]] header; 0 if built in code
  int parent_line = 0;  // line of its `parent` key; 0 if none
};

enum class LinkScope { kAny, kIntraRegion, kCrossRegion };

// A [[link]] rule: which transports hops matching it may use.
struct LinkRule {
  std::string from = "*";  // parent side: a node id, "region:NAME" or "*"
  std::string to = "*";    // child side, same forms
  LinkScope scope = LinkScope::kAny;
  std::vector<std::string> transports;  // preference order
  int line = 0;
};

// Backend settings shared by every node ([transport]).
struct TransportSettings {
  std::string ucx_provider;  // "" = UCX's own choice
  std::string ofi_provider;  // "" = libfabric's first reliable-datagram provider
};

struct RegionConfig {
  std::string name;
  double wan_bps = 0;  // bandwidth of the WAN link into this region, bits per second
  // What one flow (TCP connection) into the region can get, bits per second; 0: no
  // per-flow cap (a flow can use all of wan_bps).
  double flow_bps = 0;
  std::chrono::milliseconds wan_latency{0};  // one-way
  int line = 0;

  // The most one flow into the region can carry: flow_bps capped by wan_bps.
  double FlowCapBps() const { return flow_bps > 0 ? std::min(flow_bps, wan_bps) : wan_bps; }
};

struct TreeConfig {
  std::optional<int> fanout;   // nullopt: "auto" (the planner picks it)
  std::optional<int> stripes;  // nullopt: "auto" (topology/stripe_plan.h picks S)
  int stripes_line = 0;        // line of the `stripes` key; 0 if absent or built in code
  uint64_t chunk_size = uint64_t{4} << 20;
  int window = 8;  // chunks in flight per link
  CommitPolicy commit_policy = CommitPolicy::kAll;
  std::chrono::milliseconds hop_latency{1};
  std::chrono::milliseconds connect_timeout{10'000};
  std::chrono::milliseconds idle_timeout{30'000};
  std::chrono::milliseconds commit_timeout{120'000};
  double default_uplink_bps = 10e9;

  // How often an idle link carries a heartbeat: once a second, and at least three
  // times per idle timeout, so a short timeout never fires on a quiet, live link.
  std::chrono::milliseconds HeartbeatInterval() const {
    return std::min(std::chrono::milliseconds(1000), idle_timeout / 3);
  }
};

// [limits]. Before a peer has proved the cluster token (and, over TLS, its
// certificate) it may cost a node only a pending-handshake slot and a small frame;
// these bound how many such peers, for how long.
struct LimitsConfig {
  // A link that has not completed the relay handshake by then is dropped.
  std::chrono::milliseconds handshake_timeout{5000};
  // Links of a node still in the handshake (transport or relay), over all peers
  // and per peer address; connections beyond are closed at once.
  int max_pending_handshakes = 64;
  int max_handshakes_per_address = 8;
  // Open links per peer address, authenticated or not (a whole cluster on one host
  // needs room: every local child of a node shares 127.0.0.1).
  int max_connections_per_address = 64;
  // Largest frame read before the handshake completes; larger ones wait unread
  // until the peer is authenticated, so announcing a large frame allocates nothing.
  uint64_t handshake_max_message = uint64_t{128} << 10;
  // Received buffers kept for reuse, and how long an unused one is kept.
  uint64_t receive_pool = uint64_t{256} << 20;
  std::chrono::milliseconds receive_pool_idle{2000};
};

// Which hops run TLS (tcp only; RDMA hops rely on the token's mutual proof).
enum class TlsHops { kNone, kCrossRegion, kAll };
std::string_view TlsHopsName(TlsHops hops);

// [security]. Empty paths: not configured.
struct SecurityConfig {
  TlsHops tls = TlsHops::kCrossRegion;
  std::filesystem::path ca;           // the cluster CA's certificate (PEM)
  std::filesystem::path cert;         // a node's certificate; "{node}" = its id
  std::filesystem::path key;          // a node's private key; "{node}" = its id
  std::filesystem::path signing_key;  // the source's Ed25519 private key (PEM)
  std::filesystem::path verify_key;   // its public key (PEM): nodes verify versions with it
  // Where producers (docs/producers.md) sit for tls = "cross-region"; empty: the
  // source's region (the trainer's own network).
  std::string producer_region;
  int line = 0;  // of [security]; 0 if absent

  bool tls_files() const { return !ca.empty() && !cert.empty() && !key.empty(); }
  // cert / key with "{node}" replaced.
  std::filesystem::path CertFor(std::string_view node_id) const;
  std::filesystem::path KeyFor(std::string_view node_id) const;
};

struct ClusterConfig {
  std::string name;
  std::string auth_token_env = "DELTACAST_TOKEN";
  TreeConfig tree;
  std::vector<RegionConfig> regions;  // in file order
  std::vector<NodeConfig> nodes;      // in file order
  std::vector<LinkRule> links;        // in file order (first match wins)
  TransportSettings transport;
  LimitsConfig limits;
  SecurityConfig security;
  std::optional<ObjectStoreConfig> objstore;       // [objstore] (topology/objstore_config.h)
  std::optional<CoordinationConfig> coordination;  // [coordination] (coordination_config.h)
  std::filesystem::path source_file;  // for messages; the name given to ParseClusterConfig

  // nullptr when no node has that id. The pointer lives as long as `nodes` is unchanged.
  const NodeConfig* FindNode(std::string_view id) const;
  const RegionConfig* FindRegion(std::string_view name) const;
  // The node whose role is kSource; nullptr only in an unvalidated config.
  const NodeConfig* Source() const;
};

// Transport names a node may list: "tcp", "ucx", "ofi", "inproc".
const std::vector<std::string_view>& KnownTransports();

// How far above the node's port a backend listens: tcp 0, ucx 1, ofi 2 (inproc 0), so
// one node can listen on several backends with one configured port.
uint16_t TransportPortOffset(std::string_view transport);

// The transports the hop parent -> child may use, in preference order: the first
// [[link]] rule matching the hop (else the child's own list), keeping those both
// nodes list. Empty when they share none (PlanTree rejects such a plan).
std::vector<std::string> HopTransports(const ClusterConfig& config, const NodeConfig& parent,
                                       const NodeConfig& child);

// Whether the hop parent -> child runs TLS under [security] tls.
bool HopUsesTls(const ClusterConfig& config, const NodeConfig& parent, const NodeConfig& child);

// The region producers sit in: [security] producer_region, else the source's.
std::string ProducerRegion(const ClusterConfig& config);
// Whether the links between producers and the root (the source) run TLS under
// [security] tls, as a hop from the source to a node in ProducerRegion would.
bool ProducerLinksUseTls(const ClusterConfig& config);

// Reads and validates a config file. kNotFound / kIoError if it cannot be read.
Result<ClusterConfig> LoadClusterConfig(const std::filesystem::path& path);

// Parses and validates TOML text; `source_name` prefixes messages and becomes
// source_file.
Result<ClusterConfig> ParseClusterConfig(std::string_view toml, std::string_view source_name);

// The checks that span entries (unique ids and addresses, exactly one source, known
// regions, manual parents that name real nodes and leave every node reachable from the
// source without cycles). ParseClusterConfig runs it; call it on configs built in code.
Status ValidateClusterConfig(const ClusterConfig& config);

// The shared token from the environment variable the config names.
// kFailedPrecondition if that variable is unset or empty.
Result<std::string> ReadAuthToken(const ClusterConfig& config);

}  // namespace deltacast::topology
