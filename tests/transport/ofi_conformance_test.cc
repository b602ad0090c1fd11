// The conformance suite over the ofi backend, once per libfabric provider:
// tcp;ofi_rxm on loopback and shm (named endpoints, see docs/transport.md "ofi"),
// and both again with OfiRegistration::kAlways: every buffer registered and its
// descriptor passed, as verbs;ofi_rxm and efa require (neither provider here does).
#include <gtest/gtest.h>

#include "tests/transport/conformance_suite.h"
#include "transport/ofi/ofi_transport.h"

namespace deltacast::transport {
namespace {

std::unique_ptr<Transport> Ofi(const MakeArgs& args, const std::string& provider,
                               OfiRegistration registration = OfiRegistration::kAuto) {
  OfiOptions options;
  options.register_memory = registration;
  options.max_message_bytes = args.max_message_bytes;
  options.provider = provider;
  options.net_device = "lo";
  // A closed address is silence on RDM (rxm retries refused connections), reported
  // as kUnavailable after connect_timeout; the suite wants that under 4 s.
  options.connect_timeout = std::chrono::milliseconds(1500);
  auto transport = MakeOfiTransport(options);
  EXPECT_TRUE(transport.ok()) << transport.status().ToString();
  return transport.ok() ? std::move(transport).value() : nullptr;
}

BackendParam TcpRxmParam() {
  return {.name = "OfiTcpRxm",
          .make = [](const MakeArgs& a) { return Ofi(a, "tcp;ofi_rxm"); },
          .expected_backend = "ofi"};
}

BackendParam ShmParam() {
  // shm addresses are endpoint names: any string is one, so nothing is malformed.
  return {.name = "OfiShm",
          .make = [](const MakeArgs& a) { return Ofi(a, "shm"); },
          .expected_backend = "ofi",
          .rejects_malformed_address = false,
          .listen_address = "dc-test:0"};
}

BackendParam TcpRxmRegisteredParam() {
  BackendParam param = TcpRxmParam();
  param.name = "OfiTcpRxmRegistered";
  param.make = [](const MakeArgs& a) { return Ofi(a, "tcp;ofi_rxm", OfiRegistration::kAlways); };
  return param;
}

BackendParam ShmRegisteredParam() {
  BackendParam param = ShmParam();
  param.name = "OfiShmRegistered";
  param.make = [](const MakeArgs& a) { return Ofi(a, "shm", OfiRegistration::kAlways); };
  return param;
}

INSTANTIATE_TEST_SUITE_P(Ofi, ConformanceTest,
                         ::testing::Values(TcpRxmParam(), ShmParam(), TcpRxmRegisteredParam(),
                                           ShmRegisteredParam()),
                         BackendParamName);

}  // namespace
}  // namespace deltacast::transport
