// For tests/python/test_fp8_reference.py: quantizes a raw little-endian BF16 file
// with the C++ quantizer and writes the E4M3 bytes and the FP32 scales, so the
// Python reference can compare them byte for byte.
//   fp8_quantize_tool SCHEME ROWS COLS IN.bf16 OUT.fp8 OUT.scale [cpu|avx2|baseline|cuda]
// Exit 0 on success, 1 with the error on stderr, 77 when "cuda" has no device.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "quant/fp8_cuda.h"
#include "quant/fp8_quantizer.h"

int main(int argc, char** argv) {
  using namespace deltacast::quant;
  if (argc < 7) {
    std::fprintf(stderr,
                 "usage: %s SCHEME ROWS COLS IN OUT_FP8 OUT_SCALE [cpu|avx2|baseline|cuda]\n",
                 argv[0]);
    return 2;
  }
  const Fp8Scheme* scheme = FindFp8Scheme(argv[1]);
  if (scheme == nullptr) {
    std::fprintf(stderr, "unknown scheme %s\n", argv[1]);
    return 2;
  }
  const uint64_t rows = std::strtoull(argv[2], nullptr, 10);
  const uint64_t cols = std::strtoull(argv[3], nullptr, 10);
  const std::string path = argc > 7 ? argv[7] : "cpu";
  std::ifstream in(argv[4], std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<uint16_t> x(raw.size() / 2);
  std::memcpy(x.data(), raw.data(), x.size() * 2);
  const std::vector<uint64_t> grid = scheme->ScaleShape(rows, cols);
  std::vector<uint8_t> w(rows * cols);
  std::vector<float> s(grid[0] * grid[1]);
  deltacast::Status st;
  if (path == "cuda") {
    if (!Fp8CudaAvailable()) return 77;
    st = QuantizeFp8Cuda(*scheme, "input", x, rows, cols, w, s);
  } else {
    // "cpu": the best loops here; "avx2" / "baseline": at most those.
    LimitFp8CpuPath(path == "baseline" ? Fp8CpuLoops::kBaseline
                    : path == "avx2"   ? Fp8CpuLoops::kAvx2
                                       : Fp8CpuLoops::kAvx512);
    st = QuantizeFp8(*scheme, "input", x, rows, cols, w, s);
  }
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  std::ofstream(argv[5], std::ios::binary).write(reinterpret_cast<const char*>(w.data()), w.size());
  std::ofstream(argv[6], std::ios::binary)
      .write(reinterpret_cast<const char*>(s.data()), s.size() * sizeof(float));
  return 0;
}
