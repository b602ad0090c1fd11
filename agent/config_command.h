// `deltacast config`: the cluster config reference and a config's effective values
// (topology/config_explain.h; docs/config.md).
//
// Thread safety: runs on the calling thread.
#pragma once

#include <filesystem>

namespace deltacast::agent {

struct ConfigArgs {
  std::filesystem::path config;  // --explain: the file
  bool explain = false;          // the file's effective config, defaults filled in
  bool defaults = false;         // every key with its default
  bool json = false;
};
// Prints to stdout; errors (with the parser's FILE:LINE) to stderr.
int RunConfig(const ConfigArgs& args);

}  // namespace deltacast::agent
