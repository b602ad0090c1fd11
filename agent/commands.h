// The bodies of the deltacast subcommands. main.cc parses flags into these option
// structs; each Run function prints its report (text, or JSON with `json`) to
// stdout, errors to stderr, and returns the process exit status.
//
// Thread safety: each call runs on the calling thread plus its own workers.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "agent/synth.h"
#include "codec/delta_encoder.h"

namespace deltacast::agent {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // the operation failed (message on stderr)
inline constexpr int kExitDiffers = 2;  // verify: the directories differ

// `synth --fp8`: also write each step's FP8 serving twin (agent/fp8_twin.h) to
// out/stepK-fp8, by the description in `serving` or, without one, synth's default
// description with `scheme`.
struct SynthFp8 {
  bool enabled = false;
  std::string scheme = "fp8_e4m3_block128";
  std::filesystem::path serving;
};

int RunSynth(const SynthOptions& options, bool json, const SynthFp8& fp8 = {});

struct ManifestArgs {
  std::filesystem::path dir;
  uint64_t partition_bytes = codec::kDefaultPartitionBytes;
  size_t threads = 0;
  bool partitions = false;  // list every partition hash
  bool json = false;
};
int RunManifest(const ManifestArgs& args);

struct DiffArgs {
  std::filesystem::path base, target, out;
  codec::DeltaEncoderOptions encoder;
  uint64_t partition_bytes = codec::kDefaultPartitionBytes;
  bool json = false;
};
int RunDiff(const DiffArgs& args);

struct PatchArgs {
  std::filesystem::path store, delta, repair_from;
  size_t threads = 0;
  bool json = false;
};
int RunPatch(const PatchArgs& args);

struct InspectArgs {
  std::filesystem::path delta;
  bool records = false;  // list every record
  bool json = false;
};
int RunInspect(const InspectArgs& args);

struct VerifyArgs {
  std::filesystem::path a, b;
  size_t threads = 0;
  bool json = false;
};
int RunVerify(const VerifyArgs& args);

// "4M", "4MiB", "512k", "1G", "4194304" -> bytes (binary multiples).
Result<uint64_t> ParseByteSize(std::string_view text);

}  // namespace deltacast::agent
