#include "topology/units.h"

#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <span>
#include <utility>

namespace deltacast::topology {
namespace {

struct Unit {
  std::string_view name;
  double scale;
};

constexpr double kKi = 1024.0;
constexpr double kMi = 1024.0 * 1024.0;
constexpr double kGi = 1024.0 * 1024.0 * 1024.0;
constexpr double kTi = 1024.0 * 1024.0 * 1024.0 * 1024.0;

// An empty unit means plain bytes.
constexpr Unit kSizeUnits[] = {
    {"", 1},      {"B", 1},    {"KiB", kKi}, {"MiB", kMi}, {"GiB", kGi},
    {"TiB", kTi}, {"KB", 1e3}, {"kB", 1e3},  {"MB", 1e6},  {"GB", 1e9},
    {"TB", 1e12}, {"K", kKi},  {"M", kMi},   {"G", kGi},   {"T", kTi},
};

// Network bandwidths take decimal prefixes (1 Gbit = 10^9 bit), as link speeds do.
constexpr Unit kBandwidthUnits[] = {
    {"bit", 1},         {"Kbit", 1e3},      {"kbit", 1e3},   {"Mbit", 1e6},   {"Gbit", 1e9},
    {"Tbit", 1e12},     {"bit/s", 1},       {"Kbit/s", 1e3}, {"kbit/s", 1e3}, {"Mbit/s", 1e6},
    {"Gbit/s", 1e9},    {"Tbit/s", 1e12},   {"bps", 1},      {"Kbps", 1e3},   {"kbps", 1e3},
    {"Mbps", 1e6},      {"Gbps", 1e9},      {"Tbps", 1e12},  {"B/s", 8},      {"KB/s", 8e3},
    {"kB/s", 8e3},      {"MB/s", 8e6},      {"GB/s", 8e9},   {"TB/s", 8e12},  {"KiB/s", 8 * kKi},
    {"MiB/s", 8 * kMi}, {"GiB/s", 8 * kGi},
};

constexpr Unit kDurationUnits[] = {
    {"ms", 1},
    {"s", 1000},
    {"m", 60'000},
    {"h", 3'600'000},
};

// Splits "2.5 Gbit" into 2.5 and "Gbit". Fails on a missing or malformed number.
Result<std::pair<double, std::string_view>> SplitNumber(std::string_view text,
                                                        std::string_view what) {
  auto fail = [&](std::string_view why) {
    return Status::InvalidArgument("bad " + std::string(what) + " \"" + std::string(text) +
                                   "\": " + std::string(why));
  };
  if (text.empty()) return fail("empty");
  double value = 0;
  // from_chars accepts neither a leading '+' nor whitespace, which is what we want;
  // it does accept "inf" and "nan", which the caller rejects.
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data()) return fail("expected a number followed by a unit");
  std::string_view unit(end, text.data() + text.size() - end);
  if (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  if (!std::isfinite(value)) return fail("not a finite number");
  if (value < 0) return fail("negative");
  return std::pair{value, unit};
}

const Unit* FindUnit(std::span<const Unit> units, std::string_view name) {
  for (const Unit& u : units) {
    if (u.name == name) return &u;
  }
  return nullptr;
}

std::string Trimmed(double value) {
  // Up to three decimals, without trailing zeros: 10, 2.5, 1.125.
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3f", value);
  std::string s(buf);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

}  // namespace

Result<uint64_t> ParseSize(std::string_view text) {
  ASSIGN_OR_RETURN(auto parts, SplitNumber(text, "size"));
  const Unit* unit = FindUnit(kSizeUnits, parts.second);
  if (unit == nullptr) {
    return Status::InvalidArgument(
        "bad size \"" + std::string(text) + "\": unknown unit \"" + std::string(parts.second) +
        "\" (use B, KiB, MiB, GiB, TiB, K, M, G, T (binary) or KB, MB, GB, TB)");
  }
  const double bytes = parts.first * unit->scale;
  if (bytes > 0x1p62) {
    return Status::InvalidArgument("bad size \"" + std::string(text) + "\": too large");
  }
  if (bytes != std::floor(bytes)) {
    return Status::InvalidArgument("bad size \"" + std::string(text) +
                                   "\": not a whole number of bytes");
  }
  return static_cast<uint64_t>(bytes);
}

Result<double> ParseBandwidth(std::string_view text) {
  ASSIGN_OR_RETURN(auto parts, SplitNumber(text, "bandwidth"));
  const Unit* unit = FindUnit(kBandwidthUnits, parts.second);
  if (unit == nullptr) {
    return Status::InvalidArgument(
        "bad bandwidth \"" + std::string(text) + "\": unknown unit \"" + std::string(parts.second) +
        "\" (use bit, Kbit, Mbit, Gbit, Tbit or Gbps etc. for bits per second; B/s, KB/s, "
        "MB/s, GB/s, MiB/s, GiB/s for bytes per second)");
  }
  const double bps = parts.first * unit->scale;
  if (!(bps > 0) || !std::isfinite(bps)) {
    return Status::InvalidArgument("bad bandwidth \"" + std::string(text) +
                                   "\": must be greater than zero");
  }
  return bps;
}

Result<std::chrono::milliseconds> ParseDuration(std::string_view text) {
  ASSIGN_OR_RETURN(auto parts, SplitNumber(text, "duration"));
  const Unit* unit = FindUnit(kDurationUnits, parts.second);
  if (unit == nullptr) {
    return Status::InvalidArgument("bad duration \"" + std::string(text) +
                                   "\": unknown or missing unit \"" + std::string(parts.second) +
                                   "\" (use ms, s, m, h)");
  }
  const double ms = parts.first * unit->scale;
  if (ms > 365.0 * 24 * 3600 * 1000) {
    return Status::InvalidArgument("bad duration \"" + std::string(text) + "\": too long");
  }
  if (ms != std::floor(ms)) {
    return Status::InvalidArgument("bad duration \"" + std::string(text) +
                                   "\": not a whole number of milliseconds");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(ms));
}

std::string FormatSize(uint64_t bytes) {
  static constexpr std::array<std::string_view, 5> kNames = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  size_t i = 0;
  while (value >= 1024.0 && i + 1 < kNames.size()) {
    value /= 1024.0;
    ++i;
  }
  return Trimmed(value) + " " + std::string(kNames[i]);
}

std::string FormatBandwidth(double bits_per_second) {
  static constexpr std::array<std::string_view, 5> kNames = {"bit/s", "Kbit/s", "Mbit/s", "Gbit/s",
                                                             "Tbit/s"};
  double value = bits_per_second;
  size_t i = 0;
  while (value >= 1000.0 && i + 1 < kNames.size()) {
    value /= 1000.0;
    ++i;
  }
  return Trimmed(value) + " " + std::string(kNames[i]);
}

std::string FormatDuration(std::chrono::milliseconds duration) {
  const int64_t ms = duration.count();
  if (ms != 0 && ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  if (ms >= 1000) return Trimmed(static_cast<double>(ms) / 1000.0) + "s";
  return std::to_string(ms) + "ms";
}

std::string FormatSeconds(double seconds) {
  char buf[64];
  if (seconds < 1.0) {
    std::snprintf(buf, sizeof(buf), "%.1f ms", seconds * 1000.0);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f s", seconds);
  }
  return buf;
}

}  // namespace deltacast::topology
