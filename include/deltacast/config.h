// A cluster config: which nodes exist, where they listen, and the relay tree's
// tuning (the TOML format of configs/*.toml; docs in the repository README). Every
// node and the source read the same file. The cluster token is never in the file:
// the config names the environment variable that holds it.
//
// Thread safety: a value; concurrent const use is safe.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "deltacast/status.h"

namespace deltacast {

class Config {
 public:
  // Loads and validates a config file; an error names FILE:LINE and the key.
  static Result<Config> Load(const std::filesystem::path& path);
  // The same for TOML text; `name` stands for the file in messages.
  static Result<Config> Parse(std::string_view toml, std::string_view name = "config");

  // The source's node id and the receivers' ids, in file order.
  std::string source() const;
  std::vector<std::string> receivers() const;
  // The cluster token, read from the environment variable the config names
  // ([cluster] auth_token_env, default DELTACAST_TOKEN); an error if it is unset.
  Result<std::string> TokenFromEnvironment() const;
  // The tree every node computes, as `deltacast plan` prints it.
  Result<std::string> DescribePlan() const;

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  explicit Config(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;  // shared: a Config is a cheap immutable value
};

}  // namespace deltacast
