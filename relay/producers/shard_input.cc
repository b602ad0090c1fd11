#include "relay/producers/shard_input.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "apply/checkpoint_dir.h"
#include "apply/safetensors.h"
#include "common/file_util.h"
#include "layout/description.h"

namespace deltacast::relay {

namespace fs = std::filesystem;

Result<std::vector<TensorSpec>> LoadCanonicalTable(const fs::path& path) {
  std::error_code ec;
  std::vector<TensorSpec> out;
  if (fs::is_directory(path, ec)) {
    ASSIGN_OR_RETURN(apply::CheckpointLayout layout, apply::ReadCheckpointLayout(path));
    for (const auto& t : layout.tensors) out.push_back(t.info);
    return out;  // sorted by name
  }
  ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadFile(path, uint64_t{256} << 20));
  auto bad = [&](const std::string& why) {
    return Status::Corrupt("canonical table " + path.string() + ": " + why);
  };
  nlohmann::json doc = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("tensors") ||
      !doc["tensors"].is_array()) {
    return bad("expected a JSON object {\"tensors\": [...]}");
  }
  for (const auto& t : doc["tensors"]) {
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || !t.contains("dtype") ||
        !t["dtype"].is_string() || !t.contains("shape") || !t["shape"].is_array()) {
      return bad("entry " + std::to_string(out.size()) + " needs name, dtype and shape");
    }
    TensorSpec info;
    info.name = t["name"].get<std::string>();
    auto dtype = ParseDType(t["dtype"].get<std::string>());
    if (!dtype) return bad("tensor '" + info.name + "' has an unknown dtype");
    info.dtype = *dtype;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_unsigned()) return bad("tensor '" + info.name + "' has a bad shape");
      info.shape.push_back(d.get<uint64_t>());
    }
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (size_t i = 1; i < out.size(); ++i) {
    if (out[i].name == out[i - 1].name) return bad("tensor '" + out[i].name + "' listed twice");
  }
  return out;
}

std::vector<TensorSpec> ToSpecs(const std::vector<TensorSpec>& tensors) {
  std::vector<TensorSpec> out;
  for (const auto& t : tensors) out.push_back({t.name, t.dtype, t.shape});
  return out;
}

Result<std::unique_ptr<ShardFile>> ShardFile::Open(const fs::path& path) {
  ASSIGN_OR_RETURN(apply::SafetensorsHeader header, apply::ReadSafetensorsHeader(path));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path.string());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::FromErrno(err, "stat " + path.string());
  }
  std::unique_ptr<ShardFile> f(new ShardFile());
  f->path_ = path;
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0) {
    f->map_ = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map_ == MAP_FAILED) {
      f->map_ = nullptr;
      const int err = errno;
      ::close(fd);
      return Status::FromErrno(err, "mmap " + path.string());
    }
  }
  ::close(fd);
  for (const auto& e : header.entries) {
    if (header.data_section_offset + e.data_end > f->size_) {
      return Status::Corrupt(path.string() + ": tensor '" + e.info.name + "' runs past the file");
    }
    f->tensors_.push_back(e.info);
    f->offsets_.push_back(header.data_section_offset + e.data_begin);
  }
  return f;
}

ShardFile::~ShardFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

ByteSpan ShardFile::TensorData(size_t index) const {
  if (index >= tensors_.size()) return {};
  return ByteSpan(static_cast<const std::byte*>(map_) + offsets_[index],
                  tensors_[index].ByteSize());
}

Result<RankPlacement> LoadRankPlacement(const fs::path& layout_file,
                                        const std::vector<TensorSpec>& shard_tensors) {
  ASSIGN_OR_RETURN(layout::LayoutDescription d, layout::LoadLayout(layout_file));
  const fs::path table =
      d.canonical.is_absolute() ? d.canonical : layout_file.parent_path() / d.canonical;
  auto canonical = LoadCanonicalTable(table);
  if (!canonical.ok()) {
    return canonical.status().WithContext(d.Where(0) + ": [layout] canonical");
  }
  ASSIGN_OR_RETURN(layout::PlacementMap map,
                   layout::ExpandPlacement(d, ToSpecs(*canonical), ToSpecs(shard_tensors)));
  return RankPlacement{std::move(map), std::move(*canonical)};
}

}  // namespace deltacast::relay
