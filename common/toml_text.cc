#include "common/toml_text.h"

#include <algorithm>
#include <vector>

namespace deltacast::toml_text {
namespace {

std::string Quoted(std::string_view s) { return "\"" + std::string(s) + "\""; }

}  // namespace

int LineOf(const toml::node& node) { return static_cast<int>(node.source().begin.line); }

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

std::string_view NearestKey(std::string_view key, std::span<const std::string_view> known) {
  std::string_view best;
  size_t best_distance = 3;
  for (std::string_view k : known) {
    if (const size_t d = EditDistance(key, k); d < best_distance) {
      best_distance = d;
      best = k;
    }
  }
  return best;
}

const toml::key* FirstUnknownKey(const toml::table& table,
                                 std::span<const std::string_view> known) {
  for (auto&& [key, value] : table) {
    if (std::find(known.begin(), known.end(), key.str()) == known.end()) return &key;
  }
  return nullptr;
}

std::string UnknownKeyMessage(std::string_view key, std::string_view where,
                              std::span<const std::string_view> known) {
  std::string message = "unknown key " + Quoted(key) + " in " + std::string(where);
  if (std::string_view best = NearestKey(key, known); !best.empty()) {
    return message + " (did you mean " + Quoted(best) + "?)";
  }
  message += " (known keys:";
  for (std::string_view k : known) message += " " + std::string(k);
  return message + ")";
}

Status Reader::Error(int line, std::string_view message) const {
  std::string where = source_;
  if (line > 0) where += ":" + std::to_string(line);
  return Status::InvalidArgument(where + ": " + std::string(message));
}

Status Reader::CheckKeys(const toml::table& table, std::string_view where,
                         std::span<const std::string_view> known) const {
  const toml::key* unknown = FirstUnknownKey(table, known);
  if (unknown == nullptr) return Status::Ok();
  return Error(static_cast<int>(unknown->source().begin.line),
               UnknownKeyMessage(unknown->str(), where, known));
}

Result<toml::table> Reader::Parse(std::string_view text) const {
  try {
    return toml::parse(text, source_);
  } catch (const toml::parse_error& e) {
    const auto& begin = e.source().begin;
    return Status::InvalidArgument(source_ + ":" + std::to_string(begin.line) + ":" +
                                   std::to_string(begin.column) +
                                   ": TOML syntax error: " + std::string(e.description()));
  }
}

}  // namespace deltacast::toml_text
