// Helpers shared by the apply/ parsers of on-disk input (safetensors headers and
// the checkpoint index file): strict JSON, name checks, bounded error messages.
//
// Thread safety: free functions; thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace deltacast::apply::internal {

// JSON deeper than this is refused: the formats parsed here nest at most 3 levels
// (index metadata is free-form, so leave room), and the cap bounds parser work.
inline constexpr int kMaxJsonDepth = 64;

// Whether `text` is valid UTF-8 (RFC 3629: no overlong forms, surrogates or code
// points above U+10FFFF), as Rust's str::from_utf8 requires.
bool ValidUtf8(std::string_view text);

// A safetensors header's top-level entries, in file order, duplicates included.
struct JsonEntries {
  std::vector<std::pair<std::string, nlohmann::json>> entries;
};
// Parses a safetensors header as the reference does (serde_json into its structs):
// a JSON object, nested at most 128 deep; "__metadata__" at most once; within a
// tensor entry object, dtype, shape and data_offsets at most once each (serde's
// derived structs refuse those duplicates); any other repeated key is allowed (the
// reference's maps keep the last). kCorrupt saying what failed.
Result<JsonEntries> ParseSafetensorsJson(std::string_view text);

// Parses `text` as one JSON document. Unlike plain nlohmann::json::parse, which keeps
// the last of two equal keys, a key repeated in any object at any depth is an error,
// as is nesting deeper than kMaxJsonDepth. Errors are kCorrupt and say what failed.
Result<nlohmann::json> ParseStrictJson(std::string_view text);

// OK when `name` is safe to use as a single path component and in a log line: not
// empty, not "." or "..", and without '/', '\\', NUL or other control characters.
// Otherwise kInvalidArgument saying why; `what` names the thing ("tensor name").
Status CheckPlainName(std::string_view name, std::string_view what);

// Bytes of a tensor of `dtype` and `shape`, or nullopt when that overflows 64 bits.
// A zero extent makes the tensor empty whatever the other extents are.
std::optional<uint64_t> CheckedByteSize(DType dtype, const std::vector<uint64_t>& shape);

// `s` in single quotes for an error message, with control and non-ASCII bytes as
// \xNN and long strings cut short, so a hostile name cannot flood or forge logs.
std::string Quote(std::string_view s);

// Owns a file descriptor; closes it on destruction.
class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// The first bytes of a safetensors file: its 8-byte length prefix and JSON header.
struct SafetensorsPrefix {
  std::vector<std::byte> bytes;
  uint64_t file_size = 0;
};

// Reads exactly the header of the safetensors file at `path` (length validated
// against the cap and the file size before anything is allocated). Errors name
// the path; a missing file is kNotFound.
Result<SafetensorsPrefix> ReadSafetensorsPrefix(const std::filesystem::path& path);

}  // namespace deltacast::apply::internal
