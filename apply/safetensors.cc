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
#include "codec/chunk.h"
#include "common/disk_seam.h"
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

// A JSON number as the reference reads a usize: a non-negative integer that fits
// 64 bits. nlohmann stores those as number_unsigned, "-0" as number_integer 0 (the
// reference takes it as 0); 1.0 and 1e3 are floats and refused, as there.
std::optional<uint64_t> AsUint64(const Json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() == 0) return 0;
  return std::nullopt;
}

// The reference's element count and size: the product of the extents folded left to
// right, each step checked (so [2^40, 2^40, 0] overflows before the 0, as there),
// then times the dtype's bits, checked too. nullopt on overflow.
std::optional<uint64_t> ReferenceByteSize(DType dtype, const std::vector<uint64_t>& shape) {
  uint64_t elements = 1;
  for (uint64_t d : shape) {
    if (__builtin_mul_overflow(elements, d, &elements)) return std::nullopt;
  }
  uint64_t bits = 0;
  if (__builtin_mul_overflow(elements, uint64_t{8} * ElementSize(dtype), &bits)) {
    return std::nullopt;
  }
  return bits / 8;
}

// Dtypes the reference reads that deltacast cannot carry: elements narrower than a
// byte (partitions and XOR words are whole elements).
bool SubByteDType(std::string_view name) {
  return name == "F4" || name == "F6_E2M3" || name == "F6_E3M2";
}

// The dtype field as serde reads an enum: "NAME", or {"NAME": null}.
std::optional<std::string> DTypeText(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.size() == 1 && v.begin().value().is_null()) return v.begin().key();
  return std::nullopt;
}

Result<SafetensorsEntry> ParseEntry(const std::string& name, const Json& value) {
  auto corrupt = [&](const std::string& what) {
    return Status::Corrupt("tensor " + Quote(name) + ": " + what);
  };
  // The reference reads an entry as a struct: an object (fields it does not know
  // are ignored; duplicates of those it does were refused while parsing) or an
  // array of exactly the three fields in order.
  const Json* dtype = nullptr;
  const Json* shape = nullptr;
  const Json* offsets = nullptr;
  if (value.is_object()) {
    for (const char* key : {"dtype", "shape", "data_offsets"}) {
      if (!value.contains(key)) return corrupt(std::string("missing field '") + key + "'");
    }
    dtype = &value["dtype"];
    shape = &value["shape"];
    offsets = &value["data_offsets"];
  } else if (value.is_array() && value.size() == 3) {
    dtype = &value[0];
    shape = &value[1];
    offsets = &value[2];
  } else {
    return corrupt("entry is " + DumpForMessage(value) +
                   ", not an object (or [dtype, shape, data_offsets])");
  }
  SafetensorsEntry entry;
  entry.info.name = name;

  const auto dtype_name = DTypeText(*dtype);
  if (!dtype_name) return corrupt("dtype " + DumpForMessage(*dtype) + " is not a dtype name");
  auto parsed_dtype = ParseDType(*dtype_name);
  if (!parsed_dtype) {
    if (SubByteDType(*dtype_name)) {
      return Status::Unsupported("tensor " + Quote(name) + ": dtype " + Quote(*dtype_name) +
                                 " packs elements narrower than a byte, which deltacast cannot "
                                 "carry (valid safetensors, but unsupported)");
    }
    return corrupt("unknown dtype " + Quote(*dtype_name));
  }
  entry.info.dtype = *parsed_dtype;

  if (!shape->is_array()) return corrupt("shape " + DumpForMessage(*shape) + " is not a list");
  for (const Json& d : *shape) {
    auto extent = AsUint64(d);
    if (!extent) {
      return corrupt("shape " + DumpForMessage(*shape) + " has " + DumpForMessage(d) +
                     ", not a non-negative integer");
    }
    entry.info.shape.push_back(*extent);
  }

  if (!offsets->is_array() || offsets->size() != 2) {
    return corrupt("data_offsets " + DumpForMessage(*offsets) + " is not a [begin, end] pair");
  }
  auto begin = AsUint64((*offsets)[0]);
  auto end = AsUint64((*offsets)[1]);
  if (!begin || !end) {
    return corrupt("data_offsets " + DumpForMessage(*offsets) + " must hold non-negative integers");
  }
  entry.data_begin = *begin;
  entry.data_end = *end;
  return entry;
}

// The reference's size rule for an entry at its place in offset order.
Status CheckEntrySize(const SafetensorsEntry& e) {
  auto bytes = ReferenceByteSize(e.info.dtype, e.info.shape);
  if (!bytes) {
    return Status::Corrupt("tensor " + Quote(e.info.name) + ": shape " + ShapeString(e.info.shape) +
                           " of " + std::string(DTypeName(e.info.dtype)) + " overflows 64 bits");
  }
  if (e.data_end - e.data_begin != *bytes) {
    return Status::Corrupt(
        "tensor " + Quote(e.info.name) + ": data_offsets [" + std::to_string(e.data_begin) + ", " +
        std::to_string(e.data_end) + "] span " + std::to_string(e.data_end - e.data_begin) +
        " bytes but shape " + ShapeString(e.info.shape) + " of " +
        std::string(DTypeName(e.info.dtype)) + " needs " + std::to_string(*bytes));
  }
  return Status::Ok();
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
  const std::string_view text = AsChars(prefix.subspan(8, needed - 8));
  // The reference reads the header as UTF-8 text, then as JSON (serde_json): a byte
  // order mark is not whitespace there (nlohmann would skip it).
  if (!internal::ValidUtf8(text)) return Status::Corrupt("header is not valid UTF-8");
  if (text.starts_with("\xEF\xBB\xBF")) {
    return Status::Corrupt("header starts with a byte order mark");
  }
  ASSIGN_OR_RETURN(internal::JsonEntries parsed, internal::ParseSafetensorsJson(text));

  SafetensorsHeader header;
  header.data_section_offset = needed;
  // Entries in file order; a tensor named twice keeps its last entry, as the
  // reference's map does, but every entry must parse (the reference reads each).
  std::map<std::string, SafetensorsEntry> by_name;
  for (const auto& [key, value] : parsed.entries) {
    if (key == kMetadataKey) {
      if (value.is_null()) continue;  // Option<...>: null is none
      if (!value.is_object()) {
        return Status::Corrupt("__metadata__ is " + DumpForMessage(value) + ", not an object");
      }
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) {
          return Status::Corrupt("__metadata__ value for " + Quote(mkey) + " is " +
                                 DumpForMessage(mvalue) + ", not a string");
        }
        header.metadata.insert_or_assign(mkey, mvalue.get<std::string>());
      }
      continue;
    }
    ASSIGN_OR_RETURN(SafetensorsEntry entry, ParseEntry(key, value));
    by_name.insert_or_assign(key, std::move(entry));
  }
  for (auto& [name, entry] : by_name) header.entries.push_back(std::move(entry));

  // The reference's validation: in (begin, end) order every tensor starts where the
  // previous ended (no gap, no overlap), does not end before it begins, and spans
  // exactly its shape's bytes; the last ends at the end of the file. Empty tensors
  // sort before a non-empty one at the same offset.
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
    if (e.data_end < e.data_begin) {
      return Status::Corrupt("tensor " + Quote(e.info.name) + ": data_offsets " + offsets +
                             " end before they begin");
    }
    RETURN_IF_ERROR(CheckEntrySize(e));
    cursor = e.data_end;
    previous = &e;
  }
  if (cursor != data_bytes) {
    return Status::Corrupt(cursor < data_bytes
                               ? std::to_string(data_bytes - cursor) +
                                     " trailing bytes after the last tensor (tensor data ends at " +
                                     std::to_string(cursor) + ", the data section has " +
                                     std::to_string(data_bytes) + " bytes)"
                               : "tensor data ends at " + std::to_string(cursor) + ", past the " +
                                     std::to_string(data_bytes) + "-byte data section");
  }
  // Valid safetensors; what deltacast itself cannot carry is refused as unsupported.
  for (const SafetensorsEntry& e : header.entries) {
    if (e.info.name.empty() || e.info.name.size() > codec::kMaxTensorNameBytes) {
      return Status::Unsupported("tensor name " + Quote(e.info.name) + " of " +
                                 std::to_string(e.info.name.size()) +
                                 " bytes: deltacast carries names of 1 to " +
                                 std::to_string(codec::kMaxTensorNameBytes) + " bytes");
    }
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
    const std::vector<TensorSpec>& tensors, const std::map<std::string, std::string>& metadata) {
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
    const std::filesystem::path& path, const std::vector<TensorSpec>& tensors,
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
  disk::Created(path);
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
  disk::Synced(path_);
  return Status::Ok();
}

}  // namespace deltacast::apply
