// File helpers with the durability rules deltacast relies on (docs/recovery.md):
// a file that must survive a crash is written to a temporary name, fsynced, renamed
// over the old one, and its directory fsynced.
//
// Thread safety: functions are thread-safe for distinct paths.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "common/bytes.h"
#include "common/status.h"

namespace deltacast {

// Reads a whole file; refuses files larger than `max_bytes`.
Result<std::vector<std::byte>> ReadFile(const std::filesystem::path& path,
                                        uint64_t max_bytes = uint64_t{1} << 30);

// Replaces `path` with `data` atomically and durably (write tmp, fsync, rename,
// fsync directory). On failure the old file is intact.
Status WriteFileAtomic(const std::filesystem::path& path, ByteSpan data);

// Writes all of `data` to `fd` (retrying short writes and EINTR); `path` names the
// file in the error.
Status WriteAll(int fd, ByteSpan data, const std::filesystem::path& path);

// Appends `line` and a newline to `path` (created if missing) and fsyncs it; when the
// file was empty (just created), its directory too, so the name survives a machine crash.
Status AppendLineDurably(const std::filesystem::path& path, std::string_view line);

// Writes `data` to a new or truncated file without durability guarantees.
Status WriteFile(const std::filesystem::path& path, ByteSpan data);

Status FsyncDirectory(const std::filesystem::path& dir);

// Makes `path`'s bytes durable (its name is its directory's: FsyncDirectory).
Status FsyncFile(const std::filesystem::path& path);

// Gives `to` (which must not exist) the bytes of `from`: a hard link, else (another
// file system) a copy; fsynced either way. The name is not: sync `to`'s directory.
Status LinkOrCopyDurably(const std::filesystem::path& from, const std::filesystem::path& to);

// create_directories that survives a machine crash: each directory it creates has
// its parent fsynced (a new directory's name is durable only then, and with it
// everything later made durable inside). Nothing to do if `dir` exists.
Status CreateDirectoriesDurably(const std::filesystem::path& dir);

}  // namespace deltacast
