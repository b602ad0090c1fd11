// What the public-API tests share: a three-node cluster on loopback (a source and
// two receivers) and a small two-tensor model. Header only: the tests link
// libdeltacast.so alone.
#pragma once

#include <deltacast/deltacast.h>

#include <random>
#include <string>
#include <vector>

namespace deltacast::apitest {

// trainer at base_port, w1 at base_port + 3, w2 at base_port + 6; a 3 s connect timeout.
inline std::string Toml(const std::string& name, int base_port) {
  return "[cluster]\nname = \"" + name +
         "\"\n[tree]\nconnect_timeout = \"3s\"\n"
         "[[node]]\nid = \"trainer\"\nhost = \"127.0.0.1\"\nport = " +
         std::to_string(base_port) +
         "\nrole = \"source\"\n[[node]]\nid = \"w1\"\nhost = \"127.0.0.1\"\nport = " +
         std::to_string(base_port + 3) +
         "\n[[node]]\nid = \"w2\"\nhost = \"127.0.0.1\"\nport = " + std::to_string(base_port + 6) +
         "\n";
}

struct Model {
  std::vector<TensorSpec> specs = {{"a.weight", DType::kBF16, {256, 256}},
                                   {"b.bias", DType::kF32, {256}}};
  std::vector<std::vector<std::byte>> bytes;
  explicit Model(uint32_t seed) {
    std::mt19937 rng(seed);
    for (const auto& s : specs) {
      bytes.emplace_back(s.ByteSize());
      for (auto& b : bytes.back()) b = std::byte(rng());
    }
  }
  std::vector<TensorView> Views() {
    std::vector<TensorView> v;
    for (size_t i = 0; i < specs.size(); ++i) v.push_back({specs[i], bytes[i]});
    return v;
  }
};

}  // namespace deltacast::apitest
