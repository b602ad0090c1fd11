#pragma once

#include <string_view>

namespace deltacast::agent {

// "deltacast 0.1.0".
std::string_view VersionString();

}  // namespace deltacast::agent
