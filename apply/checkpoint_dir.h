// A Hugging Face checkpoint directory (safetensors files, optionally with
// model.safetensors.index.json) read as a layout and opened as a WeightStore whose
// tensor bytes are the files themselves, mapped into memory: applying a delta
// patches the files in place and Flush makes it durable. Only ReadRange, for
// readers that go through the bytes once, copies them (see ReadPath).
//
// Thread safety: ReadCheckpointLayout is thread-safe. CheckpointDirStore follows
// WeightStore: const methods from any thread; concurrent writers to disjoint ranges.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "apply/weight_store.h"
#include "common/dtype.h"
#include "common/hash.h"
#include "common/status.h"
#include "deltacast/tensor.h"

namespace deltacast::apply {

inline constexpr std::string_view kCheckpointIndexFileName = "model.safetensors.index.json";

struct CheckpointFile {
  std::string name;  // a plain file name inside the directory
  uint64_t size = 0;
  uint64_t header_hash = 0;  // Hash64 of the first data_offset bytes (length + JSON)
  uint64_t data_offset = 0;  // where the data section starts: 8 + header JSON length
};

struct CheckpointTensor {
  TensorSpec info;
  uint32_t file = 0;         // index into CheckpointLayout::files
  uint64_t file_offset = 0;  // absolute offset of the first byte within that file
};

// Everything about a checkpoint directory except the tensor bytes.
struct CheckpointLayout {
  std::vector<CheckpointFile> files;      // sorted by name
  std::vector<CheckpointTensor> tensors;  // sorted by name; names unique across files
  uint64_t index_hash = 0;  // Hash64 of model.safetensors.index.json's bytes; 0 if absent

  // Hash of file names, sizes, header hashes, the index hash and which file holds
  // each tensor: equal ids mean equal bytes outside the tensor data.
  Digest128 LayoutId() const;
};

// Reads the headers of a checkpoint directory (only headers; no tensor data).
//
// With model.safetensors.index.json: the index must be a JSON object with a
// "weight_map" object (tensor name -> plain file name), an optional "metadata"
// object and no other key; every mapped tensor must be in its named file, and every
// tensor of those files must be mapped to that file. Other *.safetensors files in
// the directory are ignored, as Hugging Face loaders ignore them.
// Without an index: every *.safetensors regular file (symlinks followed) directly
// in `dir`; subdirectories such as .deltacast/ are not searched.
//
// Errors: kNotFound if `dir` is missing, holds no safetensors file, or the index
// names a file that does not exist; kCorrupt (naming file, tensor and value) for
// a malformed index or header, or a tensor name found in two files; kIoError when
// the OS refuses a read.
Result<CheckpointLayout> ReadCheckpointLayout(const std::filesystem::path& dir);

// Parses the bytes of a model.safetensors.index.json (rules above) into its weight
// map, tensor name -> file name; `context` prefixes errors (the file's path).
Result<std::map<std::string, std::string>> ParseCheckpointIndex(ByteSpan bytes,
                                                                std::string_view context);

class CheckpointDirStore final : public WeightStore {
 public:
  // kPrivate: writable in memory only (MAP_PRIVATE: a written page is copied, the
  // file is never written), the weights of a snapshot store (relay/store/snapshot_store.h).
  enum class Access { kReadOnly, kReadWrite, kPrivate };

  // Reads the layout and maps every file (MAP_SHARED, writable for kReadWrite;
  // MAP_PRIVATE for kPrivate, whose files are opened read-only).
  // Fails, mapping nothing, on any ReadCheckpointLayout error, if a file cannot be
  // opened with `access` (kIoError), or if a file changed between reading its
  // header and mapping it (kFailedPrecondition). Does not block beyond the header
  // reads; tensor pages are faulted in on first touch.
  static Result<std::unique_ptr<CheckpointDirStore>> Open(const std::filesystem::path& dir,
                                                          Access access);
  ~CheckpointDirStore() override;

  const CheckpointLayout& layout() const { return layout_; }
  const std::filesystem::path& dir() const { return dir_; }
  Access access() const { return access_; }

  const std::vector<TensorSpec>& tensors() const override { return tensors_; }
  // Empty for an out-of-range index.
  ByteSpan TensorData(size_t index) const override;
  // kUnsupported when opened kReadOnly; kInvalidArgument for an out-of-range index.
  Result<MutableByteSpan> MutableTensorData(size_t index) override;
  // How ReadRange reads. kCopy: pread into `buffer`. kMap: a view of the mapping,
  // its pages first entered in the page tables in one call (MADV_POPULATE_READ: no
  // fault per page, no copy; kernels before 5.14 copy instead). Both give kIoError
  // naming the file and tensor when the file now ends inside the range or its pages
  // cannot be read; kMap checks before handing out the view, instead of the SIGBUS
  // that touching those pages would raise (a file truncated after the check, while
  // the caller reads the view, still raises it there, as every mapped read does).
  // A kPrivate store always hands out a view: its files do not hold its writes.
  // The default is kCopy, or kMap with DELTACAST_CHECKPOINT_READS=map: on the VMs
  // measured here a process's first touch of a mapped page costs more than copying
  // it (README, "Encode speed of the command line"); where page tables are cheap
  // (bare metal), the mapping saves the copy. Set it before sharing the store
  // between threads.
  enum class ReadPath { kCopy, kMap };
  static ReadPath DefaultReadPath();
  void set_read_path(ReadPath path) { read_path_ = path; }
  ReadPath read_path() const { return read_path_; }
  Result<ByteSpan> ReadRange(size_t index, uint64_t offset, uint64_t length,
                             MutableByteSpan buffer) const override;
  // msync(MS_SYNC) of the pages holding those bytes; blocks until they are on disk.
  // kInvalidArgument if the range is outside the tensor; nothing to do when read-only
  // or kPrivate (nothing of such a store is ever written to its files).
  Status Flush(size_t index, uint64_t offset, uint64_t length) override;
  // msync(MS_SYNC) of every file's whole mapping: the kernel writes the dirty pages
  // only, so a store with few of them is flushed quickly.
  Status FlushAll() override;
  Digest128 LayoutId() const override { return layout_id_; }

 private:
  // One file mapped into memory and its descriptor (for ReadRange), unmapped and
  // closed on destruction. Move-only. A zero-byte file (which mmap refuses) is
  // represented as an empty mapping.
  class Mapping {
   public:
    Mapping() = default;
    // Takes ownership of `fd` whatever the outcome.
    static Result<Mapping> Map(int fd, uint64_t size, Access access,
                               const std::filesystem::path& path);
    ~Mapping();
    Mapping(Mapping&& other) noexcept;
    Mapping& operator=(Mapping&& other) noexcept;
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;

    std::byte* data() const { return static_cast<std::byte*>(addr_); }
    uint64_t size() const { return size_; }
    int fd() const { return fd_; }

   private:
    Mapping(void* addr, uint64_t size, int fd) : addr_(addr), size_(size), fd_(fd) {}
    void Release();
    void* addr_ = nullptr;
    uint64_t size_ = 0;
    int fd_ = -1;
  };

  CheckpointDirStore(std::filesystem::path dir, Access access, CheckpointLayout layout,
                     std::vector<Mapping> mappings);

  std::byte* TensorBytes(size_t index) const;
  // ReadRange's view of bytes [start, start + length) of t's file, populated;
  // nullopt when the kernel cannot populate (then ReadRange copies).
  Result<std::optional<ByteSpan>> ViewPopulated(const CheckpointTensor& t, uint64_t start,
                                                uint64_t length) const;
  Status Shrank(const CheckpointTensor& t, uint64_t end) const;

  std::filesystem::path dir_;
  Access access_;
  ReadPath read_path_;
  CheckpointLayout layout_;
  Digest128 layout_id_;
  std::vector<TensorSpec> tensors_;  // layout_.tensors[i].info, as WeightStore wants
  std::vector<Mapping> mappings_;    // parallel to layout_.files
};

}  // namespace deltacast::apply
