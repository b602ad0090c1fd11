// The many-producer subcommands (docs/producers.md):
//   deltacast produce  one producer: a training rank's shard pair through its layout
//   deltacast publish --producers N | --base-shards OLD --new-shards NEW: the root
//     waiting for N producers, or running one local producer per rank of two shard
//     directories (`deltacast synth --shards` writes them).
//   deltacast layout check  a set of ranks' layout files, offline: every canonical element
//     covered exactly once (what the root checks before a refit).
// Producers dial the root at the source's host, port + relay::kProducerPortOffset, unless
// --root / --listen-producers say otherwise.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "agent/cluster_commands.h"

namespace deltacast::agent {

struct ProduceArgs {
  std::filesystem::path config, layout, base, target;
  uint64_t rank = 0;
  std::string root;  // "host:port"; empty: the source's host, port + relay::kProducerPortOffset
  codec::EncodeOptions codec;
  size_t threads = 0;
  bool json = false;
  // A serving description: quantize the shard pair and ship its FP8 image's change
  // (docs/fp8.md, "Producers"); every producer of the root must have the same.
  std::filesystem::path serving;
};
// Exit status 0 when the refit committed.
int RunProduce(const ProduceArgs& args);

struct ProducersArgs {
  size_t producers = 0;                           // wait for this many remote producers
  std::filesystem::path base_shards, new_shards;  // or run local ones over these
  std::string listen;                             // where producers dial; empty: the default above
};
// The root: `publish` with producers. With `args.base` set, the base version's
// manifest comes from that canonical checkpoint; otherwise producers hash theirs.
int RunPublishFromProducers(const PublishArgs& args, const ProducersArgs& producers);

struct LayoutCheckArgs {
  // Layout files, or directories whose rank-*.toml files are all taken.
  std::vector<std::filesystem::path> layouts;
  // Where each layout's shard (its stem + .safetensors; only the header is read)
  // lies; empty: beside the layout file.
  std::filesystem::path shard_dir;
  bool json = false;
};
// Exit status 0 when the ranks cover every canonical element exactly once, 2 when
// they do not (the error names the tensor, the elements and the rules), 1 when a
// file cannot be read.
int RunLayoutCheck(const LayoutCheckArgs& args);

}  // namespace deltacast::agent
