// Small helpers for running independent work items on several threads.
//
// Thread safety: the functions are reentrant; `fn` must be safe to call concurrently
// for different indices.
#pragma once

#include <cstddef>
#include <functional>

namespace deltacast {

// Cores to use when the user says 0 / "all".
size_t DefaultThreadCount();

// Calls fn(i) for i in [0, count) on up to `threads` threads (the caller's thread is
// one of them); blocks until all calls return. Indices are handed out in increasing
// order, one at a time, so uneven items balance.
void ParallelFor(size_t count, size_t threads, const std::function<void(size_t)>& fn);

}  // namespace deltacast
