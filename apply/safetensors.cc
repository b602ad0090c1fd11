#include "apply/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>
#include <tuple>
#include <utility>

#include "apply/internal/input_util.h"
#include "common/file_util.h"

namespace deltacast::apply {
namespace {

using Json = nlohmann::json;
using internal::CheckedByteSize;
using internal::Quote;

constexpr std::string_view kMetadataKey = "__metadata__";

std::string ShapeString(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// A JSON value for an error message: short, and never raw control bytes.
std::string DumpForMessage(const Json& v) {
  return Quote(v.dump(-1, ' ', /*ensure_ascii=*/true, Json::error_handler_t::replace));
}

// Reads a JSON number that must be a non-negative integer (nlohmann stores those
// as number_unsigned; negatives are number_integer, 1.0 and 1e3 are number_float).
std::optional<uint64_t> AsUint64(const Json& v) {
  if (!v.is_number_unsigned()) return std::nullopt;
  return v.get<uint64_t>();
}

Result<SafetensorsEntry> ParseEntry(const std::string& name, const Json& value) {
  auto corrupt = [&](const std::string& what) {
    return Status::Corrupt("tensor " + Quote(name) + ": " + what);
  };
  if (!value.is_object()) return corrupt("entry is " + DumpForMessage(value) + ", not an object");
  for (const auto& [key, unused] : value.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return corrupt("unknown field " + Quote(key) +
                     " (expected exactly dtype, shape and data_offsets)");
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(key)) return corrupt(std::string("missing field '") + key + "'");
  }
  SafetensorsEntry entry;
  entry.info.name = name;

  const Json& dtype = value["dtype"];
  if (!dtype.is_string()) return corrupt("dtype " + DumpForMessage(dtype) + " is not a string");
  auto parsed_dtype = ParseDType(dtype.get_ref<const std::string&>());
  if (!parsed_dtype) return corrupt("unknown dtype " + Quote(dtype.get_ref<const std::string&>()));
  entry.info.dtype = *parsed_dtype;

  const Json& shape = value["shape"];
  if (!shape.is_array()) return corrupt("shape " + DumpForMessage(shape) + " is not a list");
  for (const Json& d : shape) {
    auto extent = AsUint64(d);
    if (!extent) {
      return corrupt("shape " + DumpForMessage(shape) + " has " + DumpForMessage(d) +
                     ", not a non-negative integer");
    }
    entry.info.shape.push_back(*extent);
  }
  auto bytes = CheckedByteSize(entry.info.dtype, entry.info.shape);
  if (!bytes) {
    return corrupt("shape " + ShapeString(entry.info.shape) + " of " +
                   std::string(DTypeName(entry.info.dtype)) + " overflows 64 bits of bytes");
  }

  const Json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    return corrupt("data_offsets " + DumpForMessage(offsets) + " is not a [begin, end] pair");
  }
  auto begin = AsUint64(offsets[0]);
  auto end = AsUint64(offsets[1]);
  if (!begin || !end) {
    return corrupt("data_offsets " + DumpForMessage(offsets) + " must hold non-negative integers");
  }
  if (*begin > *end) {
    return corrupt("data_offsets [" + std::to_string(*begin) + ", " + std::to_string(*end) +
                   "] ends before it begins");
  }
  entry.data_begin = *begin;
  entry.data_end = *end;
  if (*end - *begin != *bytes) {
    return corrupt("data_offsets [" + std::to_string(*begin) + ", " + std::to_string(*end) +
                   "] span " + std::to_string(*end - *begin) + " bytes but shape " +
                   ShapeString(entry.info.shape) + " of " +
                   std::string(DTypeName(entry.info.dtype)) + " needs " + std::to_string(*bytes));
  }
  return entry;
}

// Appends `s` as a JSON string. Bytes >= 0x80 pass through: names are UTF-8.
void AppendJsonString(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      out += "\\u00";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  out += '"';
}

}  // namespace

Result<uint64_t> HeaderBytesNeeded(ByteSpan first8, uint64_t file_size) {
  if (file_size < 8) {
    return Status::Corrupt("file is " + std::to_string(file_size) +
                           " bytes, too small for the 8-byte header length");
  }
  if (first8.size() < 8) {
    return Status::InvalidArgument("the 8-byte header length needs the first 8 bytes; got " +
                                   std::to_string(first8.size()));
  }
  const auto json_bytes = LoadLE<uint64_t>(first8.data());
  if (json_bytes > kMaxSafetensorsHeaderBytes) {
    return Status::Corrupt("header length " + std::to_string(json_bytes) +
                           " exceeds the limit of " + std::to_string(kMaxSafetensorsHeaderBytes) +
                           " bytes");
  }
  if (json_bytes > file_size - 8) {
    return Status::Corrupt("header length " + std::to_string(json_bytes) +
                           " runs past the end of the " + std::to_string(file_size) + "-byte file");
  }
  return 8 + json_bytes;
}

Result<SafetensorsHeader> ParseSafetensorsHeader(ByteSpan prefix, uint64_t file_size) {
  ASSIGN_OR_RETURN(const uint64_t needed, HeaderBytesNeeded(prefix, file_size));
  if (prefix.size() < needed) {
    return Status::InvalidArgument("safetensors header needs the first " + std::to_string(needed) +
                                   " bytes of the file; got " + std::to_string(prefix.size()));
  }
  auto root = internal::ParseStrictJson(AsChars(prefix.subspan(8, needed - 8)));
  if (!root.ok()) return root.status().WithContext("header");
  if (!root->is_object()) {
    return Status::Corrupt("header is " + std::string(root->type_name()) + ", not a JSON object");
  }

  SafetensorsHeader header;
  header.data_section_offset = needed;
  for (const auto& [key, value] : root->items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) {
        return Status::Corrupt("__metadata__ is " + DumpForMessage(value) + ", not an object");
      }
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) {
          return Status::Corrupt("__metadata__ value for " + Quote(mkey) + " is " +
                                 DumpForMessage(mvalue) + ", not a string");
        }
        header.metadata.emplace(mkey, mvalue.get<std::string>());
      }
      continue;
    }
    Status name_ok = internal::CheckPlainName(key, "tensor name");
    if (!name_ok.ok()) return Status::Corrupt(name_ok.message());
    ASSIGN_OR_RETURN(SafetensorsEntry entry, ParseEntry(key, value));
    if (entry.data_end > file_size - needed) {
      return Status::Corrupt("tensor " + Quote(key) + ": data_offsets [" +
                             std::to_string(entry.data_begin) + ", " +
                             std::to_string(entry.data_end) + "] run past the " +
                             std::to_string(file_size - needed) + "-byte data section");
    }
    header.entries.push_back(std::move(entry));
  }

  // Every byte of the data section belongs to exactly one tensor: walking the
  // tensors in offset order must step from 0 to the end of the file without a
  // gap or a step back. Empty tensors sort before a non-empty one at the same offset.
  const uint64_t data_bytes = file_size - needed;
  std::sort(header.entries.begin(), header.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return std::tie(a.data_begin, a.data_end, a.info.name) <
                     std::tie(b.data_begin, b.data_end, b.info.name);
            });
  uint64_t cursor = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& e : header.entries) {
    const std::string offsets =
        "[" + std::to_string(e.data_begin) + ", " + std::to_string(e.data_end) + "]";
    if (e.data_begin > cursor) {
      return Status::Corrupt("gap of " + std::to_string(e.data_begin - cursor) +
                             " bytes before tensor " + Quote(e.info.name) + " (data_offsets " +
                             offsets + ", previous data ends at " + std::to_string(cursor) + ")");
    }
    if (e.data_begin < cursor) {
      return Status::Corrupt("tensor " + Quote(e.info.name) + " (data_offsets " + offsets +
                             ") overlaps tensor " + Quote(previous->info.name) +
                             ", which ends at " + std::to_string(cursor));
    }
    cursor = e.data_end;
    previous = &e;
  }
  if (cursor != data_bytes) {
    return Status::Corrupt(std::to_string(data_bytes - cursor) +
                           " trailing bytes after the last tensor (tensor data ends at " +
                           std::to_string(cursor) + ", the data section has " +
                           std::to_string(data_bytes) + " bytes)");
  }
  return header;
}

Result<SafetensorsHeader> ReadSafetensorsHeader(const std::filesystem::path& path) {
  ASSIGN_OR_RETURN(internal::SafetensorsPrefix prefix, internal::ReadSafetensorsPrefix(path));
  auto header = ParseSafetensorsHeader(prefix.bytes, prefix.file_size);
  if (!header.ok()) return header.status().WithContext(path.string());
  return header;
}

std::vector<std::byte> SerializeSafetensorsHeader(
    const std::vector<codec::TensorInfo>& tensors,
    const std::map<std::string, std::string>& metadata) {
  // Compact JSON, as the reference implementation writes it.
  std::string json = "{";
  if (!metadata.empty()) {
    AppendJsonString(json, kMetadataKey);
    json += ":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) json += ',';
      first = false;
      AppendJsonString(json, key);
      json += ':';
      AppendJsonString(json, value);
    }
    json += '}';
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (json.size() > 1) json += ',';
    AppendJsonString(json, t.name);
    json += ":{\"dtype\":";
    AppendJsonString(json, DTypeName(t.dtype));
    json += ",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i > 0) json += ',';
      json += std::to_string(t.shape[i]);
    }
    const uint64_t end = offset + t.ByteSize();
    json += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) + "]}";
    offset = end;
  }
  json += '}';
  json.resize((json.size() + 7) / 8 * 8, ' ');

  std::vector<std::byte> out;
  out.reserve(8 + json.size());
  ByteWriter writer(out);
  writer.Put<uint64_t>(json.size());
  writer.PutString(json);
  return out;
}

Result<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::filesystem::path& path, const std::vector<codec::TensorInfo>& tensors,
    const std::map<std::string, std::string>& metadata) {
  // Refuse to write what ParseSafetensorsHeader would refuse to read.
  std::set<std::string_view> names;
  uint64_t total = 0;
  for (const auto& t : tensors) {
    RETURN_IF_ERROR(internal::CheckPlainName(t.name, "tensor name"));
    if (t.name == kMetadataKey) {
      return Status::InvalidArgument("tensor name '__metadata__' is reserved");
    }
    if (!names.insert(t.name).second) {
      return Status::InvalidArgument("duplicate tensor name " + Quote(t.name));
    }
    auto bytes = CheckedByteSize(t.dtype, t.shape);
    if (!bytes || __builtin_add_overflow(total, *bytes, &total)) {
      return Status::InvalidArgument("tensor " + Quote(t.name) + ": size overflows 64 bits");
    }
  }
  std::vector<std::byte> header = SerializeSafetensorsHeader(tensors, metadata);
  if (header.size() - 8 > kMaxSafetensorsHeaderBytes) {
    return Status::InvalidArgument("header of " + std::to_string(header.size() - 8) +
                                   " bytes exceeds the limit of " +
                                   std::to_string(kMaxSafetensorsHeaderBytes));
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno(errno, "create " + path.string());
  std::unique_ptr<SafetensorsWriter> writer(new SafetensorsWriter(fd, path, total));
  RETURN_IF_ERROR(WriteAll(fd, header, path));
  return writer;
}

SafetensorsWriter::SafetensorsWriter(int fd, std::filesystem::path path,
                                     uint64_t expected_data_bytes)
    : fd_(fd), path_(std::move(path)), expected_data_bytes_(expected_data_bytes) {}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

Status SafetensorsWriter::Append(ByteSpan data) {
  if (fd_ < 0) return Status::FailedPrecondition(path_.string() + ": writer already finished");
  if (data.size() > expected_data_bytes_ - written_data_bytes_) {
    return Status::InvalidArgument(
        path_.string() + ": appending " + std::to_string(data.size()) +
        " bytes would exceed the declared " + std::to_string(expected_data_bytes_) +
        " bytes of tensor data (" + std::to_string(written_data_bytes_) + " written)");
  }
  RETURN_IF_ERROR(WriteAll(fd_, data, path_));
  written_data_bytes_ += data.size();
  return Status::Ok();
}

Status SafetensorsWriter::Finish() {
  if (fd_ < 0) return Status::FailedPrecondition(path_.string() + ": writer already finished");
  if (written_data_bytes_ != expected_data_bytes_) {
    return Status::FailedPrecondition(path_.string() + ": " + std::to_string(written_data_bytes_) +
                                      " of " + std::to_string(expected_data_bytes_) +
                                      " bytes of tensor data written");
  }
  const int fd = std::exchange(fd_, -1);
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::FromErrno(err, "fsync " + path_.string());
  }
  if (::close(fd) != 0) return Status::FromErrno(errno, "close " + path_.string());
  return Status::Ok();
}

}  // namespace deltacast::apply
