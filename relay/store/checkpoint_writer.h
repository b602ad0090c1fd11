// CheckpointWriter: writes the weights of a store mapped over a checkpoint directory
// (apply::CheckpointDirStore) out as a new checkpoint directory, one block per call:
// every regular file of the store's directory, byte for byte (config, index), with
// the tensor bytes taken from memory. A caller paces it, stops it or lets a crash
// land between two blocks (a snapshot build, relay/store/snapshot_store.h); every file,
// creation, sync and rename goes through the disk seam (common/disk_seam.h).
//
// Thread safety: none; one caller at a time.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "apply/checkpoint_dir.h"
#include "common/status.h"

namespace deltacast::relay {

class CheckpointWriter {
 public:
  // Creates `out` durably (it must not exist or be empty) for the files of
  // `weights`, which must outlive the writer. `block_bytes`: how much one Next()
  // writes at most. `sync_every_blocks` > 0: each file is also fdatasynced after
  // that many blocks, so a paced copy reaches the disk as it goes, not in one burst
  // at the fsync.
  static Result<std::unique_ptr<CheckpointWriter>> Create(const apply::CheckpointDirStore& weights,
                                                          const std::filesystem::path& out,
                                                          uint64_t block_bytes,
                                                          uint64_t sync_every_blocks);
  ~CheckpointWriter();  // closes a file it is writing (what is there stays, unsynced)
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Whether every file is written and fsynced.
  bool done() const { return file_ >= files_.size(); }
  // Writes the next block of the current file (creating it first; fsyncing and
  // closing it after its last block) and returns the bytes written. Passes crash
  // point "snapshot.copy_block" after each block. On failure the file stays as far
  // as it got.
  Result<uint64_t> Next();
  // Once done(): fsyncs `out`, so the files' names are durable.
  Status Finish();
  uint64_t written() const { return written_; }

 private:
  CheckpointWriter(const apply::CheckpointDirStore& weights, std::filesystem::path out,
                   uint64_t block_bytes, uint64_t sync_every_blocks);
  Status OpenFile();  // the file at files_[file_]: its tensors, the source and the copy
  Status CloseFile(bool sync);

  const apply::CheckpointDirStore& weights_;
  const std::filesystem::path out_;
  const uint64_t block_bytes_;
  const uint64_t sync_every_blocks_;
  std::vector<std::filesystem::path> files_;  // sorted by name: the same order every run
  size_t file_ = 0;
  // The file being written: its tensors by offset, its size, how far it got.
  bool open_ = false;
  int in_ = -1, fd_ = -1;
  std::vector<size_t> tensors_;
  size_t next_tensor_ = 0;  // the first tensor that may overlap the next block
  uint64_t size_ = 0, at_ = 0, blocks_ = 0;
  std::vector<std::byte> block_;
  uint64_t written_ = 0;
};

}  // namespace deltacast::relay
