// What a cluster config means once its defaults are filled in
// (`deltacast config --explain`), and the reference of every key
// (`deltacast config --defaults`), both built from topology/config_keys.h.
//
// Thread safety: pure functions.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "common/status.h"
#include "topology/cluster_config.h"

namespace deltacast::topology {

enum class ExplainFormat {
  kToml,  // TOML that parses to the same config; "# default" marks what the file left out
  kJson,  // one object: the tables as TOML would hold them, plus "defaulted"
};

// The effective config of `toml`: every key of every table the config has, with
// the value the parser derived. Values are written so the output parses back to
// the same config (sizes as "4MiB" or "<n>B", durations in s or ms, bandwidths
// in bit units, [security] paths absolute). Keys without a value (a node's
// parent, unset paths) appear as comments. Fails exactly as ParseClusterConfig
// fails, with its FILE:LINE messages.
Result<std::string> ExplainClusterConfig(std::string_view toml, std::string_view source_name,
                                         ExplainFormat format);

// The same for a file; kNotFound / kIoError if it cannot be read.
Result<std::string> ExplainClusterConfigFile(const std::filesystem::path& path,
                                             ExplainFormat format);

// Every table and key with its type, default and summary: commented TOML, or a
// JSON array of {table, key, type, required, default, summary}.
std::string ConfigReference(ExplainFormat format);

// A size, duration or bandwidth written exactly, in the config's units: "4MiB",
// "4097B"; "120s", "1500ms"; "10Gbit", "2.5Gbit".
std::string ExactSize(uint64_t bytes);
std::string ExactDuration(std::chrono::milliseconds duration);
std::string ExactBandwidth(double bits_per_second);

}  // namespace deltacast::topology
