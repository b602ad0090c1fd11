#include "agent/config_command.h"

#include <fmt/core.h>

#include "agent/commands.h"
#include "topology/config_explain.h"

namespace deltacast::agent {

int RunConfig(const ConfigArgs& args) {
  const auto format = args.json ? topology::ExplainFormat::kJson : topology::ExplainFormat::kToml;
  if (args.defaults) {
    fmt::print("{}", topology::ConfigReference(format));
    return kExitOk;
  }
  auto text = topology::ExplainClusterConfigFile(args.config, format);
  if (!text.ok()) {
    fmt::print(stderr, "deltacast: {}\n", text.status().ToString());
    return kExitFailure;
  }
  fmt::print("{}", *text);
  return kExitOk;
}

}  // namespace deltacast::agent
