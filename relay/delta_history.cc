#include "relay/delta_history.h"

#include <sstream>
#include <string>

#include "common/disk_seam.h"
#include "common/file_util.h"

namespace deltacast::relay {

DeltaHistory::DeltaHistory(std::filesystem::path dir, size_t keep)
    : dir_(std::move(dir)), keep_(keep) {
  auto bytes = ReadFile(dir_ / "history", uint64_t{1} << 20);
  if (!bytes.ok()) return;
  std::istringstream lines{std::string(AsChars(*bytes))};
  std::string base, target;
  ChainLink link;
  while (lines >> base >> target >> link.partition_bytes >> link.chunks) {
    auto b = Digest128::FromHex(base);
    auto t = Digest128::FromHex(target);
    if (!b || !t) break;
    link.base = *b;
    link.target = *t;
    if (std::filesystem::exists(FileOf(link.target))) links_.push_back(link);
  }
}

std::filesystem::path DeltaHistory::FileOf(const Digest128& target) const {
  return dir_ / ("delta-" + target.ToHex() + ".spool");
}

Status DeltaHistory::WriteIndex() const {
  std::string text;
  for (const ChainLink& l : links_) {
    text += l.base.ToHex() + " " + l.target.ToHex() + " " + std::to_string(l.partition_bytes) +
            " " + std::to_string(l.chunks) + "\n";
  }
  return WriteFileAtomic(dir_ / "history", AsBytes(text));
}

Status DeltaHistory::Add(std::unique_ptr<Spool> spool, const ChainLink& link) {
  std::lock_guard lock(mu_);
  if (keep_ == 0) {
    spool->Discard();
    return Status::Ok();
  }
  RETURN_IF_ERROR(CreateDirectoriesDurably(dir_));
  std::error_code ec;
  RETURN_IF_ERROR(spool->Sync());
  const std::filesystem::path from = spool->path();
  spool.reset();
  std::filesystem::rename(from, FileOf(link.target), ec);
  if (ec)
    return Status::IoError("move " + from.string() + " into " + dir_.string() + ": " +
                           ec.message());
  disk::Renamed(from, FileOf(link.target));
  RETURN_IF_ERROR(FsyncDirectory(dir_));
  std::erase_if(links_, [&](const ChainLink& l) { return l.target == link.target; });
  links_.push_back(link);
  while (links_.size() > keep_) {
    open_.erase(links_.front().target.ToHex());
    std::filesystem::remove(FileOf(links_.front().target), ec);
    disk::Removed(FileOf(links_.front().target));
    links_.erase(links_.begin());
  }
  RETURN_IF_ERROR(WriteIndex());
  // Spool files no line names (a crash between the move and the index) go too.
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    if (entry.path().extension() != ".spool") continue;
    const bool named = std::any_of(links_.begin(), links_.end(), [&](const ChainLink& l) {
      return entry.path() == FileOf(l.target);
    });
    if (named) continue;
    std::filesystem::remove(entry.path(), ec);
    disk::Removed(entry.path());
  }
  return Status::Ok();
}

std::vector<ChainLink> DeltaHistory::Chain(const Digest128& from, const Digest128& to) const {
  std::lock_guard lock(mu_);
  // Walk back from `to` along committed deltas (newest first) until `from`.
  std::vector<ChainLink> chain;
  Digest128 at = to;
  for (auto it = links_.rbegin(); it != links_.rend() && at != from; ++it) {
    if (it->target != at) continue;
    chain.insert(chain.begin(), *it);
    at = it->base;
  }
  if (at != from) chain.clear();
  return chain;
}

Result<transport::Message> DeltaHistory::Read(const Digest128& target, uint32_t sequence) const {
  std::lock_guard lock(mu_);
  const std::string key = target.ToHex();
  const bool retained = std::any_of(links_.begin(), links_.end(),
                                    [&](const ChainLink& l) { return l.target == target; });
  if (!retained) return Status::NotFound("no retained delta to " + target.ShortHex());
  auto it = open_.find(key);
  if (it == open_.end()) {
    ASSIGN_OR_RETURN(auto spool, Spool::OpenFile(FileOf(target)));
    it = open_.emplace(key, std::move(spool)).first;
  }
  return it->second->Read(sequence);
}

size_t DeltaHistory::size() const {
  std::lock_guard lock(mu_);
  return links_.size();
}

}  // namespace deltacast::relay
