// The [coordination] table of a cluster config: the etcd cluster that keeps each
// refit's commit record (relay/tree/commit_record.h; docs/recovery.md, "The commit
// record"). Without the table the source's local decision log is the only record.
//
//   [coordination]  endpoints (required: "http://host:port" or https URLs of etcd's
//                   client port, tried in order), prefix (of every key, default
//                   "/deltacast"; the cluster name follows it), source_timeout (time to
//                   live of a source's announcement: a source silent that long counts
//                   as lost, default "10s"), request_timeout (each etcd request, default
//                   "2s"), poll_interval (how often a prepared node waiting for a
//                   decision, and the standby coordinator, read the store, default
//                   "1s"), ca_file, cert_file, key_file (TLS to etcd: the CA that signed
//                   etcd's certificate, and a client certificate and key for etcd's
//                   --client-cert-auth; relative paths are relative to the config file),
//                   keep_records (how many of the newest records the source keeps when
//                   it prunes older ones, default 1000, at least kRecordsReadOnRestart).
// The etcd user and password come only from the environment (DELTACAST_ETCD_USER,
// DELTACAST_ETCD_PASSWORD); a user or password key in the file is an error.
//
// Thread safety: values and pure functions.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace deltacast::topology {

// How many of the newest commit records a restarted source reads (its lineage and
// the outcome of deltas children may hold): keep_records may not be smaller.
inline constexpr size_t kRecordsReadOnRestart = 64;

struct CoordinationConfig {
  std::vector<std::string> endpoints;
  std::string prefix = "/deltacast";
  std::chrono::milliseconds source_timeout{10000};
  std::chrono::milliseconds request_timeout{2000};
  std::chrono::milliseconds poll_interval{1000};
  // Records beyond the newest keep_records are deleted after each decision.
  size_t keep_records = 1000;
  std::string ca_file;    // empty: the system's CAs (https endpoints)
  std::string cert_file;  // client certificate; set together with key_file
  std::string key_file;
  int line = 0;  // of [coordination]
};

// Names of the environment variables that hold etcd's credentials.
inline constexpr const char* kEtcdUserEnv = "DELTACAST_ETCD_USER";
inline constexpr const char* kEtcdPasswordEnv = "DELTACAST_ETCD_PASSWORD";

}  // namespace deltacast::topology
