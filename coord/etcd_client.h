// EtcdClient: the few etcd v3 calls the commit record needs (Range, Put, a
// create-if-absent transaction, DeleteRange, leases), over etcd's gRPC-JSON gateway
// (HTTP POST of JSON to /v3/kv/..., /v3/lease/...; keys and values base64) with
// libcurl. Generic: it knows nothing of deltacast's keys (coord/etcd_commit_records.h).
//
// Endpoints: a request goes to the endpoint that last answered, and moves on to the
// next one (in the configured order, wrapping) when it cannot connect or gets no
// answer; every call is safe to send twice (Put of the same value, a compare-and-set,
// a delete), so a request whose answer was lost is repeated elsewhere.
//
// Errors, which the commit protocol depends on:
//   kUnavailable  no endpoint could be reached: the request was sent nowhere, so
//                 nothing was written.
//   kTimeout      the request reached some member but no answer came back (or etcd
//                 answered that it could not finish it: no leader, its own timeout):
//                 it may or may not have taken effect.
//   kNotFound     the lease named does not exist (expired or revoked).
//   kPermissionDenied  etcd refused the credentials or the operation.
//   kInvalidArgument   etcd refused the request as malformed.
//   kCorrupt      an answer that is not the JSON the gateway sends.
// Each message names the endpoint(s) and etcd's own error text.
//
// Authentication: with a user set, the client gets a token from
// /v3/auth/authenticate and sends it with every request; a token etcd no longer
// accepts is replaced once per request.
//
// Thread safety: every method is thread-safe and blocks the calling thread for one
// request (at most request_timeout per endpoint tried). Connections are kept and
// reused across calls.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace deltacast::topology {
struct CoordinationConfig;
}

namespace deltacast::coord {

struct EtcdOptions {
  std::vector<std::string> endpoints;  // "http://127.0.0.1:2379", https too
  std::chrono::milliseconds request_timeout{2000};
  std::string ca_file;  // TLS: etcd's CA; empty: the system's
  std::string cert_file;
  std::string key_file;
  std::string user;  // empty: no authentication
  std::string password;
};

// The options of a [coordination] table, with the user and password read from the
// environment (DELTACAST_ETCD_USER / DELTACAST_ETCD_PASSWORD). kInvalidArgument when
// only one of the two is set.
Result<EtcdOptions> EtcdOptionsFromConfig(const topology::CoordinationConfig& config);

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct RangeOptions {
  // Empty: the key alone. Otherwise every key in [key, range_end); PrefixEnd(key)
  // makes it a prefix.
  std::string range_end;
  int64_t limit = 0;          // 0: no limit
  bool newest_first = false;  // sorted by mod_revision, descending (else by key)
  bool keys_only = false;
};

// The key just past every key that starts with `prefix` (etcd's range_end for a
// prefix).
std::string PrefixEnd(std::string_view prefix);

// One operation of a transaction's success branch (Txn below).
struct TxnOp {
  enum class Kind { kPut, kDelete, kRange };
  Kind kind = Kind::kPut;
  std::string key;
  std::string value;   // kPut
  int64_t lease = 0;   // kPut
  RangeOptions range;  // kRange; range_end for kDelete too
};

// What each operation of a transaction returned, in order.
struct TxnResult {
  bool succeeded = false;
  std::vector<std::vector<KeyValue>> ranges;  // one per kRange op of the branch that ran
};

class EtcdClient {
 public:
  // Checks the options (at least one endpoint); contacts nobody.
  static Result<std::unique_ptr<EtcdClient>> Create(EtcdOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // The keys of `key` (and its range). Linearisable: needs etcd's quorum.
  Result<std::vector<KeyValue>> Range(std::string_view key, const RangeOptions& options = {});

  // Writes key = value, attached to `lease` unless it is 0.
  Status Put(std::string_view key, std::string_view value, int64_t lease = 0);

  // Compare-and-set: writes key = value only if the key does not exist (its
  // create_revision is 0). Returns nullopt when this call wrote it (or an earlier
  // attempt of it whose answer was lost did), else the key as it stands.
  Result<std::optional<KeyValue>> CreateIfAbsent(std::string_view key, std::string_view value,
                                                 int64_t lease = 0);

  // Runs `ops` if every key in `must_exist` exists and every key in `must_be_absent`
  // does not; otherwise nothing (succeeded = false). Atomic.
  Result<TxnResult> Txn(const std::vector<std::string>& must_exist,
                        const std::vector<std::string>& must_be_absent,
                        const std::vector<TxnOp>& ops);

  // Deletes `key` (and its range); returns how many keys were deleted.
  Result<int64_t> DeleteRange(std::string_view key, std::string_view range_end = {});

  // A lease of `ttl_seconds` (at least 1); returns its id.
  Result<int64_t> LeaseGrant(int64_t ttl_seconds);
  // Renews the lease; returns its time to live in seconds. kNotFound when it is gone.
  Result<int64_t> LeaseKeepAlive(int64_t lease);
  // Ends the lease and deletes the keys attached to it. A lease already gone is OK.
  Status LeaseRevoke(int64_t lease);

  const EtcdOptions& options() const { return options_; }

 private:
  struct Impl;
  explicit EtcdClient(EtcdOptions options);

  EtcdOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deltacast::coord
