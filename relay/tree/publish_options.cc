#include "relay/tree/publish_options.h"

namespace deltacast::relay {

void PublishOptions::UseStateDir(const std::filesystem::path& state) {
  decision_log = state / "decisions.log";
  spool_dir = state / "spool";
  history_dir = state / "history";
}

}  // namespace deltacast::relay
