// Sizes, bandwidths and durations as written in cluster configs and on the command
// line ("4MiB", "10Gbit", "80ms"), and their human-readable rendering.
//
// Units are case-sensitive because bits and bytes differ only in case:
//   size       B, KiB, MiB, GiB, TiB (binary); KB (or kB), MB, GB, TB (decimal);
//              K, M, G, T (binary, as coreutils reads them); a bare number is bytes.
//   bandwidth  bit, Kbit (or kbit), Mbit, Gbit, Tbit: decimal bits per second, "/s"
//              optional; bps, Kbps, Mbps, Gbps, Tbps: the same; B/s, KB/s, MB/s,
//              GB/s, TB/s: decimal bytes per second; KiB/s, MiB/s, GiB/s: binary.
//   duration   ms, s, m (minutes), h; must come to a whole number of milliseconds.
// The number may have a fraction ("2.5Gbit") and one space before the unit.
//
// Thread safety: pure functions; thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace deltacast::topology {

// Bytes. Fails (kInvalidArgument, message naming the text) on an unknown unit, a
// negative, fractional-byte or non-finite value, or more than 2^62 bytes.
Result<uint64_t> ParseSize(std::string_view text);

// Bits per second; always > 0 and finite.
Result<double> ParseBandwidth(std::string_view text);

// A duration >= 0, at most ~1 year.
Result<std::chrono::milliseconds> ParseDuration(std::string_view text);

// "4 MiB", "1.50 GiB", "512 B": binary units, up to three significant decimals.
std::string FormatSize(uint64_t bytes);
// "10 Gbit/s", "2.5 Gbit/s", "800 Mbit/s".
std::string FormatBandwidth(double bits_per_second);
// "80ms", "1.5s".
std::string FormatDuration(std::chrono::milliseconds duration);
// "12.34 s", "250 ms".
std::string FormatSeconds(double seconds);

}  // namespace deltacast::topology
