#include "common/large_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

namespace deltacast {
namespace {

constexpr uintptr_t kHugePageBytes = uintptr_t{2} << 20;

uintptr_t RoundDown(uintptr_t value, uintptr_t to) { return value & ~(to - 1); }
uintptr_t RoundUp(uintptr_t value, uintptr_t to) { return RoundDown(value + to - 1, to); }

// Advice only: the range is inside the allocation (whole pages of it), and neither
// call changes what the memory holds, so an error (an old kernel) changes nothing.
void Prefault(std::byte* data, size_t size) {
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const auto end = begin + size;
  const uintptr_t huge_begin = RoundUp(begin, kHugePageBytes);
  const uintptr_t huge_end = RoundDown(end, kHugePageBytes);
  if (huge_end > huge_begin) {
    (void)::madvise(reinterpret_cast<void*>(huge_begin), huge_end - huge_begin, MADV_HUGEPAGE);
  }
#ifdef MADV_POPULATE_WRITE
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t page_begin = RoundUp(begin, page);
  const uintptr_t page_end = RoundDown(end, page);
  if (page_end > page_begin) {
    (void)::madvise(reinterpret_cast<void*>(page_begin), page_end - page_begin,
                    MADV_POPULATE_WRITE);
  }
#endif
}

}  // namespace

std::unique_ptr<std::vector<std::byte>> NewLargeBuffer(size_t size) {
  auto buffer = std::make_unique<std::vector<std::byte>>();
  if (size >= kLargeBufferBytes) {
    buffer->reserve(size);  // allocated, not touched yet
    Prefault(buffer->data(), size);
  }
  buffer->resize(size);
  return buffer;
}

}  // namespace deltacast
