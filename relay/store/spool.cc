#include "relay/store/spool.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "codec/chunk.h"
#include "common/disk_seam.h"
#include "common/file_util.h"
#include "common/large_buffer.h"
#include "common/thread_annotations.h"
#include "relay/wire/protocol.h"

namespace deltacast::relay {

namespace {
std::string FileName(const Digest128& target) { return "delta-" + target.ToHex() + ".spool"; }
std::filesystem::path StreamFile(std::filesystem::path spool) {
  return spool.replace_extension(".stream");
}

// The stream file: "<stream, 16 hex>\n", or "<stream, 16 hex> <refit, 16 hex>\n" since
// the refit is kept too; field `index` of it, 0 when absent or unreadable.
uint64_t StreamFileField(const std::filesystem::path& dir, const Digest128& target, size_t index) {
  auto bytes = ReadFile(StreamFile(dir / FileName(target)));
  if (!bytes.ok()) return 0;
  const std::string text(reinterpret_cast<const char*>(bytes->data()), bytes->size());
  size_t at = 0;
  for (size_t i = 0; i < index; ++i) {
    at = text.find(' ', at);
    if (at == std::string::npos) return 0;
    ++at;
  }
  uint64_t value = 0;
  try {
    value = std::stoull(text.substr(at), nullptr, 16);
  } catch (const std::exception&) {
    return 0;  // unreadable: unknown, so nothing it holds counts as this stream's
  }
  return value;
}

// O_DIRECT wants the file offset, the length and the memory aligned to the device's
// logical block; 4 KiB is a multiple of every common one.
constexpr size_t kDirectAlign = 4096;
// The staging buffer: a chunk larger than this is written in pieces of it. 2 MiB
// aligned, so that it is backed by huge pages and its first touch is cheap.
constexpr size_t kStagingBytes = size_t{8} << 20;
constexpr size_t kStagingAlign = size_t{2} << 20;

size_t RoundDown(size_t value, size_t to) { return value / to * to; }
size_t RoundUp(size_t value, size_t to) { return RoundDown(value + to - 1, to); }

// An operator's (and the tests') way to the buffered path on any file system.
bool BufferedByRequest() {
  const char* buffered = std::getenv("DELTACAST_SPOOL_BUFFERED");
  return buffered && *buffered && std::string_view(buffered) != "0";
}

int OpenDirect(const std::filesystem::path& path) {
  return ::open(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
}

// pwrite of all `length` bytes at `offset`, retrying EINTR and short writes (a short
// O_DIRECT write stops on a block boundary, so what is left stays aligned).
int PwriteAll(int fd, const std::byte* data, size_t length, uint64_t offset) {
  size_t done = 0;
  while (done < length) {
    const ssize_t n = ::pwrite(fd, data + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    done += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

void Spool::FreeStaging::operator()(std::byte* p) const { std::free(p); }

bool Spool::DirectWritesWork(const std::filesystem::path& dir) {
  if (BufferedByRequest()) return false;
  const auto probe = dir / fmt::format(".direct-probe-{}", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  void* block = std::aligned_alloc(kDirectAlign, kDirectAlign);
  bool works = false;
  if (block) {
    std::memset(block, 0, kDirectAlign);
    works = ::pwrite(fd, block, kDirectAlign, 0) == static_cast<ssize_t>(kDirectAlign);
    std::free(block);
  }
  ::close(fd);
  std::error_code ec;
  std::filesystem::remove(probe, ec);
  return works;
}

bool Spool::direct_writes() const {
  MutexLock lock(mu_);
  return direct_fd_ >= 0;
}

void Spool::StartDirect() {
  // The simulator's disk model sees plain appends (disk::WillWrite, Synced): the
  // direct path stays out of it.
  if (SimDisk() != nullptr) return;
  // An operator's (and the tests') way to the buffered path on any file system.
  if (BufferedByRequest()) return;
  MutexLock lock(mu_);
  const int fd = OpenDirect(path_);
  if (fd < 0) return;  // refused (tmpfs: EINVAL): buffered writes
  auto* staging = static_cast<std::byte*>(std::aligned_alloc(kStagingAlign, kStagingBytes));
  if (!staging) {
    ::close(fd);
    return;
  }
  (void)::madvise(staging, kStagingBytes, MADV_HUGEPAGE);  // advice only
  staging_.reset(staging);
  if (!LoadTail()) {
    ::close(fd);  // cannot read it: leave the spool buffered
    staging_.reset();
    tail_ = 0;
    return;
  }
  direct_fd_ = fd;
}

// The partial block at the end of the file, which the next direct append rewrites
// whole, into the start of the staging buffer.
bool Spool::LoadTail() {
  tail_ = end_ - RoundDown(end_, kDirectAlign);
  size_t got = 0;
  while (got < tail_) {
    const ssize_t n =
        ::pread(fd_, staging_.get() + got, tail_ - got, static_cast<off_t>(end_ - tail_ + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return true;
}

uint64_t Spool::StreamOf(const std::filesystem::path& dir, const Digest128& target) {
  return StreamFileField(dir, target, 0);
}

uint64_t Spool::RefitOf(const std::filesystem::path& dir, const Digest128& target) {
  return StreamFileField(dir, target, 1);
}

bool Spool::HoldsChunks(const std::filesystem::path& dir, const Digest128& target) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(dir / FileName(target), ec);
  return !ec && size > 0;
}

Status Spool::RecordStream(uint64_t stream, uint64_t refit_id) {
  // Older versions read the stream alone (up to the space) and ignore the refit.
  const std::string text = refit_id == 0 ? fmt::format("{:016x}\n", stream)
                                         : fmt::format("{:016x} {:016x}\n", stream, refit_id);
  return WriteFileAtomic(StreamFile(path_),
                         ByteSpan(reinterpret_cast<const std::byte*>(text.data()), text.size()));
}

void Spool::RemoveOthers(const std::filesystem::path& dir, const Digest128& target) {
  std::error_code ec;
  const std::string name = FileName(target);
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const auto extension = entry.path().extension();
    if ((extension == ".spool" || extension == ".stream") &&
        entry.path().stem() != std::filesystem::path(name).stem()) {
      std::filesystem::remove(entry.path(), ec);
      disk::Removed(entry.path());
    }
  }
}

Result<std::unique_ptr<Spool>> Spool::Open(const std::filesystem::path& dir,
                                           const Digest128& target, bool remove_others) {
  RETURN_IF_ERROR(CreateDirectoriesDurably(dir));
  if (remove_others) RemoveOthers(dir, target);
  const auto path = dir / FileName(target);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno(errno, "open " + path.string());
  disk::Created(path);
  auto spool = std::unique_ptr<Spool>(new Spool(fd, path));
  spool->Recover();
  spool->StartDirect();
  // Empty: just made, maybe. As in OpenEmpty, the chunks fdatasynced into it later
  // must not be lost with its name.
  if (spool->bytes() == 0) RETURN_IF_ERROR(FsyncDirectory(dir));
  return spool;
}

Result<std::unique_ptr<Spool>> Spool::OpenEmpty(const std::filesystem::path& dir,
                                                const Digest128& target) {
  RETURN_IF_ERROR(CreateDirectoriesDurably(dir));
  const auto path = dir / FileName(target);
  std::error_code ec;
  // A new file, not the old one truncated: a Spool still open on the old one (a
  // rollback finishing) keeps reading what it indexed.
  std::filesystem::remove(path, ec);
  disk::Removed(path);
  std::filesystem::remove(StreamFile(path), ec);  // its chunks are gone: so is their stream
  disk::Removed(StreamFile(path));
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno(errno, "open " + path.string());
  disk::Created(path);
  auto spool = std::unique_ptr<Spool>(new Spool(fd, path));
  spool->StartDirect();
  // The chunks fdatasynced into it later must not be lost with its name.
  RETURN_IF_ERROR(FsyncDirectory(dir));
  return spool;
}

Result<std::unique_ptr<Spool>> Spool::OpenFile(const std::filesystem::path& file) {
  const int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + file.string());
  auto spool = std::unique_ptr<Spool>(new Spool(fd, file));
  spool->Recover();
  return spool;
}

void Spool::Recover() {
  MutexLock lock(mu_);  // not shared yet: taken for the analysis, never contended
  // Keep every whole, valid message from the start; a crash may have cut the last.
  for (;;) {
    std::vector<std::byte> head(kMessageHeaderBytes + codec::kChunkHeaderBytes);
    if (::pread(fd_, head.data(), head.size(), static_cast<off_t>(end_)) !=
        static_cast<ssize_t>(head.size()))
      break;
    auto header = codec::PeekChunkHeader(ByteSpan(head).subspan(kMessageHeaderBytes));
    if (!PeekType(head).ok() || !header.ok()) break;
    // header, codec chunk, signature (docs/protocol.md, CHUNK); the payload length
    // is capped by PeekChunkHeader, so this cannot overflow.
    const uint64_t length = head.size() + header->payload_length + kSignatureBytes;
    auto message = ReadAt(end_, length);
    if (!message.ok() || !codec::ParseChunk(ChunkOf(**message)).ok()) break;
    index_[header->sequence] = Entry{end_, length};
    end_ += length;
  }
  if (::ftruncate(fd_, static_cast<off_t>(end_)) != 0) index_.clear(), end_ = 0;
}

Result<transport::Message> Spool::ReadAt(uint64_t offset, uint64_t length) const {
  // A chunk read back (the apply's, a replay's) is MiBs: fresh memory for it is
  // prefaulted in bulk rather than page by page.
  auto bytes = NewLargeBuffer(length);
  size_t got = 0;
  while (got < bytes->size()) {
    const ssize_t n =
        ::pread(fd_, bytes->data() + got, bytes->size() - got, static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::FromErrno(n < 0 ? errno : EIO, "read spool " + path_.string());
    got += static_cast<size_t>(n);
  }
  return transport::MakeMessage(std::move(*bytes));
}

Spool::~Spool() {
  MutexLock lock(mu_);  // not shared any more: taken for the analysis
  if (direct_fd_ >= 0) ::close(direct_fd_);
  ::close(fd_);
}

Status Spool::Sync(std::optional<uint32_t> taken) {
  uint64_t needed = 0;
  {
    MutexLock lock(mu_);
    needed = end_;
  }
  if (needed > SyncedEnd()) {
    // One fdatasync at a time, and none under mu_: Append (the node's loop, between
    // receiving a chunk and crediting its parent) never waits for the disk, and a
    // Sync that waited here for another's finds its bytes covered (group commit).
    MutexLock syncing(sync_mu_);
    uint64_t through = 0;
    {
      MutexLock lock(mu_);
      through = end_;  // every byte Append finished so far, which fdatasync covers
    }
    if (SyncedEnd() < needed) {
      if (::fdatasync(fd_) != 0) return Status::FromErrno(errno, "fdatasync " + path_.string());
      // The simulator runs every node on one thread: no Append ran since `through`.
      disk::Synced(path_);
      MutexLock lock(mu_);
      synced_end_ = std::max(synced_end_, through);
      ++syncs_;
    }
  }
  if (taken) DropTaken(*taken);
  return Status::Ok();
}

uint64_t Spool::SyncedEnd() const {
  MutexLock lock(mu_);
  return synced_end_;
}

// Durable bytes need not stay in the page cache: a spool is written once and read
// again only by a replay or a rollback. Left there, a delta of many GiB grows the
// cache by as much, and every Append copies into pages the kernel must first find
// (on this VM, memory the host has not backed: 37 % of a relay's time went into that
// copy in the relay benchmark's profile, 12 x what the same writes cost into pages
// recycled). Only up to the chunk the apply holds: the chunks after it may still be
// read back by their own apply. Advice only: an error changes nothing.
void Spool::DropTaken(uint32_t sequence) {
  uint64_t from = 0, to = 0;
  {
    MutexLock lock(mu_);
    auto it = index_.find(sequence);
    if (it == index_.end()) return;
    from = dropped_end_;
    to = std::min(synced_end_, it->second.offset + it->second.length);
    if (to <= from) return;
    dropped_end_ = to;
  }
  (void)::posix_fadvise(fd_, static_cast<off_t>(from), static_cast<off_t>(to - from),
                        POSIX_FADV_DONTNEED);
}

uint64_t Spool::syncs() const {
  MutexLock lock(mu_);
  return syncs_;
}

void Spool::Discard() {
  std::error_code ec;
  std::filesystem::remove(path_, ec);
  disk::Removed(path_);
  std::filesystem::remove(StreamFile(path_), ec);
  disk::Removed(StreamFile(path_));
}

Status Spool::Append(uint32_t sequence, ByteSpan message, bool durable) {
  MutexLock lock(mu_);
  if (index_.contains(sequence)) return Status::Ok();
  // Recover keeps only whole, checksummed chunks, so a torn tail costs a re-fetch
  // from the parent, never a wrong byte.
  bool written = false;
  if (direct_fd_ >= 0) {
    ASSIGN_OR_RETURN(written, AppendDirect(message));
  }
  if (!written) RETURN_IF_ERROR(AppendBuffered(message));
  if (durable && ::fdatasync(fd_) != 0)
    return Status::FromErrno(errno, "fdatasync " + path_.string());
  index_[sequence] = Entry{end_, message.size()};
  end_ += message.size();
  if (durable) {
    disk::Synced(path_);
    synced_end_ = end_;
    ++syncs_;
  }
  return Status::Ok();
}

Status Spool::AppendBuffered(ByteSpan message) {
  if (::lseek(fd_, static_cast<off_t>(end_), SEEK_SET) < 0)
    return Status::FromErrno(errno, "seek " + path_.string());
  return WriteAll(fd_, message, path_);
}

// The file's bytes [end_ - tail_, end_) wait at the start of the staging buffer; the
// message is copied after them and written from that aligned offset, the last block
// padded with zeros, which the ftruncate then cuts off (the file ends where its last
// chunk does, as a buffered append leaves it). Rewriting the partial block rewrites
// bytes already there with the same bytes, so a crash in the middle of it cannot
// damage a chunk spooled before.
Result<bool> Spool::AppendDirect(ByteSpan message) {
  std::byte* staging = staging_.get();
  // Nothing past end_ counts after a failure: cut it, and give the staging buffer back
  // the file's partial block (a piece written before may have overwritten it there).
  // A file system that opens O_DIRECT but will not do it (EINVAL): buffered from now on.
  auto fail = [&](int error, std::string_view what) -> Result<bool> {
    mu_.AssertHeld();  // called only from here, under AppendDirect's lock
    const bool restored = ::ftruncate(fd_, static_cast<off_t>(end_)) == 0 && LoadTail();
    if (error == EINVAL || !restored) {
      ::close(direct_fd_);
      direct_fd_ = -1;
      staging_.reset();
      tail_ = 0;
    }
    if (error == EINVAL) return false;
    return Status::FromErrno(error, std::string(what) + " " + path_.string());
  };
  uint64_t offset = end_ - tail_;
  size_t filled = tail_;
  size_t at = 0;
  for (;;) {
    const size_t n = std::min(message.size() - at, kStagingBytes - filled);
    std::memcpy(staging + filled, message.data() + at, n);
    filled += n;
    at += n;
    const bool last = at == message.size();
    const size_t length = last ? RoundUp(filled, kDirectAlign) : filled;  // full: aligned
    std::memset(staging + filled, 0, length - filled);
    if (const int error = PwriteAll(direct_fd_, staging, length, offset); error != 0)
      return fail(error, "write");
    if (last) break;
    offset += length;
    filled = 0;
  }
  const size_t keep_from = RoundDown(filled, kDirectAlign);
  if (keep_from != filled && ::ftruncate(fd_, static_cast<off_t>(end_ + message.size())) != 0)
    return fail(errno, "truncate");
  tail_ = filled - keep_from;
  std::memmove(staging, staging + keep_from, tail_);
  return true;
}

void Spool::Forget(uint32_t sequence) {
  MutexLock lock(mu_);
  index_.erase(sequence);
}

Result<transport::Message> Spool::Read(uint32_t sequence) const {
  Entry entry;
  {
    MutexLock lock(mu_);
    auto it = index_.find(sequence);
    if (it == index_.end())
      return Status::NotFound("chunk " + std::to_string(sequence) + " is not spooled");
    entry = it->second;
  }
  return ReadAt(entry.offset, entry.length);
}

std::vector<uint32_t> Spool::sequences() const {
  MutexLock lock(mu_);
  std::vector<uint32_t> out;
  for (const auto& [sequence, entry] : index_) out.push_back(sequence);
  return out;
}

uint64_t Spool::bytes() const {
  MutexLock lock(mu_);
  return end_;
}

SpoolDir::SpoolDir(std::filesystem::path configured, std::string_view kind,
                   std::string_view node_id)
    : path_(std::move(configured)) {
  if (!path_.empty()) return;
  path_ = std::filesystem::temp_directory_path() /
          ("deltacast-" + std::string(kind) + "-" + std::string(node_id) + "-" +
           std::to_string(::getpid()));
  owned_ = true;
}

void SpoolDir::Release() {
  if (!owned_) return;
  owned_ = false;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  disk::Removed(path_);
}

}  // namespace deltacast::relay
