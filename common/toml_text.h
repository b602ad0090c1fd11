// How this project reads its TOML files (cluster configs, layout descriptions,
// serving descriptions), in one place: every problem is reported as "SOURCE:LINE:
// message", a syntax error with its column too, and an unknown key with the nearest
// known one ("did you mean") or else the list of known keys. A library of its own
// (deltacast_toml), so that toml++ stays out of everything that does not parse TOML.
//
// toml++ reports syntax errors by throwing toml::parse_error (the Debian build has
// exceptions on); Parse catches them, and nothing here throws.
//
// Thread safety: pure functions and values.
#pragma once

#include <toml++/toml.h>

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"

namespace deltacast::toml_text {

int LineOf(const toml::node& node);
// "a string", "an array", ...: what a value is, for "must be X, got Y".
std::string_view TypeName(toml::node_type type);
// Levenshtein distance, for "did you mean" hints on misspelled keys.
size_t EditDistance(std::string_view a, std::string_view b);
// The known key within two edits of `key` (the nearest), or empty.
std::string_view NearestKey(std::string_view key, std::span<const std::string_view> known);
// The first key of `table` not in `known`, or null.
const toml::key* FirstUnknownKey(const toml::table& table, std::span<const std::string_view> known);
// `unknown key "k" in WHERE (did you mean "x"?)`, else with the known keys listed.
std::string UnknownKeyMessage(std::string_view key, std::string_view where,
                              std::span<const std::string_view> known);

// Reports problems in one file, named `source`.
class Reader {
 public:
  explicit Reader(std::string_view source) : source_(source) {}
  const std::string& source() const { return source_; }

  // "SOURCE:LINE: message"; LINE left out when 0 (the file as a whole).
  Status Error(int line, std::string_view message) const;
  Status Error(const toml::node& at, std::string_view message) const {
    return Error(LineOf(at), message);
  }
  // Fails on the first key of `table` that is not in `known` (UnknownKeyMessage).
  Status CheckKeys(const toml::table& table, std::string_view where,
                   std::span<const std::string_view> known) const;
  // `text` parsed; a syntax error as "SOURCE:LINE:COLUMN: TOML syntax error: ...".
  Result<toml::table> Parse(std::string_view text) const;

 private:
  std::string source_;
};

}  // namespace deltacast::toml_text
