#include "apply/checkpoint_dir.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <set>
#include <system_error>
#include <utility>

#include "apply/internal/input_util.h"
#include "apply/safetensors.h"
#include "common/disk_seam.h"
#include "common/file_util.h"

namespace deltacast::apply {
namespace {

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14; older C libraries lack the name
#endif
// Cleared for good the first time the kernel refuses MADV_POPULATE_READ.
std::atomic<bool> populate_works{true};

namespace fs = std::filesystem;
using Json = nlohmann::json;
using internal::Quote;

constexpr std::string_view kSafetensorsSuffix = ".safetensors";
// A tensor name and a file name per entry: ~100 bytes each, so this allows millions
// of tensors while still refusing a runaway file before reading it.
constexpr uint64_t kMaxIndexBytes = 256ull << 20;

struct FileHeader {
  CheckpointFile file;
  SafetensorsHeader header;
};

Result<FileHeader> ReadFileHeader(const fs::path& dir, const std::string& name) {
  const fs::path path = dir / name;
  ASSIGN_OR_RETURN(internal::SafetensorsPrefix prefix, internal::ReadSafetensorsPrefix(path));
  auto header = ParseSafetensorsHeader(prefix.bytes, prefix.file_size);
  if (!header.ok()) return header.status().WithContext(path.string());
  FileHeader out;
  out.file.name = name;
  out.file.size = prefix.file_size;
  out.file.header_hash = Hash64(prefix.bytes);
  out.file.data_offset = header->data_section_offset;
  out.header = std::move(header).value();
  return out;
}

struct Index {
  std::map<std::string, std::string> weight_map;  // tensor name -> file name
  uint64_t hash = 0;
};

Result<Index> ReadIndex(const fs::path& path) {
  ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadFile(path, kMaxIndexBytes));
  ASSIGN_OR_RETURN(auto weight_map, ParseCheckpointIndex(bytes, path.string()));
  return Index{std::move(weight_map), Hash64(bytes)};
}

}  // namespace

Result<std::map<std::string, std::string>> ParseCheckpointIndex(ByteSpan bytes,
                                                                std::string_view context_name) {
  const std::string context(context_name);
  auto root = internal::ParseStrictJson(AsChars(bytes));
  if (!root.ok()) return root.status().WithContext(context);
  auto corrupt = [&](const std::string& what) { return Status::Corrupt(context + ": " + what); };
  if (!root->is_object()) {
    return corrupt("index is " + std::string(root->type_name()) + ", not a JSON object");
  }
  for (const auto& [key, value] : root->items()) {
    if (key == "metadata") {
      if (!value.is_object()) return corrupt("\"metadata\" is not an object");
    } else if (key != "weight_map") {
      return corrupt("unknown key " + Quote(key) + " (expected weight_map and metadata)");
    }
  }
  if (!root->contains("weight_map")) return corrupt("missing \"weight_map\"");
  const Json& map = (*root)["weight_map"];
  if (!map.is_object()) return corrupt("\"weight_map\" is not an object");
  if (map.empty()) return corrupt("\"weight_map\" lists no tensors");

  std::map<std::string, std::string> weight_map;
  for (const auto& [tensor, file] : map.items()) {
    Status name_ok = internal::CheckPlainName(tensor, "tensor name");
    if (!name_ok.ok()) return corrupt("weight_map: " + name_ok.message());
    if (!file.is_string()) {
      return corrupt("weight_map: tensor " + Quote(tensor) + " maps to a " +
                     std::string(file.type_name()) + ", not a file name");
    }
    const auto& file_name = file.get_ref<const std::string&>();
    Status file_ok = internal::CheckPlainName(file_name, "file name");
    if (!file_ok.ok()) {
      return corrupt("weight_map: tensor " + Quote(tensor) + ": " + file_ok.message());
    }
    weight_map.emplace(tensor, file_name);
  }
  return weight_map;
}

namespace {

Result<std::vector<std::string>> ListSafetensorsFiles(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= kSafetensorsSuffix.size() || !name.ends_with(kSafetensorsSuffix)) continue;
    std::error_code type_ec;
    // Follows symlinks: Hugging Face cache snapshots link each file to a blob.
    if (!fs::is_regular_file(it->path(), type_ec)) continue;
    names.push_back(name);
  }
  if (ec) return Status::IoError("list " + dir.string() + ": " + ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

Digest128 CheckpointLayout::LayoutId() const {
  Hasher128 h;
  h.UpdateString("deltacast.checkpoint_layout.v1");
  h.UpdateValue<uint64_t>(files.size());
  for (const auto& f : files) {
    h.UpdateString(f.name);
    h.UpdateValue<uint64_t>(f.size);
    h.UpdateValue<uint64_t>(f.header_hash);
  }
  h.UpdateValue<uint64_t>(index_hash);
  h.UpdateValue<uint64_t>(tensors.size());
  for (const auto& t : tensors) {
    h.UpdateString(t.info.name);
    h.UpdateValue<uint32_t>(t.file);
  }
  return h.Finish();
}

Result<CheckpointLayout> ReadCheckpointLayout(const fs::path& dir) {
  std::error_code ec;
  const fs::file_status dir_status = fs::status(dir, ec);
  if (dir_status.type() == fs::file_type::not_found) {
    return Status::NotFound(dir.string() + ": no such checkpoint directory");
  }
  if (ec) return Status::IoError("stat " + dir.string() + ": " + ec.message());
  if (!fs::is_directory(dir_status)) {
    return Status::InvalidArgument(dir.string() + ": not a directory");
  }

  const fs::path index_path = dir / kCheckpointIndexFileName;
  const fs::file_status index_status = fs::status(index_path, ec);
  std::optional<Index> index;
  std::vector<std::string> file_names;
  std::map<std::string, std::string> a_tensor_of_file;  // for error messages
  if (index_status.type() != fs::file_type::not_found) {
    if (ec) return Status::IoError("stat " + index_path.string() + ": " + ec.message());
    if (!fs::is_regular_file(index_status)) {
      return Status::Corrupt(index_path.string() + ": not a regular file");
    }
    ASSIGN_OR_RETURN(index, ReadIndex(index_path));
    for (const auto& [tensor, file] : index->weight_map) a_tensor_of_file.emplace(file, tensor);
    for (const auto& [file, unused] : a_tensor_of_file) file_names.push_back(file);
  } else {
    ASSIGN_OR_RETURN(file_names, ListSafetensorsFiles(dir));
    if (file_names.empty()) {
      return Status::NotFound(dir.string() + ": no *.safetensors files and no " +
                              std::string(kCheckpointIndexFileName));
    }
  }
  if (file_names.size() > UINT32_MAX) {
    return Status::Corrupt(dir.string() + ": too many files (" + std::to_string(file_names.size()) +
                           ")");
  }

  CheckpointLayout layout;
  layout.index_hash = index ? index->hash : 0;
  std::vector<SafetensorsHeader> headers;
  for (const std::string& name : file_names) {
    auto file = ReadFileHeader(dir, name);
    if (!file.ok()) {
      if (index && file.status().code() == StatusCode::kNotFound) {
        return Status::NotFound(index_path.string() + ": maps tensor " +
                                Quote(a_tensor_of_file[name]) + " to file " + Quote(name) +
                                ", which does not exist");
      }
      return file.status();
    }
    layout.files.push_back(std::move(file->file));
    headers.push_back(std::move(file->header));
  }

  for (uint32_t f = 0; f < layout.files.size(); ++f) {
    for (SafetensorsEntry& e : headers[f].entries) {
      layout.tensors.push_back({std::move(e.info), f, layout.files[f].data_offset + e.data_begin});
    }
  }
  std::stable_sort(layout.tensors.begin(), layout.tensors.end(),
                   [](const CheckpointTensor& a, const CheckpointTensor& b) {
                     return a.info.name < b.info.name;
                   });
  for (size_t i = 1; i < layout.tensors.size(); ++i) {
    const auto& a = layout.tensors[i - 1];
    const auto& b = layout.tensors[i];
    if (a.info.name == b.info.name) {
      return Status::Corrupt(dir.string() + ": tensor " + Quote(a.info.name) + " appears in both " +
                             Quote(layout.files[a.file].name) + " and " +
                             Quote(layout.files[b.file].name));
    }
  }

  if (index) {
    for (const CheckpointTensor& t : layout.tensors) {
      const std::string& file = layout.files[t.file].name;
      auto it = index->weight_map.find(t.info.name);
      if (it == index->weight_map.end()) {
        return Status::Corrupt(index_path.string() + ": file " + Quote(file) + " holds tensor " +
                               Quote(t.info.name) + ", which weight_map does not list");
      }
      if (it->second != file) {
        return Status::Corrupt(index_path.string() + ": tensor " + Quote(t.info.name) +
                               " is in file " + Quote(file) + " but weight_map maps it to " +
                               Quote(it->second));
      }
    }
    // Every file tensor is mapped to its own file, so a count mismatch means some
    // mapped tensor is missing from its file.
    if (layout.tensors.size() != index->weight_map.size()) {
      for (const auto& [tensor, file] : index->weight_map) {
        auto it = std::lower_bound(
            layout.tensors.begin(), layout.tensors.end(), tensor,
            [](const CheckpointTensor& t, const std::string& n) { return t.info.name < n; });
        if (it == layout.tensors.end() || it->info.name != tensor) {
          return Status::Corrupt(index_path.string() + ": weight_map maps tensor " + Quote(tensor) +
                                 " to file " + Quote(file) + ", which has no such tensor");
        }
      }
    }
  }
  return layout;
}

namespace {

void TouchEveryPage(const std::byte* data, uint64_t size) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  unsigned sum = 0;
  for (uint64_t at = 0; at < size; at += page) {
    sum += static_cast<unsigned>(*static_cast<const volatile std::byte*>(data + at));
  }
  (void)sum;
}

}  // namespace

// ---- CheckpointDirStore::Mapping ----

Result<CheckpointDirStore::Mapping> CheckpointDirStore::Mapping::Map(int fd, uint64_t size,
                                                                     Access access,
                                                                     const fs::path& path) {
  if (size == 0) {  // mmap refuses length 0; nothing to map or read anyway
    ::close(fd);
    return Mapping();
  }
  const int prot = access == Access::kReadOnly ? PROT_READ : PROT_READ | PROT_WRITE;
  const int flags = access == Access::kPrivate ? MAP_PRIVATE : MAP_SHARED;
  void* addr = ::mmap(nullptr, static_cast<size_t>(size), prot, flags, fd, 0);
  if (addr == MAP_FAILED) {
    const int error = errno;
    ::close(fd);
    return Status::FromErrno(error, "mmap " + path.string());
  }
  return Mapping(addr, size, fd);
}

void CheckpointDirStore::Mapping::Release() {
  if (addr_ != nullptr) ::munmap(addr_, static_cast<size_t>(size_));
  if (fd_ >= 0) ::close(fd_);
  addr_ = nullptr;
  size_ = 0;
  fd_ = -1;
}

CheckpointDirStore::Mapping::~Mapping() { Release(); }

CheckpointDirStore::Mapping::Mapping(Mapping&& other) noexcept
    : addr_(std::exchange(other.addr_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      fd_(std::exchange(other.fd_, -1)) {}

CheckpointDirStore::Mapping& CheckpointDirStore::Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    Release();
    addr_ = std::exchange(other.addr_, nullptr);
    size_ = std::exchange(other.size_, 0);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

// ---- CheckpointDirStore ----

Result<std::unique_ptr<CheckpointDirStore>> CheckpointDirStore::Open(const fs::path& dir,
                                                                     Access access) {
  ASSIGN_OR_RETURN(CheckpointLayout layout, ReadCheckpointLayout(dir));
  const bool writable = access == Access::kReadWrite;
  std::vector<Mapping> mappings;
  mappings.reserve(layout.files.size());
  for (const CheckpointFile& file : layout.files) {
    const fs::path path = dir / file.name;
    const int fd = ::open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "open " + path.string());
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int error = errno;
      ::close(fd);
      return Status::FromErrno(error, "stat " + path.string());
    }
    if (static_cast<uint64_t>(st.st_size) != file.size) {
      ::close(fd);
      return Status::FailedPrecondition(path.string() + ": size changed from " +
                                        std::to_string(file.size) + " to " +
                                        std::to_string(st.st_size) + " while opening");
    }
    // The descriptor stays open with the mapping, for ReadRange.
    ASSIGN_OR_RETURN(Mapping mapping, Mapping::Map(fd, file.size, access, path));
    if (Hash64(ByteSpan(mapping.data(), file.data_offset)) != file.header_hash) {
      return Status::FailedPrecondition(path.string() + ": header changed while opening");
    }
    if (access == Access::kPrivate && mapping.size() > 0) {
      // Every page gets its private copy now, in one call: a refit changes a few
      // percent of the elements, which is every page, and one fault per page on
      // the first refit costs seconds per GiB on a VM. Best effort (kernels before
      // 5.14 refuse it; the pages are then copied as they are first written).
      (void)::madvise(mapping.data(), static_cast<size_t>(mapping.size()), MADV_POPULATE_WRITE);
      // Then one read of each page: where a hypervisor backs guest memory lazily, the
      // new copies still trap on first access (this VM: ~13 us a page, 3.4 s per GiB
      // against 0.2 s for the populate), which a refit's first writes would pay.
      // Reads change nothing, and this is the node's start, not a refit.
      TouchEveryPage(mapping.data(), mapping.size());
    }
    mappings.push_back(std::move(mapping));
  }
  return std::unique_ptr<CheckpointDirStore>(
      new CheckpointDirStore(dir, access, std::move(layout), std::move(mappings)));
}

CheckpointDirStore::CheckpointDirStore(fs::path dir, Access access, CheckpointLayout layout,
                                       std::vector<Mapping> mappings)
    : dir_(std::move(dir)),
      access_(access),
      read_path_(DefaultReadPath()),
      layout_(std::move(layout)),
      layout_id_(layout_.LayoutId()),
      mappings_(std::move(mappings)) {
  tensors_.reserve(layout_.tensors.size());
  for (const CheckpointTensor& t : layout_.tensors) tensors_.push_back(t.info);
}

CheckpointDirStore::~CheckpointDirStore() = default;

CheckpointDirStore::ReadPath CheckpointDirStore::DefaultReadPath() {
  static const ReadPath path = [] {
    const char* choice = std::getenv("DELTACAST_CHECKPOINT_READS");
    return choice != nullptr && std::string_view(choice) == "map" ? ReadPath::kMap
                                                                  : ReadPath::kCopy;
  }();
  return path;
}

std::byte* CheckpointDirStore::TensorBytes(size_t index) const {
  const CheckpointTensor& t = layout_.tensors[index];
  std::byte* base = mappings_[t.file].data();
  // A file's mapping is only empty when the file is, and then every tensor in it is too.
  return base == nullptr ? nullptr : base + t.file_offset;
}

ByteSpan CheckpointDirStore::TensorData(size_t index) const {
  if (index >= tensors_.size()) return {};
  return ByteSpan(TensorBytes(index), tensors_[index].ByteSize());
}

Result<ByteSpan> CheckpointDirStore::ReadRange(size_t index, uint64_t offset, uint64_t length,
                                               MutableByteSpan buffer) const {
  if (index >= tensors_.size()) {
    return Status::InvalidArgument("tensor index " + std::to_string(index) + " out of range (" +
                                   std::to_string(tensors_.size()) + " tensors)");
  }
  const uint64_t bytes = tensors_[index].ByteSize();
  if (offset > bytes || length > bytes - offset) {
    return Status::InvalidArgument("read of bytes [" + std::to_string(offset) + ", +" +
                                   std::to_string(length) + ") outside tensor " +
                                   Quote(tensors_[index].name) + " of " + std::to_string(bytes) +
                                   " bytes");
  }
  if (length == 0) return ByteSpan();
  if (buffer.size() < length) {
    return Status::InvalidArgument("a buffer of " + std::to_string(buffer.size()) +
                                   " bytes cannot take " + std::to_string(length));
  }
  const CheckpointTensor& t = layout_.tensors[index];
  const uint64_t start = t.file_offset + offset;
  if (access_ == Access::kPrivate) return ByteSpan(mappings_[t.file].data() + start, length);
  if (read_path_ == ReadPath::kMap && populate_works.load(std::memory_order_relaxed)) {
    auto view = ViewPopulated(t, start, length);
    if (!view.ok() || *view) return view.ok() ? Result<ByteSpan>(**view) : view.status();
  }
  // Kernels without MADV_POPULATE_READ: a copy.
  uint64_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(mappings_[t.file].fd(), buffer.data() + done,
                              static_cast<size_t>(length - done), static_cast<off_t>(start + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      return Status::FromErrno(error, "read " + (dir_ / layout_.files[t.file].name).string() +
                                          " tensor " + Quote(t.info.name));
    }
    if (n == 0) return Shrank(t, start + done);
    done += static_cast<uint64_t>(n);
  }
  return ByteSpan(buffer.data(), length);
}

Status CheckpointDirStore::Shrank(const CheckpointTensor& t, uint64_t end) const {
  return Status::IoError((dir_ / layout_.files[t.file].name).string() + " ends at byte " +
                         std::to_string(end) + ", inside tensor " + Quote(t.info.name) +
                         " (the file shrank since it was opened)");
}

Result<std::optional<ByteSpan>> CheckpointDirStore::ViewPopulated(const CheckpointTensor& t,
                                                                  uint64_t start,
                                                                  uint64_t length) const {
  const Mapping& mapping = mappings_[t.file];
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<uintptr_t>(mapping.data() + start);
  const uintptr_t aligned = first & ~(page - 1);
  int rc;
  do {
    rc = ::madvise(reinterpret_cast<void*>(aligned), first + length - aligned, MADV_POPULATE_READ);
  } while (rc != 0 && errno == EINTR);
  const int error = rc == 0 ? 0 : errno;
  if (error == EINVAL) {  // before Linux 5.14
    populate_works.store(false, std::memory_order_relaxed);
    return std::optional<ByteSpan>();
  }
  const std::string path = (dir_ / layout_.files[t.file].name).string();
  if (error != 0 && error != EFAULT) {
    return Status::FromErrno(error, "read " + path + " tensor " + Quote(t.info.name));
  }
  // EFAULT: touching a page of the range would have raised SIGBUS, because the file
  // now ends before it or its bytes could not be read. And a file cut short inside the
  // range's last page maps zeros past its end without any fault. The size tells.
  struct stat st;
  if (::fstat(mapping.fd(), &st) != 0) return Status::FromErrno(errno, "stat " + path);
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < start + length) return Shrank(t, std::max(size, start));
  if (error == EFAULT) {
    return Status::IoError(path + ": the pages of tensor " + Quote(t.info.name) +
                           " could not be read (an I/O error)");
  }
  return std::optional<ByteSpan>(ByteSpan(mapping.data() + start, length));
}

Result<MutableByteSpan> CheckpointDirStore::MutableTensorData(size_t index) {
  if (access_ == Access::kReadOnly) {
    return Status::Unsupported(dir_.string() + ": store opened read-only");
  }
  if (index >= tensors_.size()) {
    return Status::InvalidArgument("tensor index " + std::to_string(index) + " out of range (" +
                                   std::to_string(tensors_.size()) + " tensors)");
  }
  return MutableByteSpan(TensorBytes(index), tensors_[index].ByteSize());
}

Status CheckpointDirStore::Flush(size_t index, uint64_t offset, uint64_t length) {
  if (index >= tensors_.size()) {
    return Status::InvalidArgument("tensor index " + std::to_string(index) + " out of range (" +
                                   std::to_string(tensors_.size()) + " tensors)");
  }
  const uint64_t bytes = tensors_[index].ByteSize();
  if (offset > bytes || length > bytes - offset) {
    return Status::InvalidArgument("flush of bytes [" + std::to_string(offset) + ", +" +
                                   std::to_string(length) + ") outside tensor " +
                                   Quote(tensors_[index].name) + " of " + std::to_string(bytes) +
                                   " bytes");
  }
  if (length == 0 || access_ != Access::kReadWrite) return Status::Ok();
  // msync wants a page-aligned start; the range may begin anywhere in a page.
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<uintptr_t>(TensorBytes(index)) + offset;
  const uintptr_t aligned = start & ~(page - 1);
  if (::msync(reinterpret_cast<void*>(aligned), start + length - aligned, MS_SYNC) != 0) {
    return Status::FromErrno(
        errno, "msync " + (dir_ / layout_.files[layout_.tensors[index].file].name).string() +
                   " tensor " + Quote(tensors_[index].name));
  }
  const size_t file = layout_.tensors[index].file;
  disk::SyncedRange(dir_ / layout_.files[file].name,
                    start - reinterpret_cast<uintptr_t>(mappings_[file].data()), length);
  return Status::Ok();
}

Status CheckpointDirStore::FlushAll() {
  if (access_ != Access::kReadWrite) return Status::Ok();
  for (size_t f = 0; f < mappings_.size(); ++f) {
    if (mappings_[f].data() == nullptr) continue;
    if (::msync(mappings_[f].data(), static_cast<size_t>(mappings_[f].size()), MS_SYNC) != 0)
      return Status::FromErrno(errno, "msync " + (dir_ / layout_.files[f].name).string());
    disk::SyncedRange(dir_ / layout_.files[f].name, 0, mappings_[f].size());
  }
  return Status::Ok();
}

}  // namespace deltacast::apply
