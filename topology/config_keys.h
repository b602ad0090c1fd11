// The cluster config's tables and keys (topology/cluster_config.h): every key the
// parser accepts, with its type, default and a one-line summary. This list is the
// single source: the parser's unknown-key checks take their key lists from it,
// `deltacast config --defaults` prints it, and a test holds docs/config.md to it
// (every key here is documented there, and the doc names no other), so the
// reference cannot drift from what the parser accepts.
//
// Thread safety: constant data and pure functions.
#pragma once

#include <span>
#include <string_view>
#include <vector>

namespace deltacast::topology {

// A top-level table of the config file: [name], or [[name]] when `array`.
struct ConfigTable {
  std::string_view name;
  bool array = false;     // an array of tables ([[node]])
  bool required = false;  // the file must have it
  std::string_view summary;
};

struct ConfigKey {
  std::string_view table;  // ConfigTable::name
  std::string_view key;
  // "string", "integer", "size", "duration", "bandwidth", "path", "array of strings",
  // or an enumeration written as its values ("\"all\" | \"available\"").
  std::string_view type;
  bool required = false;
  // The value as written in TOML when the key is absent ("\"4MiB\"", "8",
  // "[\"tcp\"]"); empty when required. When the default depends on other keys,
  // `default_literal` is false and this says what it is in words.
  std::string_view default_value;
  bool default_literal = true;
  std::string_view summary;
};

// Every table, in the order the reference documents them.
std::span<const ConfigTable> ConfigTables();

// Every key, grouped by table in ConfigTables() order.
std::span<const ConfigKey> ConfigKeys();

// The names of the keys of `table` (empty for an unknown table), in ConfigKeys()
// order: what the parser accepts there. The vector lives for the program.
const std::vector<std::string_view>& ConfigKeyNames(std::string_view table);

// The names of the top-level tables. The vector lives for the program.
const std::vector<std::string_view>& ConfigTableNames();

// The key `key` of `table`; nullptr if the parser does not accept it.
const ConfigKey* FindConfigKey(std::string_view table, std::string_view key);

}  // namespace deltacast::topology
