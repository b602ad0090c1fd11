// Names and limits shared by the cluster config's parser (cluster_config.cc) and its
// validator (cluster_config_validate.cc).
//
// Thread safety: pure functions.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <string>
#include <string_view>

namespace deltacast::topology::internal {

inline constexpr int kMaxWindow = 4096;
inline constexpr int kMaxFanout = 65535;
// More stripes than this gain nothing (each is a tree and a link per node) and make
// chunks of a stripe rare; topology/stripe_plan.h.
inline constexpr int kMaxStripes = 64;
inline constexpr size_t kMaxIdLength = 128;

inline std::string Quoted(std::string_view s) { return "\"" + std::string(s) + "\""; }

inline bool IsValidId(std::string_view id) {
  if (id.empty() || id.size() > kMaxIdLength) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

inline bool IsValidEnvName(std::string_view name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

inline std::string LowerAscii(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace deltacast::topology::internal
