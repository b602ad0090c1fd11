// Helpers for the apply/ tests: a scratch directory and small generated files.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/bytes.h"
#include "common/file_util.h"

namespace deltacast::apply::testing {

// A fresh directory under the gtest temp dir, removed with everything in it.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::path(::testing::TempDir()) / "deltacast_apply_XXXXXX");
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Distinct bytes per (seed, position), so misplaced data shows up.
inline std::vector<std::byte> Pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> out(n);
  uint32_t x = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    out[i] = std::byte(static_cast<uint8_t>(x >> 16));
  }
  return out;
}

// Writes a safetensors-shaped file byte for byte: an 8-byte length (the JSON's
// own length unless `declared_length` is given), the JSON, then `data`.
inline void WriteRawSafetensors(const std::filesystem::path& path, std::string_view json,
                                const std::vector<std::byte>& data,
                                uint64_t declared_length = UINT64_MAX) {
  std::vector<std::byte> bytes;
  ByteWriter w(bytes);
  w.Put<uint64_t>(declared_length == UINT64_MAX ? json.size() : declared_length);
  w.PutString(json);
  w.PutBytes(data);
  ASSERT_TRUE(WriteFile(path, bytes).ok());
}

inline std::string ReadAll(const std::filesystem::path& path) {
  auto bytes = ReadFile(path);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  if (!bytes.ok()) return {};
  return std::string(AsChars(*bytes));
}

}  // namespace deltacast::apply::testing
