// libfabric, loaded into the process the first time an ofi transport needs it.
//
// Linking libfabric.so.1 loads its provider libraries with it (PSM, PSM2,
// infinipath, verbs, EFA), and their constructors run before main: on the VMs
// measured here they calibrate clocks for ~0.2 s, which every command paid, even
// `deltacast --version` (README, "Encode speed of the command line"). Only five
// libfabric functions are called by name; every other fi_* call is an inline
// function of the headers going through the objects these return, so they are
// looked up once with dlopen/dlsym and nothing else changes.
//
// Thread safety: Load() may be called from any thread, any number of times; the
// functions below may be called once Load() has succeeded.
#pragma once

#include <rdma/fabric.h>

#include <cstdint>

#include "common/status.h"

namespace deltacast::transport::ofi::libfabric {

// Loads libfabric.so.1 and looks up the functions below, once per process.
// kUnavailable, naming the library and the loader's reason, when it is absent or
// lacks one of them (every later call returns the same status).
Status Load();

// libfabric's functions of the same names (fi_getinfo, fi_freeinfo, fi_dupinfo,
// fi_fabric, fi_strerror).
int GetInfo(uint32_t version, const char* node, const char* service, uint64_t flags,
            const fi_info* hints, fi_info** info);
void FreeInfo(fi_info* info);
fi_info* DupInfo(const fi_info* info);
int Fabric(fi_fabric_attr* attr, fid_fabric** fabric, void* context);
// Also before Load() (then the C library's text for the errno-valued codes).
const char* StrError(int error);

}  // namespace deltacast::transport::ofi::libfabric
