// deltacast: the command-line front of the library. Flag parsing only; every
// subcommand's work is in agent/commands.cc.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "agent/audit_command.h"
#include "agent/cluster_commands.h"
#include "agent/commands.h"
#include "agent/config_command.h"
#include "agent/coordinator_command.h"
#include "agent/layout_commands.h"
#include "agent/produce_commands.h"
#include "agent/store_commands.h"
#include "agent/version.h"
#include "common/log.h"

namespace dc = deltacast;
namespace agent = deltacast::agent;

namespace {

// Converts a size flag ("4M") into bytes, or throws CLI11's validation error.
uint64_t SizeFlag(const std::string& text, const char* flag) {
  auto bytes = agent::ParseByteSize(text);
  if (!bytes.ok()) throw CLI::ValidationError(flag, bytes.status().message());
  return *bytes;
}

dc::codec::EntropyCoder EntropyFlag(const std::string& name) {
  if (name == "lz4") return dc::codec::EntropyCoder::kLz4;
  if (name == "none") return dc::codec::EntropyCoder::kNone;
  return dc::codec::EntropyCoder::kZstd;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"deltacast: bit-exact weight deltas for LLM refit"};
  app.set_version_flag("--version", std::string(agent::VersionString()));
  app.require_subcommand(1);
  app.fallthrough();  // global flags (-v, --json-log) may also follow the subcommand
  bool verbose = false, json_log = false;
  app.add_flag("-v,--verbose", verbose, "Debug logging");
  app.add_flag("--json-log", json_log, "Log one JSON object per line (for machines)");
  int status = agent::kExitOk;

  // synth
  agent::SynthOptions synth;
  std::string synth_params = "500M", synth_rate = "3%", synth_shards;
  bool synth_json = false;
  agent::SynthFp8 synth_fp8;
  auto* s = app.add_subcommand(
      "synth", "Generate a synthetic Llama-shaped BF16 checkpoint and training steps");
  s->add_option("--out", synth.out_dir, "Output directory (writes step0 .. stepN)")->required();
  s->add_option("--params", synth_params, "Parameter count, e.g. 500M, 1.5B")
      ->capture_default_str();
  s->add_option("--steps", synth.steps, "Training steps after step0")->capture_default_str();
  s->add_option("--change-rate", synth_rate, "Fraction of BF16 elements changed per step, e.g. 3%")
      ->capture_default_str();
  s->add_option("--lr", synth.lr, "Learning rate (overrides --change-rate)");
  s->add_option("--seed", synth.seed, "Random seed")->capture_default_str();
  s->add_option("--threads", synth.threads, "Threads (0 = all cores)");
  s->add_option("--experts", synth.experts, "Mixture-of-experts MLPs with this many experts");
  s->add_option("--shards", synth_shards,
                "Also write every step's training shards to DIR/stepK.shards/: tp=,pp=,dp=,ep= "
                "(Megatron names, one file per rank) or fsdp=W (FSDP2)");
  s->add_flag("--fp8", synth_fp8.enabled,
              "Also write each step's FP8 serving twin to DIR/stepK-fp8 (docs/fp8.md)");
  s->add_option("--fp8-scheme", synth_fp8.scheme, "FP8 scheme of the default serving description")
      ->capture_default_str();
  s->add_option("--fp8-from", synth_fp8.first_step,
                "With --fp8: twins of steps K..N only (the earlier steps' twins are not written)")
      ->capture_default_str();
  s->add_option("--fp8-serving", synth_fp8.serving,
                "Serving description (TOML) instead of the default one");
  s->add_flag("--json", synth_json, "Report as JSON");
  s->callback([&] {
    auto params = agent::ParseParamCount(synth_params);
    if (!params.ok()) throw CLI::ValidationError("--params", params.status().message());
    auto rate = agent::ParseRate(synth_rate);
    if (!rate.ok()) throw CLI::ValidationError("--change-rate", rate.status().message());
    synth.params = *params;
    synth.change_rate = *rate;
    if (!synth_shards.empty()) {
      auto shards = agent::ParseShardSpec(synth_shards);
      if (!shards.ok()) throw CLI::ValidationError("--shards", shards.status().message());
      synth.shards = *shards;
    }
    status = agent::RunSynth(synth, synth_json, synth_fp8);
  });

  // manifest
  agent::ManifestArgs manifest;
  std::string manifest_partition = "4M";
  auto* m = app.add_subcommand("manifest",
                               "Print a checkpoint directory's version id and partition hashes");
  m->add_option("dir", manifest.dir, "Checkpoint directory")->required();
  m->add_option("--partition-size", manifest_partition, "Partition size")->capture_default_str();
  m->add_option("--threads", manifest.threads, "Threads (0 = all cores)");
  m->add_flag("--partitions", manifest.partitions, "List every partition hash");
  m->add_flag("--json", manifest.json, "Report as JSON");
  m->callback([&] {
    manifest.partition_bytes = SizeFlag(manifest_partition, "--partition-size");
    status = agent::RunManifest(manifest);
  });

  // diff
  agent::DiffArgs diff;
  std::string diff_mode = "fast", diff_entropy = "zstd", diff_chunk = "4M", diff_partition = "4M";
  auto* d = app.add_subcommand("diff", "Encode the delta between two checkpoint directories");
  d->add_option("--base", diff.base, "Base checkpoint directory")->required();
  d->add_option("--new", diff.target, "New checkpoint directory")->required();
  d->add_option("--out", diff.out, "Delta file to write")->required();
  d->add_option("--mode", diff_mode, "fast | context")
      ->check(CLI::IsMember({"fast", "context"}))
      ->capture_default_str();
  d->add_option("--entropy", diff_entropy, "zstd | lz4 | none (fast-mode entropy stage)")
      ->check(CLI::IsMember({"zstd", "lz4", "none"}))
      ->capture_default_str();
  d->add_option("--zstd-level", diff.encoder.codec.zstd_level, "zstd level")->capture_default_str();
  d->add_flag("--try-every-encoding", diff.encoder.codec.try_every_encoding,
              "Try all encodings on every partition, not just the likely ones");
  d->add_option("--chunk-size", diff_chunk, "Chunk size")->capture_default_str();
  d->add_option("--partition-size", diff_partition, "Partition size")->capture_default_str();
  d->add_option("--threads", diff.encoder.threads, "Threads (0 = all cores)");
  d->add_flag("--json", diff.json, "Report as JSON");
  d->callback([&] {
    diff.encoder.codec.mode =
        diff_mode == "context" ? dc::codec::CodecMode::kContext : dc::codec::CodecMode::kFast;
    diff.encoder.codec.entropy = EntropyFlag(diff_entropy);
    diff.encoder.chunk_bytes = SizeFlag(diff_chunk, "--chunk-size");
    diff.partition_bytes = SizeFlag(diff_partition, "--partition-size");
    status = agent::RunDiff(diff);
  });

  // patch
  agent::PatchArgs patch;
  auto* p = app.add_subcommand("patch", "Apply a delta file to a checkpoint directory in place");
  p->add_option("--store", patch.store, "Checkpoint directory to patch")->required();
  p->add_option("--delta", patch.delta, "Delta file")->required();
  p->add_option("--repair-from", patch.repair_from,
                "Checkpoint directory at the target version to repair torn partitions from");
  p->add_option("--threads", patch.threads, "Threads (0 = all cores)");
  p->add_flag("--json", patch.json, "Report as JSON");
  p->callback([&] { status = agent::RunPatch(patch); });

  // inspect
  agent::InspectArgs inspect;
  auto* i = app.add_subcommand("inspect", "Describe what a delta file holds");
  i->add_option("delta", inspect.delta, "Delta file")->required();
  i->add_flag("--records", inspect.records, "List every partition record");
  i->add_flag("--json", inspect.json, "Report as JSON");
  i->callback([&] { status = agent::RunInspect(inspect); });

  // verify
  agent::VerifyArgs verify;
  auto* v = app.add_subcommand("verify", "Check two checkpoint directories are byte-identical");
  v->add_option("a", verify.a, "First directory")->required();
  v->add_option("b", verify.b, "Second directory")->required();
  v->add_option("--threads", verify.threads, "Threads (0 = all cores)");
  v->add_flag("--json", verify.json, "Report as JSON");
  v->callback([&] { status = agent::RunVerify(verify); });

  // materialize
  agent::MaterializeArgs materialize;
  auto* mz = app.add_subcommand(
      "materialize",
      "Write a node's committed version (in place, or a snapshot store's snapshot + chain) as a "
      "checkpoint directory");
  mz->add_option("store", materialize.store, "The node's checkpoint directory (--store)")
      ->required();
  mz->add_option("out", materialize.out, "Where to write it (new or empty)")->required();
  mz->add_option("--threads", materialize.threads, "Threads (0 = all cores)");
  mz->add_flag("--json", materialize.json, "Report as JSON");
  mz->callback([&] { status = agent::RunMaterialize(materialize); });

  // audit
  agent::AuditArgs audit;
  auto* au = app.add_subcommand(
      "audit",
      "Check a node's checkpoint directory against the version it holds active (safe beside a "
      "running agent, between refits)");
  au->add_option("dir", audit.dir, "The node's checkpoint directory")->required();
  au->add_option("--threads", audit.threads, "Threads (0 = all cores)");
  au->add_flag("--json", audit.json, "Report as JSON");
  au->callback([&] { status = agent::RunAudit(audit); });

  // plan
  agent::PlanArgs plan;
  std::string plan_delta = "1G";
  auto* pl =
      app.add_subcommand("plan", "Print the relay tree every agent computes from a cluster config");
  pl->add_option("--config", plan.config, "Cluster config (TOML)")->required();
  pl->add_option("--delta-bytes", plan_delta, "Delta size for the predicted refit time")
      ->capture_default_str();
  pl->add_flag("--json", plan.json, "Report as JSON");
  pl->add_option("--stripes", plan.stripes,
                 "Plan this many stripes instead of the config's [tree] stripes")
      ->check(CLI::Range(1, 64));
  pl->callback([&] {
    plan.delta_bytes = SizeFlag(plan_delta, "--delta-bytes");
    status = agent::RunPlan(plan);
  });

  // config
  agent::ConfigArgs config_args;
  auto* co = app.add_subcommand(
      "config",
      "The cluster config reference: a file's effective config with defaults filled in "
      "(--explain), or every key with its default (--defaults); docs/config.md");
  co->add_option("--config", config_args.config, "Cluster config (TOML)");
  auto* co_explain = co->add_flag("--explain", config_args.explain,
                                  "Print the file's effective config (needs --config)");
  auto* co_defaults = co->add_flag("--defaults", config_args.defaults,
                                   "Print every table and key with its default");
  co_explain->excludes(co_defaults);
  co->add_flag("--json", config_args.json, "As JSON");
  co->callback([&] {
    if (!config_args.defaults && config_args.config.empty()) {
      throw CLI::ValidationError("--config", "--explain needs --config FILE (or use --defaults)");
    }
    if (config_args.defaults && !config_args.config.empty()) {
      throw CLI::ValidationError("--defaults", "takes no --config (use --explain --config FILE)");
    }
    config_args.explain = !config_args.defaults;
    status = agent::RunConfig(config_args);
  });

  // certs
  agent::CertsArgs certs;
  auto* ce = app.add_subcommand(
      "certs", "Write the cluster CA, a TLS certificate per node and the source's signing keys");
  ce->add_option("--config", certs.config, "Cluster config (TOML): which nodes")->required();
  ce->add_option("--out", certs.out, "Directory for the files (existing ones are kept)")
      ->required();
  ce->add_option("--days", certs.days, "Certificate lifetime in days")->capture_default_str();
  ce->add_option("--producer", certs.producers,
                 "A producer id to issue a certificate for too (repeat; `deltacast produce "
                 "--rank R` is rank-0000R), for producer links [security] encrypts");
  ce->callback([&] { status = agent::RunCerts(certs); });

  // agent
  agent::AgentArgs node;
  auto* ag = app.add_subcommand("agent", "Run a node agent of the relay tree until SIGINT/SIGTERM");
  ag->add_option("--config", node.config, "Cluster config (TOML)")->required();
  ag->add_option("--node", node.node, "This node's id in the config")->required();
  ag->add_option("--store", node.store,
                 "This node's checkpoint directory (a sender that roots a stripe holds no "
                 "weights: optional, its spool goes there)");
  ag->add_option("--threads", node.threads, "Apply threads (0 = all cores)");
  ag->callback([&] {
    node.progress = !json_log;  // machines read stderr then
    status = agent::RunAgent(node);
  });

  // bucket-uplink, bucket-downlink
  agent::BucketBridgeArgs up_args, down_args;
  down_args.uplink = false;
  for (auto* args : {&up_args, &down_args}) {
    auto* b = app.add_subcommand(
        args->uplink ? "bucket-uplink" : "bucket-downlink",
        args->uplink ? "Run a bucket bridge's source side: join the source as the bridge node "
                       "and write what it sends into the bucket (until SIGINT/SIGTERM)"
                     : "Run a bucket bridge's region side: serve the bridge node's children "
                       "from the bucket (until SIGINT/SIGTERM)");
    b->add_option("--config", args->config, "Cluster config (TOML) with an [objstore] table")
        ->required();
    b->add_option("--node", args->node, "The bridge node's id ([objstore] bridges)")->required();
    b->add_option("--state", args->state, "Folder for its spool (default: a temporary one)");
    b->callback([&status, args] { status = agent::RunBucketBridge(*args); });
  }

  // coordinator
  agent::CoordinatorArgs coordinator;
  auto* coord_cmd = app.add_subcommand(
      "coordinator",
      "Run a standby coordinator: abort, in the commit record store, the refits whose source "
      "was lost (until SIGINT/SIGTERM; docs/recovery.md, \"The commit record\")");
  coord_cmd
      ->add_option("--config", coordinator.config,
                   "Cluster config (TOML) with a [coordination] table")
      ->required();
  coord_cmd
      ->add_option("--id", coordinator.id,
                   "This coordinator's name in the records it writes (\"coordinator:ID\")")
      ->required();
  coord_cmd->callback([&status, &coordinator] { status = agent::RunCoordinator(coordinator); });

  // publish
  agent::PublishArgs publish;
  agent::ProducersArgs producers;
  std::string publish_mode = "fast";
  auto* pu = app.add_subcommand(
      "publish",
      "Stream the delta OLD -> NEW down the relay tree and commit it (from two checkpoints, or "
      "from producers' shards)");
  pu->add_option("--config", publish.config, "Cluster config (TOML)")->required();
  pu->add_option("--base", publish.base,
                 "Base checkpoint directory (what the nodes have); with --producers, optional: "
                 "its manifest spares the producers hashing their base");
  pu->add_option("--new", publish.target, "New checkpoint directory");
  pu->add_option("--producers", producers.producers,
                 "Be the root of this many producers (deltacast produce) instead of encoding");
  pu->add_option("--base-shards", producers.base_shards,
                 "Training shards of the base step (DIR/stepK.shards): run one local producer "
                 "per rank");
  pu->add_option("--new-shards", producers.new_shards, "Training shards of the new step");
  pu->add_option("--listen-producers", producers.listen,
                 "Where producers dial (default: the source's host, port + 1000)");
  pu->add_option("--serving", publish.serving,
                 "Serving description (TOML, docs/fp8.md): quantize the BF16 versions and ship "
                 "the delta between their FP8 serving twins (the nodes hold the twin of BASE)");
  pu->add_option("--mode", publish_mode, "fast | context")
      ->check(CLI::IsMember({"fast", "context"}))
      ->capture_default_str();
  pu->add_option("--threads", publish.threads, "Encode threads (0 = all cores)");
  pu->add_option("--state-dir", publish.state_dir,
                 "The source's decision log, spool and kept deltas (default: .deltacast-source "
                 "beside NEW)");
  pu->add_option("--keep-deltas", publish.keep_deltas,
                 "Committed deltas kept so nodes that missed versions catch up by the chain "
                 "(0: none; they then fetch every partition that differs)")
      ->capture_default_str();
  pu->add_flag("--json", publish.json, "Report as JSON");
  pu->add_flag("!--no-progress", publish.progress, "No progress line");
  pu->callback([&] {
    publish.codec.mode =
        publish_mode == "context" ? dc::codec::CodecMode::kContext : dc::codec::CodecMode::kFast;
    const bool shards = !producers.base_shards.empty() || !producers.new_shards.empty();
    if (shards && (producers.base_shards.empty() || producers.new_shards.empty())) {
      throw CLI::ValidationError("--base-shards", "needs --new-shards too (and the other way)");
    }
    if (shards && producers.producers > 0) {
      throw CLI::ValidationError("--producers", "runs remote producers; --base-shards local ones");
    }
    if (producers.producers > 0 && !publish.serving.empty()) {
      throw CLI::ValidationError(
          "--serving",
          "remote producers quantize their own shards: give each `deltacast produce` the file");
    }
    if (shards || producers.producers > 0) {
      if (!publish.target.empty()) {
        throw CLI::ValidationError("--new", "producers hold the new version; drop --new");
      }
      status = agent::RunPublishFromProducers(publish, producers);
      return;
    }
    if (publish.base.empty() || publish.target.empty()) {
      throw CLI::ValidationError("--base",
                                 "--base and --new are required (or --producers N, or "
                                 "--base-shards and --new-shards)");
    }
    status = agent::RunPublish(publish);
  });

  // produce
  agent::ProduceArgs produce;
  std::string produce_mode = "fast";
  auto* pr = app.add_subcommand(
      "produce", "Be one producer: encode a training rank's shard change for the root");
  pr->add_option("--config", produce.config, "Cluster config (TOML)")->required();
  pr->add_option("--layout", produce.layout, "The rank's layout description (TOML)")->required();
  pr->add_option("--rank", produce.rank, "The rank (names the producer: rank-RRRRR)")->required();
  pr->add_option("--base", produce.base, "The rank's shard at the base step (safetensors)")
      ->required();
  pr->add_option("--new", produce.target, "The rank's shard at the new step")->required();
  pr->add_option("--root", produce.root,
                 "The root's producer address (default: the source's host, port + 1000)");
  pr->add_option("--mode", produce_mode, "fast | context")
      ->check(CLI::IsMember({"fast", "context"}))
      ->capture_default_str();
  pr->add_option("--threads", produce.threads, "Encode threads (0 = all cores)");
  pr->add_option("--serving", produce.serving,
                 "Serving description (TOML, docs/fp8.md): quantize the rank's BF16 shards and "
                 "ship the FP8 serving checkpoint's change");
  pr->add_flag("--json", produce.json, "Report as JSON");
  pr->callback([&] {
    produce.codec.mode =
        produce_mode == "context" ? dc::codec::CodecMode::kContext : dc::codec::CodecMode::kFast;
    status = agent::RunProduce(produce);
  });

  // layout check, layout engine
  auto* la = app.add_subcommand(
      "layout", "Layout descriptions: training ranks' and engines' load plans (docs/layout.md)");
  la->require_subcommand(1);
  agent::LayoutCheckArgs layout_check;
  auto* lc = la->add_subcommand(
      "check",
      "Check that the ranks' layouts cover every canonical element exactly once (no gap, no "
      "overlap), as the root does before a refit");
  lc->add_option("layouts", layout_check.layouts,
                 "Layout files (TOML), or shard directories (all their rank-*.toml)")
      ->required();
  lc->add_option("--shard-dir", layout_check.shard_dir,
                 "Where each layout's shard (STEM.safetensors; header only) lies (default: "
                 "beside the layout)");
  lc->add_flag("--json", layout_check.json, "Report as JSON");
  lc->callback([&] { status = agent::RunLayoutCheck(layout_check); });

  // serve
  agent::ServeArgs serve;
  std::string serve_mode = "fast";
  auto* sv = app.add_subcommand(
      "serve",
      "A long-running source: children join once; reads checkpoint directories from stdin, "
      "one per line (the first is what the cluster holds), publishing each as the next version");
  sv->add_option("--config", serve.config, "Cluster config (TOML)")->required();
  sv->add_option("--state-dir", serve.state_dir, "The source's decision log, spool and kept deltas")
      ->required();
  sv->add_option("--mode", serve_mode, "fast | context")
      ->check(CLI::IsMember({"fast", "context"}))
      ->capture_default_str();
  sv->add_option("--threads", serve.threads, "Encode threads (0 = all cores)");
  sv->add_option("--keep-deltas", serve.keep_deltas, "Committed deltas kept for catch-up")
      ->capture_default_str();
  sv->add_flag("--json", serve.json, "Reports as JSON (one object per publish)");
  sv->callback([&] {
    serve.codec.mode =
        serve_mode == "context" ? dc::codec::CodecMode::kContext : dc::codec::CodecMode::kFast;
    status = agent::RunServe(serve);
  });

  // layout engine
  agent::LayoutEngineArgs engine_layout;
  auto* le = la->add_subcommand(
      "engine", "Write each GPU's load plan for a vLLM or SGLang engine from config.json");
  le->add_option("--config", engine_layout.config, "The checkpoint's config.json")->required();
  le->add_option("--engine", engine_layout.engine, "vllm | sglang")
      ->check(CLI::IsMember({"vllm", "sglang"}))
      ->required();
  le->add_option("--tp", engine_layout.tp, "Tensor-parallel size")->capture_default_str();
  le->add_option("--dp", engine_layout.dp, "Data-parallel size (vLLM)")->capture_default_str();
  le->add_option("--ep", engine_layout.ep,
                 "Expert-parallel size: vLLM 1 or tp x dp (--enable-expert-parallel); SGLang a "
                 "divisor of tp")
      ->capture_default_str();
  le->add_option("--canonical", engine_layout.canonical,
                 "The checkpoint directory or canonical.json (default: config.json's directory)");
  le->add_option("--out", engine_layout.out, "Directory for gpu-<g>.toml")->required();
  le->add_flag("--json", engine_layout.json, "Report as JSON (every GPU's parameters)");
  le->callback([&] { status = agent::RunLayoutEngine(engine_layout); });

  app.parse_complete_callback([&] {
    dc::log::SetLevel(verbose ? dc::log::Level::kDebug : dc::log::Level::kInfo);
    dc::log::SetJson(json_log);
  });
  CLI11_PARSE(app, argc, argv);
  return status;
}
