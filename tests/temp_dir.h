// A fresh directory under the system temporary directory, removed with everything
// in it when the object goes: for tests that write files.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <string_view>

namespace deltacast::test_util {

class TempDir {
 public:
  explicit TempDir(std::string_view prefix) {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / (std::string(prefix) + ".XXXXXX")).string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace deltacast::test_util
