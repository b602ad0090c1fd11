#include "relay/store/checkpoint_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/crash_point.h"
#include "common/disk_seam.h"
#include "common/file_util.h"

namespace deltacast::relay {

namespace fs = std::filesystem;

CheckpointWriter::CheckpointWriter(const apply::CheckpointDirStore& weights, fs::path out,
                                   uint64_t block_bytes, uint64_t sync_every_blocks)
    : weights_(weights),
      out_(std::move(out)),
      block_bytes_(block_bytes),
      sync_every_blocks_(sync_every_blocks) {}

Result<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Create(
    const apply::CheckpointDirStore& weights, const fs::path& out, uint64_t block_bytes,
    uint64_t sync_every_blocks) {
  if (block_bytes == 0) return Status::InvalidArgument("a checkpoint writer needs a block size");
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_empty(out, ec)) {
    return Status::FailedPrecondition(out.string() + " exists and is not empty");
  }
  RETURN_IF_ERROR(CreateDirectoriesDurably(out));
  auto writer = std::unique_ptr<CheckpointWriter>(
      new CheckpointWriter(weights, out, block_bytes, sync_every_blocks));
  for (const auto& entry : fs::directory_iterator(weights.dir(), ec)) {
    if (entry.is_regular_file()) writer->files_.push_back(entry.path());
  }
  if (ec) return Status::IoError("list " + weights.dir().string() + ": " + ec.message());
  std::sort(writer->files_.begin(), writer->files_.end());
  return writer;
}

CheckpointWriter::~CheckpointWriter() {
  if (in_ >= 0) ::close(in_);
  if (fd_ >= 0) ::close(fd_);
}

Status CheckpointWriter::OpenFile() {
  const fs::path& from = files_[file_];
  const std::string name = from.filename().string();
  const apply::CheckpointLayout& layout = weights_.layout();
  // The tensors this file holds, by offset: their bytes come from memory.
  tensors_.clear();
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    if (layout.files[layout.tensors[i].file].name == name) tensors_.push_back(i);
  }
  std::sort(tensors_.begin(), tensors_.end(), [&](size_t a, size_t b) {
    return layout.tensors[a].file_offset < layout.tensors[b].file_offset;
  });
  next_tensor_ = 0;
  std::error_code ec;
  size_ = fs::file_size(from, ec);
  if (ec) return Status::IoError("stat " + from.string() + ": " + ec.message());
  at_ = 0;
  blocks_ = 0;
  in_ = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in_ < 0) return Status::FromErrno(errno, "open " + from.string());
  const fs::path to = out_ / name;
  fd_ = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) return Status::FromErrno(errno, "create " + to.string());
  disk::Created(to);
  open_ = true;
  if (block_.size() < block_bytes_) block_.resize(block_bytes_);
  return Status::Ok();
}

Status CheckpointWriter::CloseFile(bool sync) {
  const fs::path to = out_ / files_[file_].filename();
  if (sync && ::fsync(fd_) != 0) return Status::FromErrno(errno, "fsync " + to.string());
  if (sync) disk::Synced(to);
  ::close(in_);
  ::close(fd_);
  in_ = fd_ = -1;
  open_ = false;
  ++file_;
  return Status::Ok();
}

Result<uint64_t> CheckpointWriter::Next() {
  if (done()) return uint64_t{0};
  if (!open_) RETURN_IF_ERROR(OpenFile());
  const fs::path to = out_ / files_[file_].filename();
  if (at_ >= size_) {  // an empty file
    RETURN_IF_ERROR(CloseFile(/*sync=*/true));
    return uint64_t{0};
  }
  const apply::CheckpointLayout& layout = weights_.layout();
  const uint64_t n = std::min(block_bytes_, size_ - at_);
  uint64_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(in_, block_.data() + got, n - got, static_cast<off_t>(at_ + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      return Status::FromErrno(r < 0 ? errno : EIO, "read " + files_[file_].string());
    }
    got += static_cast<uint64_t>(r);
  }
  while (next_tensor_ < tensors_.size()) {
    const apply::CheckpointTensor& t = layout.tensors[tensors_[next_tensor_]];
    if (t.file_offset + t.info.ByteSize() > at_) break;
    ++next_tensor_;
  }
  for (size_t k = next_tensor_; k < tensors_.size(); ++k) {
    const apply::CheckpointTensor& t = layout.tensors[tensors_[k]];
    if (t.file_offset >= at_ + n) break;
    const uint64_t from = std::max(at_, t.file_offset);
    const uint64_t until = std::min(at_ + n, t.file_offset + t.info.ByteSize());
    const ByteSpan bytes = weights_.TensorData(tensors_[k]);
    std::memcpy(block_.data() + (from - at_), bytes.data() + (from - t.file_offset), until - from);
  }
  RETURN_IF_ERROR(WriteAll(fd_, ByteSpan(block_.data(), n), to));
  at_ += n;
  written_ += n;
  ++blocks_;
  if (at_ >= size_) {
    RETURN_IF_ERROR(CloseFile(/*sync=*/true));
  } else if (sync_every_blocks_ != 0 && blocks_ % sync_every_blocks_ == 0) {
    if (::fdatasync(fd_) != 0) return Status::FromErrno(errno, "fdatasync " + to.string());
    disk::Synced(to);
  }
  CrashPoint("snapshot.copy_block");
  return n;
}

Status CheckpointWriter::Finish() {
  if (!done()) return Status::FailedPrecondition(out_.string() + " is not written yet");
  return FsyncDirectory(out_);
}

}  // namespace deltacast::relay
