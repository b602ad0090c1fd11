#include "agent/spool.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "common/file_util.h"

namespace deltacast::agent {

Result<std::unique_ptr<Spool>> Spool::Create(const std::filesystem::path& dir, uint64_t refit_id) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError("create " + dir.string() + ": " + ec.message());
  const auto path = dir / ("refit-" + std::to_string(refit_id) + ".spool");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno(errno, "create " + path.string());
  return std::unique_ptr<Spool>(new Spool(fd, path, refit_id));
}

Spool::~Spool() {
  ::close(fd_);
  std::error_code ec;
  std::filesystem::remove(path_, ec);
}

Status Spool::Append(uint32_t sequence, ByteSpan message) {
  std::lock_guard lock(mu_);
  if (index_.contains(sequence)) return Status::Ok();
  // The spool is a cache for replays, not a durable record: no fsync.
  RETURN_IF_ERROR(WriteAll(fd_, message, path_));
  index_[sequence] = Entry{end_, message.size()};
  end_ += message.size();
  return Status::Ok();
}

Result<transport::Message> Spool::Read(uint32_t sequence) const {
  Entry entry;
  {
    std::lock_guard lock(mu_);
    auto it = index_.find(sequence);
    if (it == index_.end()) return Status::NotFound("chunk " + std::to_string(sequence) + " is not spooled");
    entry = it->second;
  }
  std::vector<std::byte> bytes(entry.length);
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::pread(fd_, bytes.data() + got, bytes.size() - got, static_cast<off_t>(entry.offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::FromErrno(n < 0 ? errno : EIO, "read spool " + path_.string());
    got += static_cast<size_t>(n);
  }
  return transport::MakeMessage(std::move(bytes));
}

std::vector<uint32_t> Spool::sequences() const {
  std::lock_guard lock(mu_);
  std::vector<uint32_t> out;
  for (const auto& [sequence, entry] : index_) out.push_back(sequence);
  return out;
}

uint64_t Spool::bytes() const {
  std::lock_guard lock(mu_);
  return end_;
}

}  // namespace deltacast::agent
