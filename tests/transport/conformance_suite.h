// The transport conformance suite: what transport.h promises, as one TEST_P suite
// (conformance_suite.cc) that each backend instantiates in its own test file with
// INSTANTIATE_TEST_SUITE_P(Name, ConformanceTest, ::testing::Values(BackendParam...)).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "tests/transport/test_util.h"
#include "transport/inproc/inproc_transport.h"
#include "transport/transport.h"

namespace deltacast::transport {

// What a backend's factory gets from the fixture.
struct MakeArgs {
  uint64_t max_message_bytes = kDefaultMaxMessageBytes;
  std::shared_ptr<InprocNetwork> network;  // shared by every transport of one test
};

// One backend (and configuration) the suite runs against.
struct BackendParam {
  std::string name;  // a gtest name: letters, digits, underscores
  std::function<std::unique_ptr<Transport>(const MakeArgs&)> make;
  std::string expected_backend;           // capabilities().backend
  uint32_t streams_per_link = 1;          // capabilities().streams_per_link
  bool is_fault_wrapper = false;          // AsFaultTransport() finds it
  bool rejects_malformed_address = true;  // "no-port-here" is kInvalidArgument
  std::string listen_address = "127.0.0.1:0";
};

inline std::ostream& operator<<(std::ostream& os, const BackendParam& p) { return os << p.name; }

inline std::string BackendParamName(const ::testing::TestParamInfo<BackendParam>& info) {
  return info.param.name;
}

class ConformanceTest : public ::testing::TestWithParam<BackendParam> {
 protected:
  std::unique_ptr<Transport> Make(uint64_t max_message_bytes = kDefaultMaxMessageBytes) {
    auto transport = GetParam().make(MakeArgs{max_message_bytes, network_});
    EXPECT_NE(transport, nullptr) << GetParam().name << ": the factory failed";
    return transport;
  }

  // Listens on `server` and connects `client` to it.
  using Link = testutil::LinkEnds;
  Link Connect(Transport& server, Transport& client) {
    return testutil::ListenAndConnect(server, client, GetParam().listen_address, accept_);
  }
  Link ConnectTo(const std::string& address, Transport& client) {
    return testutil::ConnectTo(address, client, accept_);
  }

  std::shared_ptr<InprocNetwork> network_ = std::make_shared<InprocNetwork>();
  testutil::AcceptQueue accept_;
};

}  // namespace deltacast::transport
