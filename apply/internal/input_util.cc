#include "apply/internal/input_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <new>
#include <unordered_set>
#include <utility>

#include "apply/safetensors.h"

namespace deltacast::apply::internal {
namespace {

using Json = nlohmann::json;

// One object being parsed: the keys seen so far and the latest, which names the
// object's child for error messages.
struct OpenObject {
  std::unordered_set<std::string> keys;
  std::string last_key;
};

Status ReadAt(int fd, uint64_t offset, std::byte* out, size_t n,
              const std::filesystem::path& path) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, out + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "read " + path.string());
    }
    if (r == 0) {
      return Status::Corrupt(path.string() + ": file ended at byte " +
                             std::to_string(offset + got) +
                             " while reading its header (shrunk while being read?)");
    }
    got += static_cast<size_t>(r);
  }
  return Status::Ok();
}

// Parses `text` with `callback` watching each event (it notes problems the parser
// cannot stop for); ill-formed JSON is kCorrupt, running out of memory
// kResourceExhausted, each message after `context`.
Result<Json> ParseWatched(std::string_view text, const Json::parser_callback_t& callback,
                          std::string_view context) {
  try {
    return Json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (const Json::exception& e) {
    return Status::Corrupt(std::string(context) + "ill-formed JSON: " + e.what());
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(std::string(context) + "out of memory parsing " +
                                     std::to_string(text.size()) + " bytes of JSON");
  }
}

}  // namespace

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

Result<Json> ParseStrictJson(std::string_view text) {
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return Status::Corrupt("ill-formed JSON: a NUL byte at offset " + std::to_string(nul));
  }
  std::vector<OpenObject> open;
  std::string duplicate;  // the first problem seen; the parser cannot be stopped early
  bool too_deep = false;
  auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) -> bool {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth) too_deep = true;
        if (event == Json::parse_event_t::object_start) open.emplace_back();
        return true;
      case Json::parse_event_t::object_end:
        if (!open.empty()) open.pop_back();
        return true;
      case Json::parse_event_t::key: {
        if (open.empty()) return true;
        const auto& key = parsed.get_ref<const std::string&>();
        if (!open.back().keys.insert(key).second && duplicate.empty()) {
          duplicate = "duplicate key " + Quote(key);
          duplicate += open.size() >= 2 ? " inside " + Quote(open[open.size() - 2].last_key)
                                        : std::string(" at the top level");
        }
        open.back().last_key = key;
        return true;
      }
      case Json::parse_event_t::array_end:
      case Json::parse_event_t::value:
        return true;
    }
    return true;
  };
  ASSIGN_OR_RETURN(Json root, ParseWatched(text, callback, ""));
  if (too_deep) {
    return Status::Corrupt("JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  if (!duplicate.empty()) return Status::Corrupt(duplicate);
  return root;
}

bool ValidUtf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    const unsigned char c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    size_t n = 0;
    uint32_t cp = 0;
    if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (static_cast<size_t>(end - p) <= n) return false;
    for (size_t i = 1; i <= n; ++i) {
      if ((p[i] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i] & 0x3F);
    }
    if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    p += n + 1;
  }
  return true;
}

Result<JsonEntries> ParseSafetensorsJson(std::string_view text) {
  // serde_json's recursion limit.
  constexpr int kMaxDepth = 128;
  // nlohmann stops at a NUL byte and accepts what came before; in JSON text a NUL
  // is never valid (serde_json: trailing characters), so padding with NULs is not.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return Status::Corrupt("header: ill-formed JSON: a NUL byte at offset " + std::to_string(nul));
  }
  JsonEntries out;
  std::string problem;  // the first one seen; the parser cannot be stopped early
  bool too_deep = false;
  std::string top_key;                     // the top-level key being read
  std::unordered_set<std::string> fields;  // of the tensor entry object being read
  bool metadata_seen = false;
  bool in_entry_object = false;  // reading a tensor entry that is an object
  auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) -> bool {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (depth >= kMaxDepth) too_deep = true;
        if (event == Json::parse_event_t::object_start && depth == 1) {
          in_entry_object = top_key != "__metadata__";
          fields.clear();
        }
        return true;
      case Json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        if (depth == 1) {
          top_key = key;
          if (key == "__metadata__" && std::exchange(metadata_seen, true) && problem.empty()) {
            problem = "duplicate key '__metadata__' at the top level";
          }
        } else if (depth == 2 && in_entry_object &&
                   (key == "dtype" || key == "shape" || key == "data_offsets") &&
                   !fields.insert(key).second && problem.empty()) {
          problem = "duplicate field " + Quote(key) + " in tensor " + Quote(top_key);
        }
        return true;
      }
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
      case Json::parse_event_t::value:
        // A completed top-level value: kept even if its key comes again.
        if (depth == 1) {
          out.entries.emplace_back(top_key, parsed);
          in_entry_object = false;
        }
        return true;
    }
    return true;
  };
  ASSIGN_OR_RETURN(Json root, ParseWatched(text, callback, "header: "));
  if (too_deep) {
    return Status::Corrupt("header: JSON nested deeper than " + std::to_string(kMaxDepth) +
                           " levels");
  }
  if (!problem.empty()) return Status::Corrupt("header: " + problem);
  if (!root.is_object()) {
    return Status::Corrupt("header is " + std::string(root.type_name()) + ", not a JSON object");
  }
  return out;
}

std::optional<uint64_t> CheckedByteSize(DType dtype, const std::vector<uint64_t>& shape) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  uint64_t n = ElementSize(dtype);
  for (uint64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  return n;
}

Status CheckPlainName(std::string_view name, std::string_view what) {
  const std::string w(what);
  if (name.empty()) return Status::InvalidArgument(w + " is empty");
  if (name == "." || name == "..") {
    return Status::InvalidArgument(w + " " + Quote(name) + " is a path component");
  }
  for (char c : name) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '/' || c == '\\') {
      return Status::InvalidArgument(w + " " + Quote(name) + " contains a path separator");
    }
    if (u < 0x20 || u == 0x7f) {
      return Status::InvalidArgument(w + " " + Quote(name) + " contains a control character");
    }
  }
  return Status::Ok();
}

std::string Quote(std::string_view s) {
  static constexpr size_t kMaxShown = 120;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < kMaxShown; ++i) {
    const auto u = static_cast<unsigned char>(s[i]);
    if (u < 0x20 || u >= 0x7f || u == '\\' || u == '\'') {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += static_cast<char>(u);
    }
  }
  out += "'";
  if (s.size() > kMaxShown) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

Result<SafetensorsPrefix> ReadSafetensorsPrefix(const std::filesystem::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return Status::NotFound(path.string() + ": no such file");
    return Status::FromErrno(errno, "open " + path.string());
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "stat " + path.string());
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(path.string() + ": not a regular file");
  SafetensorsPrefix prefix;
  prefix.file_size = static_cast<uint64_t>(st.st_size);
  std::byte first8[8];
  const size_t have = prefix.file_size < 8 ? static_cast<size_t>(prefix.file_size) : 8;
  RETURN_IF_ERROR(ReadAt(fd.get(), 0, first8, have, path));
  auto needed = HeaderBytesNeeded(ByteSpan(first8, have), prefix.file_size);
  if (!needed.ok()) return needed.status().WithContext(path.string());
  try {
    prefix.bytes.resize(static_cast<size_t>(*needed));
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(path.string() + ": out of memory for a " +
                                     std::to_string(*needed) + "-byte header");
  }
  RETURN_IF_ERROR(ReadAt(fd.get(), 0, prefix.bytes.data(), prefix.bytes.size(), path));
  return prefix;
}

}  // namespace deltacast::apply::internal
