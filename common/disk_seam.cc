#include "common/disk_seam.h"

#include <atomic>

namespace deltacast {
namespace {
std::atomic<DiskSeam*> installed{nullptr};
}  // namespace

DiskSeam* SimDisk() { return installed.load(std::memory_order_relaxed); }
void InstallSimDisk(DiskSeam* disk) { installed.store(disk); }

}  // namespace deltacast
