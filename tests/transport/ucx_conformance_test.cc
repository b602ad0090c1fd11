// The conformance suite over the UCX backend, twice: data over UCX's tcp transport
// on the loopback device, and over shared memory (link setup still goes through
// UCX's TCP connection manager).
#include <gtest/gtest.h>

#include "tests/transport/conformance_suite.h"
#include "transport/ucx/ucx_transport.h"

namespace deltacast::transport {
namespace {

std::unique_ptr<Transport> Ucx(const MakeArgs& args, const std::string& tls) {
  UcxOptions options;
  options.max_message_bytes = args.max_message_bytes;
  options.tls = tls;
  options.net_devices = "lo";
  auto transport = MakeUcxTransport(options);
  EXPECT_TRUE(transport.ok()) << transport.status().ToString();
  return transport.ok() ? std::move(transport).value() : nullptr;
}

BackendParam UcxTcpParam() {
  return {.name = "UcxTcp",
          .make = [](const MakeArgs& a) { return Ucx(a, "tcp"); },
          .expected_backend = "ucx(tcp)"};
}

BackendParam UcxShmParam() {
  return {.name = "UcxShm",
          .make = [](const MakeArgs& a) { return Ucx(a, "shm"); },
          .expected_backend = "ucx(shm)"};
}

INSTANTIATE_TEST_SUITE_P(Ucx, ConformanceTest, ::testing::Values(UcxTcpParam(), UcxShmParam()),
                         BackendParamName);

}  // namespace
}  // namespace deltacast::transport
