#include "common/thread_name.h"

#include <pthread.h>

#include <algorithm>
#include <string>

namespace deltacast {

void NameThisThread(std::string_view name) {
  std::string full = "dc-" + std::string(name);
  full.resize(std::min<size_t>(full.size(), 15));
  (void)::pthread_setname_np(::pthread_self(), full.c_str());
}

}  // namespace deltacast
