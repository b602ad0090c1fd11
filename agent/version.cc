#include "agent/version.h"

namespace deltacast::agent {

std::string_view VersionString() { return "deltacast 0.1.0"; }

}  // namespace deltacast::agent
