#include "apply/checkpoint_state.h"

#include <sys/stat.h>

#include <cerrno>
#include <string>

#include "common/disk_seam.h"
#include "common/file_util.h"
#include "common/log.h"

namespace deltacast::apply {
namespace {

// The manifest cache: magic, u16 format version, u16 reserved, the file stamps,
// the serialized manifest, and an xxh3-64 of everything before it. Format 1 had no
// version field and held xxh3-64 partition hashes; it started with kCacheMagicV1.
constexpr uint32_t kCacheMagic = 0x4D434344;    // "DCCM"
constexpr uint32_t kCacheMagicV1 = 0x43434344;  // "DCCC"
constexpr uint16_t kCacheVersion = 2;
constexpr std::string_view kManifestFile = "manifest.bin";
constexpr std::string_view kInflightFile = "inflight";
constexpr std::string_view kActiveFile = "active";
constexpr std::string_view kAppliedFile = "applied";
constexpr std::string_view kPreparedFile = "prepared";
constexpr std::string_view kUnflushedFile = "unflushed";

// What identifies a file's contents cheaply: if none of these changed, neither did
// the bytes, as long as writers go through the file system (mmap writes update
// mtime by the next msync).
struct FileStamp {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t inode = 0;
};

Result<FileStamp> Stamp(const std::filesystem::path& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Status::FromErrno(errno, "stat " + path.string());
  return FileStamp{static_cast<uint64_t>(st.st_size),
                   int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec,
                   static_cast<uint64_t>(st.st_ino)};
}

Result<std::vector<std::byte>> StampBlock(const CheckpointDirStore& store) {
  std::vector<std::byte> out;
  ByteWriter w(out);
  w.Put<uint32_t>(kCacheMagic);
  w.Put<uint16_t>(kCacheVersion);
  w.Put<uint16_t>(0);
  w.Put<uint32_t>(static_cast<uint32_t>(store.layout().files.size()));
  for (const auto& file : store.layout().files) {
    ASSIGN_OR_RETURN(FileStamp s, Stamp(store.dir() / file.name));
    w.Put<uint16_t>(static_cast<uint16_t>(file.name.size()));
    w.PutString(file.name);
    w.Put<uint64_t>(s.size);
    w.Put<int64_t>(s.mtime_ns);
    w.Put<uint64_t>(s.inode);
  }
  w.Put<uint64_t>(store.layout().index_hash);
  return out;
}

// "<tag> <hex> [<hex>] <xxh3 of the preceding text>\n": small, human-readable, and a
// torn or edited file is detected rather than trusted.
std::string WithChecksum(const std::string& body) {
  char sum[17];
  std::snprintf(sum, sizeof sum, "%016llx", static_cast<unsigned long long>(Hash64(AsBytes(body))));
  return body + " " + sum + "\n";
}

Result<std::optional<std::string>> ReadChecked(const std::filesystem::path& path) {
  auto bytes = ReadFile(path, 4096);
  if (!bytes.ok()) {
    if (bytes.status().code() == StatusCode::kNotFound) return std::optional<std::string>();
    return bytes.status();
  }
  std::string text(AsChars(*bytes));
  if (text.size() < 18 || text.back() != '\n')
    return Status::Corrupt(path.string() + " is malformed");
  const std::string body = text.substr(0, text.size() - 18);
  if (WithChecksum(body) != text) return Status::Corrupt(path.string() + " fails its checksum");
  return std::optional<std::string>(body);
}

}  // namespace

CheckpointState::CheckpointState(const std::filesystem::path& checkpoint_dir)
    : dir_(checkpoint_dir / kStateDirName) {}

Status CheckpointState::EnsureDir() { return CreateDirectoriesDurably(dir_); }

Result<codec::Manifest> CheckpointState::LoadOrComputeManifest(const CheckpointDirStore& store,
                                                               uint64_t partition_bytes,
                                                               size_t threads) {
  ASSIGN_OR_RETURN(std::vector<std::byte> stamps, StampBlock(store));
  auto cached = ReadFile(dir_ / kManifestFile, uint64_t{1} << 30);
  if (cached.ok() && cached->size() >= 8) {
    const ByteSpan all(*cached);
    const uint32_t magic = LoadLE<uint32_t>(all.data());
    const uint16_t version = magic == kCacheMagic ? LoadLE<uint16_t>(all.data() + 4) : 0;
    if (magic == kCacheMagicV1 || (magic == kCacheMagic && version != kCacheVersion)) {
      // Never read as this format: its hashes are of another kind.
      log::Info("the manifest cache of " + store.dir().string() + " is format " +
                std::to_string(magic == kCacheMagicV1 ? 1 : version) + ", this build uses " +
                std::to_string(kCacheVersion) + "; hashing the checkpoint again");
    } else if (all.size() > stamps.size() + 8 &&
               LoadLE<uint64_t>(all.data() + all.size() - 8) == Hash64(all.first(all.size() - 8)) &&
               std::equal(stamps.begin(), stamps.end(), all.begin())) {
      auto manifest =
          codec::Manifest::Parse(all.subspan(stamps.size(), all.size() - stamps.size() - 8));
      if (manifest.ok() && manifest->partition_bytes == partition_bytes &&
          manifest->tensors == store.tensors()) {
        return manifest;
      }
      if (manifest.status().code() == StatusCode::kVersionMismatch) {
        log::Info("the manifest cached for " + store.dir().string() + " is of another format (" +
                  manifest.status().message() + "); hashing the checkpoint again");
      }
    }
  }
  ASSIGN_OR_RETURN(
      codec::Manifest manifest,
      codec::ComputeManifest(store.tensors(), RangeReaderOf(store), partition_bytes, threads));
  if (Status s = SaveManifest(store, manifest); !s.ok()) {
    log::Warn("not caching the manifest of " + store.dir().string() + ": " + s.ToString());
  }
  return manifest;
}

Status CheckpointState::SaveManifest(const CheckpointDirStore& store,
                                     const codec::Manifest& manifest) {
  RETURN_IF_ERROR(EnsureDir());
  ASSIGN_OR_RETURN(std::vector<std::byte> out, StampBlock(store));
  const std::vector<std::byte> body = manifest.Serialize();
  out.insert(out.end(), body.begin(), body.end());
  ByteWriter(out).Put<uint64_t>(Hash64(out));
  return WriteFileAtomic(dir_ / kManifestFile, out);
}

namespace {

// "<tag> <base> <target>" (checksummed): the in-flight and the unflushed records.
Result<std::optional<InflightDelta>> ReadDeltaRecord(const std::filesystem::path& path,
                                                     std::string_view tag) {
  ASSIGN_OR_RETURN(auto body, ReadChecked(path));
  if (!body) return std::optional<InflightDelta>();
  const size_t at = tag.size() + 1;
  if (body->size() != at + 32 + 1 + 32 || body->substr(0, at) != std::string(tag) + " ") {
    return Status::Corrupt(path.string() + " is malformed");
  }
  auto base = Digest128::FromHex(body->substr(at, 32));
  auto target = Digest128::FromHex(body->substr(at + 33, 32));
  if (!base || !target) return Status::Corrupt(path.string() + " is malformed");
  return std::optional<InflightDelta>(InflightDelta{*base, *target});
}

Status WriteDeltaRecord(const std::filesystem::path& path, std::string_view tag,
                        const InflightDelta& delta) {
  const std::string text =
      WithChecksum(std::string(tag) + " " + delta.base.ToHex() + " " + delta.target.ToHex());
  return WriteFileAtomic(path, AsBytes(text));
}

}  // namespace

Result<std::optional<InflightDelta>> CheckpointState::ReadInflight() const {
  return ReadDeltaRecord(dir_ / kInflightFile, "inflight");
}

Status CheckpointState::WriteInflight(const InflightDelta& inflight) {
  RETURN_IF_ERROR(EnsureDir());
  return WriteDeltaRecord(dir_ / kInflightFile, "inflight", inflight);
}

Result<std::optional<InflightDelta>> CheckpointState::ReadUnflushed() const {
  return ReadDeltaRecord(dir_ / kUnflushedFile, "unflushed");
}

Status CheckpointState::WriteUnflushed(const InflightDelta& delta) {
  RETURN_IF_ERROR(EnsureDir());
  return WriteDeltaRecord(dir_ / kUnflushedFile, "unflushed", delta);
}

Status CheckpointState::ClearUnflushed() {
  std::error_code ec;
  std::filesystem::remove(dir_ / kUnflushedFile, ec);
  disk::Removed(dir_ / kUnflushedFile);
  if (ec)
    return Status::IoError("remove " + (dir_ / kUnflushedFile).string() + ": " + ec.message());
  return FsyncDirectory(dir_);
}

Result<std::optional<codec::Manifest>> CheckpointState::LoadManifestOf(
    const Digest128& version, uint64_t partition_bytes) const {
  auto cached = ReadFile(dir_ / kManifestFile, uint64_t{1} << 30);
  if (!cached.ok()) {
    if (cached.status().code() == StatusCode::kNotFound) return std::optional<codec::Manifest>();
    return cached.status();
  }
  // Skip the stamp block (StampBlock's layout) to reach the manifest.
  const ByteSpan all(*cached);
  if (all.size() < 20 ||
      LoadLE<uint64_t>(all.data() + all.size() - 8) != Hash64(all.first(all.size() - 8))) {
    return std::optional<codec::Manifest>();
  }
  ByteReader r(all.first(all.size() - 8));
  uint32_t magic = 0, files = 0;
  uint16_t format = 0, reserved = 0;
  if (!r.Get(magic) || !r.Get(format) || !r.Get(reserved) || !r.Get(files) ||
      magic != kCacheMagic || format != kCacheVersion) {
    return std::optional<codec::Manifest>();
  }
  for (uint32_t f = 0; f < files; ++f) {
    uint16_t name = 0;
    ByteSpan skipped;
    if (!r.Get(name) || !r.GetBytes(name + 8 + 8 + 8, skipped))
      return std::optional<codec::Manifest>();
  }
  uint64_t index_hash = 0;
  if (!r.Get(index_hash)) return std::optional<codec::Manifest>();
  ByteSpan rest;
  if (!r.GetBytes(r.remaining(), rest)) return std::optional<codec::Manifest>();
  auto manifest = codec::Manifest::Parse(rest);
  if (!manifest.ok() || manifest->partition_bytes != partition_bytes ||
      manifest->VersionId() != version) {
    return std::optional<codec::Manifest>();
  }
  return std::optional<codec::Manifest>(std::move(*manifest));
}

Status CheckpointState::ClearInflight() {
  // The in-flight record goes last: without it the others mean nothing.
  for (std::string_view name : {kPreparedFile, kAppliedFile, kInflightFile}) {
    std::error_code ec;
    std::filesystem::remove(dir_ / name, ec);
    disk::Removed(dir_ / name);
    if (ec) return Status::IoError("remove " + (dir_ / name).string() + ": " + ec.message());
  }
  return FsyncDirectory(dir_);
}

Status CheckpointState::ClearMarks() {
  for (std::string_view name : {kPreparedFile, kAppliedFile}) {
    std::error_code ec;
    std::filesystem::remove(dir_ / name, ec);
    disk::Removed(dir_ / name);
    if (ec) return Status::IoError("remove " + (dir_ / name).string() + ": " + ec.message());
  }
  return FsyncDirectory(dir_);
}

Status CheckpointState::AppendApplied(uint32_t sequence) {
  RETURN_IF_ERROR(EnsureDir());
  std::string line = WithChecksum("applied " + std::to_string(sequence));
  line.pop_back();  // AppendLineDurably adds the newline
  return AppendLineDurably(dir_ / kAppliedFile, line);
}

Result<std::set<uint32_t>> CheckpointState::ReadApplied() const {
  std::set<uint32_t> out;
  auto bytes = ReadFile(dir_ / kAppliedFile, uint64_t{64} << 20);
  if (!bytes.ok()) {
    if (bytes.status().code() == StatusCode::kNotFound) return out;
    return bytes.status();
  }
  std::string_view text = AsChars(*bytes);
  while (!text.empty()) {
    const auto end = text.find('\n');
    if (end == std::string_view::npos) break;  // a torn last line
    const std::string line(text.substr(0, end + 1));
    text.remove_prefix(end + 1);
    const std::string body = line.size() > 18 ? line.substr(0, line.size() - 18) : "";
    if (body.rfind("applied ", 0) != 0 || WithChecksum(body) != line) {
      return Status::Corrupt((dir_ / kAppliedFile).string() + " has a damaged line");
    }
    out.insert(static_cast<uint32_t>(std::stoul(body.substr(8))));
  }
  return out;
}

Status CheckpointState::WritePrepared() {
  RETURN_IF_ERROR(EnsureDir());
  return WriteFileAtomic(dir_ / kPreparedFile, AsBytes(WithChecksum("prepared")));
}

Result<bool> CheckpointState::ReadPrepared() const {
  ASSIGN_OR_RETURN(auto body, ReadChecked(dir_ / kPreparedFile));
  return body.has_value();
}

Result<std::optional<Digest128>> CheckpointState::ReadActive() const {
  ASSIGN_OR_RETURN(auto body, ReadChecked(dir_ / kActiveFile));
  if (!body) return std::optional<Digest128>();
  auto version = body->size() == 7 + 32 && body->substr(0, 7) == "active "
                     ? Digest128::FromHex(body->substr(7))
                     : std::nullopt;
  if (!version) return Status::Corrupt((dir_ / kActiveFile).string() + " is malformed");
  return std::optional<Digest128>(*version);
}

Status CheckpointState::WriteActive(const Digest128& version) {
  RETURN_IF_ERROR(EnsureDir());
  return WriteFileAtomic(dir_ / kActiveFile, AsBytes(WithChecksum("active " + version.ToHex())));
}

}  // namespace deltacast::apply
