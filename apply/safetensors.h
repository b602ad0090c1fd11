// The safetensors file format: strict header parsing and streaming writing.
//
// Layout: 8-byte little-endian header length N, N bytes of UTF-8 JSON (padded with
// spaces to a multiple of 8), then the data section. The JSON maps tensor names to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data
// section), plus an optional "__metadata__" object of string values.
//
// The parser accepts exactly what the reference implementation (huggingface
// safetensors, `SafeTensors::read_metadata`) accepts, rule by rule
// (docs/wire-format.md, "Safetensors input"): header length <= 100,000,000 and
// within the file, UTF-8, JSON as serde_json reads it (no BOM, depth <= 128), entries
// as objects (unknown fields ignored) or [dtype, shape, data_offsets] arrays, a
// tensor named twice keeping its last entry, "__metadata__" null or string values,
// shape products checked left to right, contiguous offsets covering the data
// section exactly. Files it accepts that deltacast cannot carry (sub-byte dtypes,
// empty or over-long names) are kUnsupported, not kCorrupt.
//
// Thread safety: free functions are thread-safe; a writer is used by one thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/bytes.h"
#include "common/dtype.h"
#include "common/status.h"
#include "deltacast/tensor.h"

namespace deltacast::apply {

// Headers larger than this are refused before any allocation.
// (the reference's MAX_HEADER_SIZE, in decimal bytes)
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsEntry {
  TensorSpec info;
  uint64_t data_begin = 0;  // relative to the start of the data section
  uint64_t data_end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in data_offsets order
  std::map<std::string, std::string> metadata;
  uint64_t data_section_offset = 0;  // 8 + JSON length: where tensor data starts in the file
};

// Parses and validates the header at the start of a file of `file_size` bytes.
// `prefix` must hold at least the first 8 bytes; if it is shorter than the header
// the error says how many bytes are needed (kResourceExhausted is never used for that:
// call HeaderBytesNeeded first). Errors are kCorrupt and name the offending field,
// except a short `prefix`, which is the caller's mistake: kInvalidArgument.
Result<SafetensorsHeader> ParseSafetensorsHeader(ByteSpan prefix, uint64_t file_size);

// How many bytes from the file start ParseSafetensorsHeader needs, read from the
// 8-byte length prefix (validated against the cap and the file size: kCorrupt).
// kInvalidArgument if `first8` is shorter than 8 bytes of a file that has them.
Result<uint64_t> HeaderBytesNeeded(ByteSpan first8, uint64_t file_size);

// Parses the header of the file at `path` (reads only the header).
Result<SafetensorsHeader> ReadSafetensorsHeader(const std::filesystem::path& path);

// Serializes a header for `tensors` laid out contiguously in the given order:
// the 8-byte length, the JSON, and space padding to a multiple of 8.
std::vector<std::byte> SerializeSafetensorsHeader(
    const std::vector<TensorSpec>& tensors, const std::map<std::string, std::string>& metadata);

// Writes a safetensors file tensor by tensor, so a checkpoint of any size is written
// with memory for one slice at a time.
class SafetensorsWriter {
 public:
  // Creates (truncates) `path` and writes the header for `tensors` in that order.
  // kInvalidArgument for tensors the parser would refuse (bad or duplicate names,
  // sizes that overflow). Not atomic: write to a temporary name and rename if a
  // reader must never see a partial file.
  static Result<std::unique_ptr<SafetensorsWriter>> Create(
      const std::filesystem::path& path, const std::vector<TensorSpec>& tensors,
      const std::map<std::string, std::string>& metadata = {});
  // Closes the file if Finish was not called; a partial file is left behind.
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends the next bytes of tensor data (in tensor order; slices may be any size).
  // kInvalidArgument (nothing written) if it would exceed the declared total.
  Status Append(ByteSpan data);
  // Checks that exactly the declared number of bytes was appended, fsyncs, closes.
  // A short count is kFailedPrecondition and leaves the writer open to append the
  // rest; after any other outcome the file is closed.
  Status Finish();

 private:
  SafetensorsWriter(int fd, std::filesystem::path path, uint64_t expected_data_bytes);
  int fd_;
  std::filesystem::path path_;
  uint64_t expected_data_bytes_;
  uint64_t written_data_bytes_ = 0;
};

}  // namespace deltacast::apply
