#include "sim/sim_disk.h"

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <set>

#include "common/file_util.h"

namespace deltacast::sim {

namespace fs = std::filesystem;

namespace {

bool Under(const fs::path& path, const fs::path& dir) {
  const std::string p = path.string(), d = dir.string();
  return p.size() > d.size() && p.compare(0, d.size(), d) == 0 && p[d.size()] == '/';
}

std::vector<std::byte> Contents(const fs::path& path) {
  auto bytes = ReadFile(path, uint64_t{1} << 32);
  return bytes.ok() ? std::move(*bytes) : std::vector<std::byte>();
}

// The regular files (or the directories) under `dir`, sorted.
std::vector<fs::path> Entries(const fs::path& dir, bool recursive, bool dirs) {
  std::vector<fs::path> out;
  std::error_code ec;
  auto take = [&](const fs::directory_entry& e) {
    std::error_code c;
    if (dirs ? e.is_directory(c) : e.is_regular_file(c)) out.push_back(e.path().lexically_normal());
  };
  if (recursive) {
    for (auto it = fs::recursive_directory_iterator(dir, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      take(*it);
    }
  } else {
    for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      take(*it);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<fs::path> FilesUnder(const fs::path& dir, bool recursive) {
  return Entries(dir, recursive, /*dirs=*/false);
}

}  // namespace

std::string PowerLossReport::Describe() const {
  return fmt::format(
      "{} files put back, {} names not durable lost, {} unlinked names back, {} directories "
      "lost, {} of {} pages written since their sync kept",
      files, names_lost, names_back, dirs_lost, pages_kept, pages_dirty);
}

SimDisk::SimDisk(uint64_t seed) : rng_(seed * 0xD1B54A32D192ED03ull + 7) {}

SimDisk::Root* SimDisk::RootOf(const Path& path) {
  for (Root& r : roots_) {
    if (Under(path, r.path)) return &r;
  }
  return nullptr;
}

const SimDisk::Root* SimDisk::RootOf(const Path& path) const {
  return const_cast<SimDisk*>(this)->RootOf(path);
}

void SimDisk::Gap(const std::string& what) {
  if (std::find(reported_.begin(), reported_.end(), what) != reported_.end()) return;
  reported_.push_back(what);
  errors_.push_back("disk seam: " + what);
}

std::vector<std::string> SimDisk::TakeErrors() { return std::exchange(errors_, {}); }

void SimDisk::Adopt(const Path& root_path) {
  const Path root = root_path.lexically_normal();
  Root r;
  r.path = root;
  for (const Path& file : FilesUnder(root, true)) {
    const uint64_t id = next_file_++;
    r.names[file] = id;
    images_[id] = Contents(file);
  }
  r.durable = r.names;
  for (const Path& dir : Entries(root, true, /*dirs=*/true)) r.dirs.insert(dir);
  roots_.push_back(std::move(r));
}

void SimDisk::Replace(const Path& root_path) {
  const Path root = root_path.lexically_normal();
  std::erase_if(roots_, [&](const Root& r) { return r.path == root; });
  std::error_code ec;
  fs::remove_all(root, ec);
  fs::create_directories(root, ec);
  Adopt(root);
  Collect();
}

void SimDisk::SetFull(const Path& root, bool full) {
  for (Root& r : roots_) {
    if (r.path == root.lexically_normal()) r.full = full;
  }
}

bool SimDisk::full(const Path& root) const {
  for (const Root& r : roots_) {
    if (r.path == root.lexically_normal()) return r.full;
  }
  return false;
}

void SimDisk::Cut(const Path& root) {
  for (Root& r : roots_) {
    if (r.path == root.lexically_normal()) r.cut = true;
  }
}

bool SimDisk::cut(const Path& root) const {
  for (const Root& r : roots_) {
    if (r.path == root.lexically_normal()) return r.cut;
  }
  return false;
}

Status SimDisk::WillWrite(const Path& path, uint64_t bytes) {
  const Root* r = RootOf(path.lexically_normal());
  if (!r || !r->full || bytes == 0) return Status::Ok();
  ++refused_;
  return Status::FromErrno(ENOSPC, "write " + path.string());
}

void SimDisk::Unbound(const Path& path) {
  // A file synced after its name went (a spool a later refit removed, still open):
  // its bytes are no name's. One that is there was made behind the seam.
  std::error_code ec;
  if (fs::exists(path, ec)) Gap("synced " + path.string() + ", not created through the seam");
}

void SimDisk::Created(const Path& path_in) {
  const Path path = path_in.lexically_normal();
  Root* r = RootOf(path);
  if (!r || r->names.count(path)) return;
  const uint64_t id = next_file_++;
  r->names[path] = id;
  images_[id] = {};  // nothing of a new file is durable yet
}

// Moves every path of `paths` under `from` to the same place under `to`.
template <typename Map>
void MoveUnder(Map& paths, const fs::path& from, const fs::path& to) {
  Map moved;
  for (auto it = paths.begin(); it != paths.end();) {
    if (!Under(it->first, from)) {
      ++it;
      continue;
    }
    moved.emplace(to / it->first.lexically_relative(from), it->second);
    it = paths.erase(it);
  }
  for (auto& e : moved) paths.insert_or_assign(e.first, e.second);
}

void SimDisk::Renamed(const Path& from_in, const Path& to_in) {
  const Path from = from_in.lexically_normal(), to = to_in.lexically_normal();
  Root* r = RootOf(from);
  if (!r) return;
  std::error_code ec;
  if (fs::is_directory(to, ec)) {
    // A directory renamed: everything in it goes with it now; what a crash keeps of
    // it moves once the new name's directory is synced (DirSynced).
    std::erase_if(r->names, [&](const auto& e) { return Under(e.first, to); });
    MoveUnder(r->names, from, to);
    r->dir_renames.emplace_back(from, to);
    return;
  }
  auto it = r->names.find(from);
  if (it == r->names.end()) {
    Gap("renamed " + from.string() + ", which was not created through the seam");
    return;
  }
  const uint64_t id = it->second;
  r->names.erase(it);
  r->names[to] = id;
}

void SimDisk::Linked(const Path& from_in, const Path& to_in) {
  const Path from = from_in.lexically_normal(), to = to_in.lexically_normal();
  Root* r = RootOf(to);
  if (!r) return;
  Root* source = RootOf(from);
  if (source != r) {
    // A link across roots (the simulator gives each process its own): a new file here.
    return Created(to);
  }
  auto it = r->names.find(from);
  if (it == r->names.end()) {
    Gap("linked " + from.string() + ", which was not created through the seam");
    return;
  }
  r->names[to] = it->second;
}

void SimDisk::Removed(const Path& path_in) {
  const Path path = path_in.lexically_normal();
  Root* r = RootOf(path);
  if (!r) return;
  std::erase_if(r->names, [&](const auto& e) { return e.first == path || Under(e.first, path); });
}

void SimDisk::Synced(const Path& path_in) {
  const Path path = path_in.lexically_normal();
  Root* r = RootOf(path);
  if (!r || r->cut) return;
  auto it = r->names.find(path);
  if (it == r->names.end()) return Unbound(path);
  images_[it->second] = Contents(path);
}

void SimDisk::SyncedRange(const Path& path_in, uint64_t offset, uint64_t length) {
  const Path path = path_in.lexically_normal();
  Root* r = RootOf(path);
  if (!r || r->cut) return;
  auto it = r->names.find(path);
  if (it == r->names.end()) return Unbound(path);
  const std::vector<std::byte> now = Contents(path);
  std::vector<std::byte>& image = images_[it->second];
  const uint64_t end = std::min<uint64_t>(offset + length, now.size());
  if (offset >= end) return;
  // msync writes pages, not the size: a range past the durable size extends it only
  // as far as the range reaches.
  if (image.size() < end) image.resize(end);
  std::copy(now.begin() + offset, now.begin() + end, image.begin() + offset);
}

void SimDisk::DirSynced(const Path& dir_in) {
  const Path dir = dir_in.lexically_normal();
  Root* r = RootOf(dir / "x");
  if (!r || r->cut) return;
  // Directories renamed into this one: the durable names in them (their contents'
  // durability is the directory's own, whatever its name) take the new name.
  for (auto it = r->dir_renames.begin(); it != r->dir_renames.end();) {
    const auto [from, to] = *it;
    if (to.parent_path() != dir) {
      ++it;
      continue;
    }
    MoveUnder(r->durable, from, to);
    std::map<Path, bool> dirs;
    for (const Path& d : r->dirs) dirs.emplace(d, true);
    const bool durable_dir = dirs.erase(from) > 0;
    MoveUnder(dirs, from, to);
    r->dirs.clear();
    for (const auto& d : dirs) r->dirs.insert(d.first);
    if (durable_dir) r->dirs.insert(to);
    it = r->dir_renames.erase(it);
  }
  std::erase_if(r->durable, [&](const auto& e) { return e.first.parent_path() == dir; });
  std::set<Path> known;
  for (const auto& [path, id] : r->names) {
    if (path.parent_path() != dir) continue;
    r->durable[path] = id;
    known.insert(path);
  }
  // The real directory must hold exactly the names the seam was told of.
  for (const Path& file : FilesUnder(dir, false)) {
    if (!known.erase(file)) Gap(file.string() + " was created behind the seam");
  }
  for (const Path& file : known) Gap(file.string() + " was removed behind the seam");
  // Its subdirectories' names: the ones there now are durable, the others durably gone
  // (with everything under them).
  const std::vector<Path> subdirs = Entries(dir, false, /*dirs=*/true);
  std::vector<Path> gone;
  for (const Path& d : r->dirs) {
    if (d.parent_path() == dir && !std::binary_search(subdirs.begin(), subdirs.end(), d))
      gone.push_back(d);
  }
  for (const Path& d : gone) {
    r->dirs.erase(d);
    std::erase_if(r->dirs, [&](const Path& x) { return Under(x, d); });
    std::erase_if(r->durable, [&](const auto& e) { return Under(e.first, d); });
  }
  for (const Path& d : subdirs) r->dirs.insert(d);
  Collect();
}

bool SimDisk::Reachable(const Root& r, const Path& path) {
  for (Path d = path.parent_path(); d != r.path && d.has_parent_path(); d = d.parent_path()) {
    if (!r.dirs.count(d)) return false;
  }
  return true;
}

void SimDisk::Collect() {
  std::set<uint64_t> live;
  for (const Root& r : roots_) {
    for (const auto& [path, id] : r.names) live.insert(id);
    for (const auto& [path, id] : r.durable) live.insert(id);
  }
  std::erase_if(images_, [&](const auto& e) { return !live.count(e.first); });
}

PowerLossReport SimDisk::PowerLoss(const Path& root_path, std::optional<double> keep_share) {
  PowerLossReport rep;
  Root* r = nullptr;
  for (Root& x : roots_) {
    if (x.path == root_path.lexically_normal()) r = &x;
  }
  if (!r) return rep;
  // How much of what was written since the last syncs reached the platters: none,
  // all (a process crash), or a random share.
  std::uniform_real_distribution<double> unit(0, 1);
  double keep = 0;
  if (keep_share) {
    keep = *keep_share;
  } else {
    const uint64_t mode = rng_() % 4;
    keep = mode == 0 ? 0 : mode == 1 ? 1 : unit(rng_);
  }
  auto coin = [&] { return keep >= 1 || (keep > 0 && unit(rng_) < keep); };

  for (const Path& file : FilesUnder(r->path, true)) {
    if (!r->names.count(file)) Gap(file.string() + " was created behind the seam");
  }
  std::map<uint64_t, Path> bound;  // file -> a name it has now
  for (const auto& [path, id] : r->names) bound.emplace(id, path);
  // What the crash left of each file, once per file whatever names it has.
  std::map<uint64_t, std::vector<std::byte>> after;
  // A durable name in a directory whose own name is not durable goes with it.
  std::erase_if(r->durable, [&](const auto& e) { return !Reachable(*r, e.first); });
  std::erase_if(r->dirs, [&](const Path& d) { return !Reachable(*r, d); });
  for (const auto& [path, id] : r->durable) {
    ++rep.files;
    if (!r->names.count(path)) ++rep.names_back;
    if (after.count(id)) continue;  // another name of a file already put back
    const std::vector<std::byte>& image = images_[id];
    auto now_name = bound.find(id);
    // An unlinked file's unsynced pages went with its page cache.
    const std::vector<std::byte> now = now_name == bound.end() ? image : Contents(now_name->second);
    const uint64_t size = now.size() == image.size() || !coin() ? image.size() : now.size();
    std::vector<std::byte> out(std::max(image.size(), now.size()));
    std::copy(image.begin(), image.end(), out.begin());
    for (uint64_t page = 0; page < out.size(); page += kPageBytes) {
      const uint64_t end = std::min<uint64_t>(page + kPageBytes, out.size());
      bool differs = false;
      for (uint64_t b = page; b < end && !differs; ++b) {
        const std::byte d = b < image.size() ? image[b] : std::byte{0};
        const std::byte n = b < now.size() ? now[b] : std::byte{0};
        differs = d != n;
      }
      if (!differs) continue;
      ++rep.pages_dirty;
      if (!coin()) continue;
      ++rep.pages_kept;
      for (uint64_t b = page; b < end; ++b) out[b] = b < now.size() ? now[b] : std::byte{0};
    }
    out.resize(size);
    after[id] = std::move(out);
  }
  for (const auto& [path, id] : r->names) rep.names_lost += r->durable.count(path) ? 0 : 1;

  std::error_code ec;
  for (const Path& file : FilesUnder(r->path, true)) fs::remove(file, ec);
  for (const Path& dir : Entries(r->path, true, /*dirs=*/true)) {
    if (r->dirs.count(dir) || !fs::exists(dir, ec)) continue;
    ++rep.dirs_lost;
    fs::remove_all(dir, ec);
  }
  for (const Path& dir : r->dirs) fs::create_directories(dir, ec);
  std::map<uint64_t, Path> written;  // file -> the name it was put back under first
  for (const auto& [path, id] : r->durable) {
    fs::create_directories(path.parent_path(), ec);
    if (auto first = written.find(id); first != written.end()) {
      fs::create_hard_link(first->second, path, ec);
      if (ec) Gap("cannot link " + path.string() + " back after the power loss");
      continue;
    }
    written.emplace(id, path);
    const std::vector<std::byte>& bytes = after[id];
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    if (!out) Gap("cannot write " + path.string() + " back after the power loss");
  }
  // What the crash left is what the disk holds now.
  r->names = r->durable;
  r->dir_renames.clear();
  for (const auto& [id, bytes] : after) images_[id] = bytes;
  r->cut = false;
  Collect();
  return rep;
}

}  // namespace deltacast::sim
