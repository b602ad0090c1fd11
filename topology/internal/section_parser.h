// SectionParser: reads the keys of one table of a cluster config (topology/
// cluster_config.h) with messages "SOURCE:LINE: [table] ..." naming the key and the
// value, as every table of the file reports them.
//
// Thread safety: a value; used by one thread.
#pragma once

#include <toml++/toml.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/toml_text.h"
#include "topology/units.h"

namespace deltacast::topology::internal {

class SectionParser {
 public:
  SectionParser(std::string_view source, std::string_view where) : source_(source), where_(where) {}

  Status Error(const toml::node& node, std::string_view message) const {
    return toml_text::Reader(source_).Error(node, where_ + " " + std::string(message));
  }

  Status CheckKeys(const toml::table& t, std::span<const std::string_view> known) const {
    return toml_text::Reader(source_).CheckKeys(t, where_, known);
  }

  Result<std::string> String(const toml::node& n, std::string_view key) const {
    if (const auto* s = n.as_string()) return s->get();
    return Error(n, std::string(key) + " must be a string");
  }

  Status Int(const toml::table& t, std::string_view key, int64_t min, int64_t max, int& out) const {
    const toml::node* n = t.get(key);
    if (!n) return Status::Ok();
    const auto* i = n->as_integer();
    if (!i) return Error(*n, std::string(key) + " must be an integer");
    if (i->get() < min || i->get() > max) {
      return Error(*n, std::string(key) + " = " + std::to_string(i->get()) + " is out of range [" +
                           std::to_string(min) + ", " + std::to_string(max) + "]");
    }
    out = static_cast<int>(i->get());
    return Status::Ok();
  }

  Status Size(const toml::table& t, std::string_view key, uint64_t min, uint64_t max,
              uint64_t& out) const {
    const toml::node* n = t.get(key);
    if (!n) return Status::Ok();
    ASSIGN_OR_RETURN(std::string text, String(*n, key));
    auto size = ParseSize(text);
    if (!size.ok()) return Error(*n, std::string(key) + ": " + size.status().message());
    if (*size < min || *size > max) {
      return Error(*n, std::string(key) + " = " + text + " is out of range [" + FormatSize(min) +
                           ", " + FormatSize(max) + "]");
    }
    out = *size;
    return Status::Ok();
  }

  Status Duration(const toml::table& t, std::string_view key,
                  std::chrono::milliseconds& out) const {
    const toml::node* n = t.get(key);
    if (!n) return Status::Ok();
    ASSIGN_OR_RETURN(std::string text, String(*n, key));
    auto d = ParseDuration(text);
    if (!d.ok()) return Error(*n, std::string(key) + ": " + d.status().message());
    if (d->count() <= 0) return Error(*n, std::string(key) + " must be greater than zero");
    out = *d;
    return Status::Ok();
  }

  Status Path(const toml::table& t, std::string_view key, const std::filesystem::path& dir,
              std::filesystem::path& out) const {
    const toml::node* n = t.get(key);
    if (!n) return Status::Ok();
    ASSIGN_OR_RETURN(std::string text, String(*n, key));
    if (text.empty()) return Error(*n, std::string(key) + " must not be empty");
    std::filesystem::path p(text);
    out = p.is_relative() && !dir.empty() ? dir / p : p;
    return Status::Ok();
  }

 private:
  std::string source_;
  std::string where_;
};

}  // namespace deltacast::topology::internal
