// Large byte buffers whose first touch is cheap: a chunk-sized buffer (MiBs) backed
// by fresh memory costs a page fault per 4 KiB when first written, and on a VM each
// fault is an exit to the host (the relay benchmark's guest: 19 ms of CPU to zero
// 4 MiB of fresh pages, and 30-270 ms of wall time per fresh receive buffer on the
// loaded 2-core VM, on the thread that reads the socket). Here the 2 MiB-aligned
// part of the buffer is advised for transparent huge pages (one fault per 2 MiB)
// and the rest is populated in one system call, before the zero fill.
//
// Thread safety: thread-safe (no shared state).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace deltacast {

// Below this, a buffer is made the plain way: the advice costs more than it saves.
inline constexpr size_t kLargeBufferBytes = size_t{1} << 20;

// A zero-filled buffer of exactly `size` bytes (capacity `size`). Throws
// std::bad_alloc. The advice is best effort: a kernel without transparent huge pages
// or MADV_POPULATE_WRITE gets a plain buffer, with the same contents.
std::unique_ptr<std::vector<std::byte>> NewLargeBuffer(size_t size);

}  // namespace deltacast
