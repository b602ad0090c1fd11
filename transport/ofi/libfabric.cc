#include "transport/ofi/libfabric.h"

#include <dlfcn.h>
#include <rdma/fi_errno.h>

#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>

namespace deltacast::transport::ofi::libfabric {
namespace {

// The soname of libfabric's 1.x ABI, the one the headers describe.
constexpr const char* kLibrary = "libfabric.so.1";

struct Api {
  Status loaded;
  decltype(&fi_getinfo) getinfo = nullptr;
  decltype(&fi_freeinfo) freeinfo = nullptr;
  decltype(&fi_dupinfo) dupinfo = nullptr;
  decltype(&fi_fabric) fabric = nullptr;
  decltype(&fi_strerror) strerror = nullptr;
};

Api LoadApi() {
  Api api;
  // Never closed: providers keep threads and handlers of their own.
  void* handle = ::dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    api.loaded = Status::Unavailable(std::string("ofi transport: cannot load ") + kLibrary + ": " +
                                     (why ? why : "unknown reason"));
    return api;
  }
  auto find = [&](const char* name, auto& slot) {
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(::dlsym(handle, name));
    if (slot == nullptr && api.loaded.ok()) {
      api.loaded =
          Status::Unavailable(std::string("ofi transport: ") + kLibrary + " has no " + name);
    }
  };
  find("fi_getinfo", api.getinfo);
  find("fi_freeinfo", api.freeinfo);
  find("fi_dupinfo", api.dupinfo);
  find("fi_fabric", api.fabric);
  find("fi_strerror", api.strerror);
  return api;
}

std::once_flag once;
Api* api = nullptr;  // set once, never freed (as the library is never closed)

const Api& Get() {
  std::call_once(once, [] { api = new Api(LoadApi()); });
  return *api;
}

}  // namespace

Status Load() { return Get().loaded; }

int GetInfo(uint32_t version, const char* node, const char* service, uint64_t flags,
            const fi_info* hints, fi_info** info) {
  return Get().getinfo(version, node, service, flags, hints, info);
}

void FreeInfo(fi_info* info) { Get().freeinfo(info); }

fi_info* DupInfo(const fi_info* info) { return Get().dupinfo(info); }

int Fabric(fi_fabric_attr* attr, fid_fabric** fabric, void* context) {
  return Get().fabric(attr, fabric, context);
}

const char* StrError(int error) {
  const Api& a = Get();
  return a.loaded.ok() ? a.strerror(error) : std::strerror(error);
}

}  // namespace deltacast::transport::ofi::libfabric
