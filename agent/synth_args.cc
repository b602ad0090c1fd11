// The synth command's text arguments: parameter counts ("500M", "1.5B") and rates
// ("3%", "0.03"), declared in agent/synth.h.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <iterator>
#include <string>
#include <system_error>
#include <utility>

#include "agent/synth.h"

namespace deltacast::agent {
namespace {

// Splits "1.5B" into a non-negative decimal number and what follows it. Only digits
// and one '.' are accepted: from_chars alone would also take "inf", "nan", "1e9".
bool ParseDecimal(std::string_view text, double& value, std::string_view& rest) {
  size_t i = 0;
  bool digits = false, dot = false;
  for (; i < text.size(); ++i) {
    if (text[i] >= '0' && text[i] <= '9') {
      digits = true;
    } else if (text[i] == '.' && !dot) {
      dot = true;
    } else {
      break;
    }
  }
  if (!digits) return false;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + i, value);
  if (ec != std::errc() || ptr != text.data() + i) return false;
  rest = text.substr(i);
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

Result<uint64_t> ParseParamCount(std::string_view text) {
  const std::string_view s = Trim(text);
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument("bad parameter count '" + std::string(text) +
                                   "': " + std::string(why) + " (e.g. 500M, 1.5B, 2000000)");
  };
  double value = 0;
  std::string_view suffix;
  if (!ParseDecimal(s, value, suffix)) return bad("not a number");
  // Case-insensitive: "7b" and "7B" both mean 7e9; G is accepted as giga.
  constexpr std::pair<char, double> kSuffixes[] = {
      {'k', 1e3}, {'m', 1e6}, {'b', 1e9}, {'g', 1e9}, {'t', 1e12}};
  double multiplier = 1;
  if (!suffix.empty()) {
    const auto* found = std::find_if(
        std::begin(kSuffixes), std::end(kSuffixes),
        [&](const auto& entry) { return suffix.size() == 1 && (suffix[0] | 0x20) == entry.first; });
    if (found == std::end(kSuffixes)) return bad("unknown suffix");
    multiplier = found->second;
  }
  if (suffix.empty() && s.find('.') != std::string_view::npos) {
    return bad("not a whole number of parameters");
  }
  // Rounded: 0.3 * 1e9 is 299999999.99999997 in binary floating point.
  const double count = std::round(value * multiplier);
  if (count < 1) return bad("must be positive");
  if (count > 9e18) return bad("too large");
  return static_cast<uint64_t>(count);
}

Result<double> ParseRate(std::string_view text) {
  const std::string_view s = Trim(text);
  double value = 0;
  std::string_view rest;
  if (!ParseDecimal(s, value, rest) || (!rest.empty() && rest != "%")) {
    return Status::InvalidArgument("bad rate '" + std::string(text) +
                                   "': expected a fraction or a percentage (0.03 or 3%)");
  }
  if (rest == "%") value /= 100;
  if (value > 1) {
    return Status::InvalidArgument("bad rate '" + std::string(text) + "': more than 100%");
  }
  return value;
}

}  // namespace deltacast::agent
