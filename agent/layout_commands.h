// `deltacast layout engine`: each GPU's load plan for an inference engine (vLLM or
// SGLang) from a Hugging Face checkpoint's config.json (layout/engine.h), written
// as layout files and checked against the checkpoint's tensor table: together the
// plans must hold every canonical element, each GPU's parameters are listed.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace deltacast::agent {

struct LayoutEngineArgs {
  std::filesystem::path config;     // config.json
  std::filesystem::path canonical;  // checkpoint dir or canonical.json; empty: config's dir
  std::filesystem::path out;
  std::string engine = "vllm";
  uint64_t tp = 1, dp = 1, ep = 1;
  bool json = false;
};
int RunLayoutEngine(const LayoutEngineArgs& args);

}  // namespace deltacast::agent
