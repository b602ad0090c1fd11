#include "common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/disk_seam.h"

namespace deltacast {
namespace {

// Closes the descriptor when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace

Status WriteAll(int fd, ByteSpan data, const std::filesystem::path& path) {
  RETURN_IF_ERROR(disk::WillWrite(path, data.size()));
  const std::byte* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "write " + path.string());
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status AppendLineDurably(const std::filesystem::path& path, std::string_view line) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (fd.get() < 0) return Status::FromErrno(errno, "open " + path.string());
  disk::Created(path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "stat " + path.string());
  std::string text(line);
  text += '\n';
  RETURN_IF_ERROR(WriteAll(fd.get(), AsBytes(text), path));
  if (::fsync(fd.get()) != 0) return Status::FromErrno(errno, "fsync " + path.string());
  disk::Synced(path);
  // An fsync makes the bytes durable, not the name: a file this append may have
  // created needs its directory synced too, or a machine crash can lose all of it.
  if (st.st_size == 0) {
    return FsyncDirectory(path.has_parent_path() ? path.parent_path() : std::filesystem::path("."));
  }
  return Status::Ok();
}

Result<std::vector<std::byte>> ReadFile(const std::filesystem::path& path, uint64_t max_bytes) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return Status::NotFound(path.string() + ": no such file");
    return Status::FromErrno(errno, "open " + path.string());
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "stat " + path.string());
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return Status::ResourceExhausted(path.string() + ": " + std::to_string(st.st_size) +
                                     " bytes exceeds the limit of " + std::to_string(max_bytes));
  }
  std::vector<std::byte> out(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd.get(), out.data() + got, out.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "read " + path.string());
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

Status WriteFile(const std::filesystem::path& path, ByteSpan data) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return Status::FromErrno(errno, "create " + path.string());
  disk::Created(path);
  return WriteAll(fd.get(), data, path);
}

Status FsyncDirectory(const std::filesystem::path& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return Status::FromErrno(errno, "open directory " + dir.string());
  if (::fsync(fd.get()) != 0) return Status::FromErrno(errno, "fsync directory " + dir.string());
  disk::DirSynced(dir);
  return Status::Ok();
}

Status FsyncFile(const std::filesystem::path& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return Status::FromErrno(errno, "open " + path.string());
  if (::fsync(fd.get()) != 0) return Status::FromErrno(errno, "fsync " + path.string());
  disk::Synced(path);
  return Status::Ok();
}

Status LinkOrCopyDurably(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::error_code ec;
  std::filesystem::create_hard_link(from, to, ec);
  if (!ec) disk::Linked(from, to);
  if (ec) {
    ec.clear();
    std::filesystem::copy_file(from, to, ec);
    if (ec)
      return Status::IoError("copy " + from.string() + " to " + to.string() + ": " + ec.message());
    disk::Created(to);
  }
  return FsyncFile(to);
}

Status CreateDirectoriesDurably(const std::filesystem::path& dir) {
  std::error_code ec;
  if (dir.empty() || std::filesystem::is_directory(dir, ec)) return Status::Ok();
  const std::filesystem::path parent = dir.parent_path();
  if (parent != dir) RETURN_IF_ERROR(CreateDirectoriesDurably(parent));
  if (!std::filesystem::create_directory(dir, ec) && ec) {
    return Status::IoError("create " + dir.string() + ": " + ec.message());
  }
  return FsyncDirectory(parent.empty() ? std::filesystem::path(".") : parent);
}

Status WriteFileAtomic(const std::filesystem::path& path, ByteSpan data) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) return Status::FromErrno(errno, "create " + tmp.string());
    disk::Created(tmp);
    RETURN_IF_ERROR(WriteAll(fd.get(), data, tmp));
    if (::fsync(fd.get()) != 0) return Status::FromErrno(errno, "fsync " + tmp.string());
    disk::Synced(tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return Status::FromErrno(errno, "rename " + tmp.string() + " -> " + path.string());
  }
  disk::Renamed(tmp, path);
  const auto parent = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  return FsyncDirectory(parent);
}

}  // namespace deltacast
