#include "apply/delta_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "codec/chunk.h"
#include "common/disk_seam.h"
#include "common/file_util.h"

namespace deltacast::apply {
namespace {

// Reads up to out.size() bytes; returns how many (fewer only at end of file).
Result<size_t> ReadUpTo(int fd, MutableByteSpan out, const std::filesystem::path& path) {
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "read " + path.string());
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  return got;
}

}  // namespace

Result<std::unique_ptr<DeltaFileWriter>> DeltaFileWriter::Create(
    const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno(errno, "create " + path.string());
  disk::Created(path);
  return std::unique_ptr<DeltaFileWriter>(new DeltaFileWriter(fd, path));
}

DeltaFileWriter::~DeltaFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

Status DeltaFileWriter::Append(ByteSpan chunk) { return WriteAll(fd_, chunk, path_); }

Status DeltaFileWriter::Finish() {
  if (::fsync(fd_) != 0) return Status::FromErrno(errno, "fsync " + path_.string());
  disk::Synced(path_);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) return Status::FromErrno(errno, "close " + path_.string());
  return Status::Ok();
}

Result<std::unique_ptr<DeltaFileReader>> DeltaFileReader::Open(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(path.string() + ": no such delta file");
    return Status::FromErrno(errno, "open " + path.string());
  }
  return std::unique_ptr<DeltaFileReader>(new DeltaFileReader(fd, path));
}

DeltaFileReader::~DeltaFileReader() {
  if (fd_ >= 0) ::close(fd_);
}

Result<std::optional<std::vector<std::byte>>> DeltaFileReader::Next() {
  std::vector<std::byte> chunk(codec::kChunkHeaderBytes);
  ASSIGN_OR_RETURN(size_t got, ReadUpTo(fd_, chunk, path_));
  if (got == 0) return std::optional<std::vector<std::byte>>();
  const std::string where = path_.string() + " at offset " + std::to_string(offset_);
  if (got < chunk.size()) return Status::Corrupt(where + ": truncated chunk header");
  auto length = codec::ParseChunkHeaderPayloadLength(chunk);
  if (!length.ok()) return length.status().WithContext(where);
  chunk.resize(codec::kChunkHeaderBytes + *length);
  ASSIGN_OR_RETURN(size_t body,
                   ReadUpTo(fd_, MutableByteSpan(chunk).subspan(codec::kChunkHeaderBytes), path_));
  if (body != *length) {
    return Status::Corrupt(where + ": chunk payload truncated (" + std::to_string(body) + " of " +
                           std::to_string(*length) + " bytes)");
  }
  offset_ += chunk.size();
  return std::optional<std::vector<std::byte>>(std::move(chunk));
}

}  // namespace deltacast::apply
