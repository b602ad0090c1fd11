// The conformance suite over the built-in backends: tcp with 1 and 4 streams per
// link, inproc, and the fault wrapper with an empty plan over tcp.
#include <gtest/gtest.h>

#include "tests/transport/conformance_suite.h"
#include "transport/fault_transport.h"
#include "transport/inproc/inproc_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace deltacast::transport {
namespace {

std::unique_ptr<Transport> Tcp(const MakeArgs& args, uint32_t streams) {
  TcpOptions options;
  options.max_message_bytes = args.max_message_bytes;
  options.streams_per_link = streams;
  auto transport = MakeTcpTransport(options);
  EXPECT_TRUE(transport.ok()) << transport.status().ToString();
  return transport.ok() ? std::move(transport).value() : nullptr;
}

BackendParam TcpParam() {
  return {.name = "Tcp",
          .make = [](const MakeArgs& a) { return Tcp(a, 1); },
          .expected_backend = "tcp"};
}

BackendParam Tcp4StreamsParam() {
  return {.name = "Tcp4Streams",
          .make = [](const MakeArgs& a) { return Tcp(a, 4); },
          .expected_backend = "tcp",
          .streams_per_link = 4};
}

BackendParam InprocParam() {
  return {.name = "Inproc",
          .make =
              [](const MakeArgs& a) {
                return MakeInprocTransport(a.network, InprocOptions{a.max_message_bytes});
              },
          .expected_backend = "inproc",
          .rejects_malformed_address = false};
}

BackendParam FaultOverTcpParam() {
  return {.name = "FaultEmptyPlanOverTcp",
          .make = [](const MakeArgs& a) { return WrapWithFaults(Tcp(a, 1), FaultPlan{}); },
          .expected_backend = "fault(tcp)",
          .is_fault_wrapper = true};
}

INSTANTIATE_TEST_SUITE_P(Backends, ConformanceTest,
                         ::testing::Values(TcpParam(), Tcp4StreamsParam(), InprocParam(),
                                           FaultOverTcpParam()),
                         BackendParamName);

}  // namespace
}  // namespace deltacast::transport
