#include "objstore/bucket_layout.h"

#include <fmt/core.h>

#include <charconv>
#include <sstream>

namespace deltacast::objstore {
namespace {

constexpr std::string_view kMagic = "deltacast-objstore";

std::string Hex16(uint64_t v) { return fmt::format("{:016x}", v); }

std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    lines.push_back(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return lines;
}

std::vector<std::string_view> Words(std::string_view line) {
  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    const size_t start = i;
    while (i < line.size() && line[i] != ' ') ++i;
    if (i > start) words.push_back(line.substr(start, i - start));
  }
  return words;
}

template <typename T>
bool ParseNumber(std::string_view s, T& out, int base = 10) {
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out, base);
  return ec == std::errc() && ptr == s.data() + s.size() && !s.empty();
}

// The first line must be "deltacast-objstore 1 <kind> ...": returns its other words.
Result<std::vector<std::string_view>> Header(std::string_view line, std::string_view kind,
                                             size_t extra) {
  auto w = Words(line);
  if (w.size() != 3 + extra || w[0] != kMagic || w[2] != kind) {
    return Status::Corrupt(fmt::format("object-store {}: first line '{}' is not '{} {} {}...'",
                                       kind, line, kMagic, kLayoutVersion, kind));
  }
  if (w[1] != std::to_string(kLayoutVersion)) {
    return Status::Corrupt(fmt::format("object-store {}: layout version {} (this build reads {})",
                                       kind, w[1], kLayoutVersion));
  }
  return std::vector<std::string_view>(w.begin() + 3, w.end());
}

}  // namespace

BucketLayout::BucketLayout(std::string prefix, std::string bridge) {
  while (prefix.ends_with('/')) prefix.pop_back();
  root_ = (prefix.empty() ? "" : prefix + "/") + bridge + "/";
}

std::string BucketLayout::Head() const { return root_ + "head"; }
std::string BucketLayout::Chain() const { return root_ + "chain"; }
std::string BucketLayout::RefitsFolder() const { return root_ + "refits/"; }
std::string BucketLayout::Refit(uint64_t id) const { return RefitsFolder() + Hex16(id) + "/"; }
std::string BucketLayout::Begin(uint64_t id) const { return Refit(id) + "begin"; }
std::string BucketLayout::ChunksFolder(uint64_t id) const { return Refit(id) + "chunks/"; }
std::string BucketLayout::Chunk(uint64_t id, uint32_t seq) const {
  return ChunksFolder(id) + fmt::format("{:08}", seq);
}
std::string BucketLayout::Manifest(uint64_t id) const { return Refit(id) + "manifest"; }
std::string BucketLayout::Sealed(uint64_t id) const { return Refit(id) + "sealed"; }
std::string BucketLayout::Prepared(uint64_t id) const { return Refit(id) + "prepared"; }
std::string BucketLayout::Failed(uint64_t id) const { return Refit(id) + "failed"; }
std::string BucketLayout::Decision(uint64_t id) const { return Refit(id) + "decision"; }
std::string BucketLayout::Outcome(uint64_t id) const { return Refit(id) + "outcome"; }
std::string BucketLayout::RefetchFolder(uint64_t id) const { return Refit(id) + "refetch/"; }
std::string BucketLayout::Refetch(uint64_t id, uint32_t seq) const {
  return RefetchFolder(id) + fmt::format("{:08}", seq);
}

std::string BucketLayout::RequestsFolder() const { return root_ + "requests/"; }
std::string BucketLayout::Request(uint64_t id) const { return RequestsFolder() + Hex16(id); }
std::string BucketLayout::AnswersFolder() const { return root_ + "answers/"; }
std::string BucketLayout::Answer(uint64_t id) const { return AnswersFolder() + Hex16(id); }

Result<uint64_t> BucketLayout::RequestIdOf(std::string_view key) {
  const size_t slash = key.rfind('/');
  const std::string_view tail = slash == std::string_view::npos ? key : key.substr(slash + 1);
  uint64_t id = 0;
  if (tail.size() != 16 || !ParseNumber(tail, id, 16)) {
    return Status::Corrupt(fmt::format("object-store key '{}' does not end in a request id", key));
  }
  return id;
}

Result<uint32_t> BucketLayout::SequenceOf(std::string_view key) {
  const size_t slash = key.rfind('/');
  const std::string_view tail = slash == std::string_view::npos ? key : key.substr(slash + 1);
  uint32_t seq = 0;
  if (tail.size() != 8 || !ParseNumber(tail, seq)) {
    return Status::Corrupt(fmt::format("object-store key '{}' does not end in a sequence", key));
  }
  return seq;
}

std::string EncodeHead(uint64_t refit_id) {
  return fmt::format("{} {} head {}\n", kMagic, kLayoutVersion, Hex16(refit_id));
}

Result<uint64_t> ParseHead(std::string_view text) {
  auto lines = Lines(text);
  if (lines.empty()) return Status::Corrupt("object-store head: empty");
  ASSIGN_OR_RETURN(auto w, Header(lines[0], "head", 1));
  uint64_t id = 0;
  if (w[0].size() != 16 || !ParseNumber(w[0], id, 16)) {
    return Status::Corrupt(fmt::format("object-store head: bad refit id '{}'", w[0]));
  }
  return id;
}

std::string EncodeSeal(const Seal& seal) {
  std::string out = fmt::format("{} {} sealed {} {}\n", kMagic, kLayoutVersion,
                                Hex16(seal.refit_id), seal.chunks.size());
  for (const SealEntry& e : seal.chunks)
    out += fmt::format("{} {} {:016x}\n", e.sequence, e.bytes, e.hash);
  return out;
}

Result<Seal> ParseSeal(std::string_view text) {
  auto lines = Lines(text);
  if (lines.empty()) return Status::Corrupt("object-store seal: empty");
  ASSIGN_OR_RETURN(auto w, Header(lines[0], "sealed", 2));
  Seal seal;
  size_t count = 0;
  if (!ParseNumber(w[0], seal.refit_id, 16) || !ParseNumber(w[1], count)) {
    return Status::Corrupt(fmt::format("object-store seal: bad first line '{}'", lines[0]));
  }
  if (lines.size() != count + 1) {
    return Status::Corrupt(
        fmt::format("object-store seal: says {} chunks but lists {}", count, lines.size() - 1));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    auto f = Words(lines[i]);
    SealEntry e;
    if (f.size() != 3 || !ParseNumber(f[0], e.sequence) || !ParseNumber(f[1], e.bytes) ||
        !ParseNumber(f[2], e.hash, 16)) {
      return Status::Corrupt(fmt::format("object-store seal: bad line {} '{}'", i + 1, lines[i]));
    }
    if (e.sequence != i - 1) {
      return Status::Corrupt(fmt::format("object-store seal: line {} lists chunk {}, expected {}",
                                         i + 1, e.sequence, i - 1));
    }
    seal.chunks.push_back(e);
  }
  return seal;
}

std::string EncodeChain(const std::vector<KeptRefit>& chain) {
  std::string out = fmt::format("{} {} chain\n", kMagic, kLayoutVersion);
  for (const KeptRefit& k : chain) {
    out += fmt::format("{} {} {} {} {}\n", k.base.ToHex(), k.target.ToHex(), k.partition_bytes,
                       k.chunks, Hex16(k.refit_id));
  }
  return out;
}

Result<std::vector<KeptRefit>> ParseChain(std::string_view text) {
  auto lines = Lines(text);
  if (lines.empty()) return Status::Corrupt("object-store chain: empty");
  RETURN_IF_ERROR(Header(lines[0], "chain", 0).status());
  std::vector<KeptRefit> chain;
  for (size_t i = 1; i < lines.size(); ++i) {
    auto f = Words(lines[i]);
    KeptRefit k;
    auto base = f.size() == 5 ? Digest128::FromHex(f[0]) : std::nullopt;
    auto target = f.size() == 5 ? Digest128::FromHex(f[1]) : std::nullopt;
    if (!base || !target || !ParseNumber(f[2], k.partition_bytes) || !ParseNumber(f[3], k.chunks) ||
        !ParseNumber(f[4], k.refit_id, 16)) {
      return Status::Corrupt(fmt::format("object-store chain: bad line {} '{}'", i + 1, lines[i]));
    }
    k.base = *base;
    k.target = *target;
    chain.push_back(k);
  }
  return chain;
}

}  // namespace deltacast::objstore
