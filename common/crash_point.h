// Crash points: a test hook that kills the process at a named place, the way a
// power cut or `kill -9` would, so fault-injection tests can stop an agent at an
// exact phase of a refit (docs/recovery.md lists the names).
//
// DELTACAST_CRASH_AT=NAME kills the process the first time it passes NAME;
// NAME:N the N-th time. Unset (always, outside tests), a crash point costs one
// relaxed atomic load.
//
// Thread safety: thread-safe.
#pragma once

#include <string_view>

namespace deltacast {

void CrashPoint(std::string_view name);

// The simulator's seam (sim/run.cc): while installed, every crash point calls
// `handler(name, context)` first, which may throw to unwind the simulated process
// that passed it (its kill). Install and remove it with no engine thread running.
using CrashPointHandler = void (*)(std::string_view name, void* context);
void InstallCrashPointHandler(CrashPointHandler handler, void* context);

// The same kind of hook for faults that are not crashes: true exactly once, the
// N-th time the process passes NAME when DELTACAST_FAULT_AT=NAME[:N]. The caller
// injects the fault (e.g. corrupts a received chunk).
bool FaultPoint(std::string_view name);

}  // namespace deltacast
