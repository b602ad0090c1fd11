// Delta files: the chunks of one delta stored back to back, exactly the bytes the
// relay tree carries. Reading is chunk by chunk, so memory stays one chunk whatever
// the delta's size.
//
// Thread safety: a reader or writer is used by one thread.
#pragma once

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "common/bytes.h"
#include "common/status.h"

namespace deltacast::apply {

class DeltaFileWriter {
 public:
  static Result<std::unique_ptr<DeltaFileWriter>> Create(const std::filesystem::path& path);
  ~DeltaFileWriter();
  Status Append(ByteSpan chunk);
  // fsyncs and closes; the file is complete only after this succeeds.
  Status Finish();

 private:
  DeltaFileWriter(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::filesystem::path path_;
};

class DeltaFileReader {
 public:
  static Result<std::unique_ptr<DeltaFileReader>> Open(const std::filesystem::path& path);
  ~DeltaFileReader();
  // The next whole chunk (header validated, payload read but not yet verified: pass
  // it to codec::ParseChunk), or nullopt at a clean end of file. Corrupt on a
  // truncated chunk.
  Result<std::optional<std::vector<std::byte>>> Next();
  uint64_t offset() const { return offset_; }

 private:
  DeltaFileReader(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::filesystem::path path_;
  uint64_t offset_ = 0;
};

}  // namespace deltacast::apply
