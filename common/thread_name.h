// Thread names: the engine's long-lived threads are named after their job
// ("dc-loop", "dc-apply", "dc-worker", "dc-tcp-io", ...), which top -H, perf's comm
// column and /proc/<pid>/task/*/comm show, so a process's CPU splits by job
// (bench/relay_forward.cc does, from /proc).
//
// Thread safety: names the calling thread only.
#pragma once

#include <string_view>

namespace deltacast {

// Names the calling thread "dc-<name>", cut to the kernel's 15 characters. Best
// effort: a failure changes nothing.
void NameThisThread(std::string_view name);

}  // namespace deltacast
