// Embedding deltacast: a trainer and a rollout worker in one program, through the
// public API only (include/deltacast/deltacast.h; link deltacast::deltacast).
//
// The trainer keeps a long-lived Source and publishes its weights, in-memory
// tensors, every training step. The rollout worker runs a Node over its own buffers
// (in a real system, the inference engine's weights), patched in place; when a
// version commits, its callback learns which tensors changed, so it can reload just
// those.
//
// Run: deltacast_example_embed [STEPS]   (exit status 0 when the worker ends up
// bit-identical to the trainer after every step).
#include <deltacast/deltacast.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

// One source and one receiver on loopback; ports picked from the process id so
// concurrent runs do not collide.
std::string ClusterToml() {
  // Below the ephemeral port range (32768+), so no outgoing connection holds it.
  const int port = 29600 + static_cast<int>(::getpid() % 1500) * 2;
  return "[cluster]\nname = \"embed\"\n[tree]\nconnect_timeout = \"10s\"\n"
         "[[node]]\nid = \"trainer\"\nhost = \"127.0.0.1\"\nport = " +
         std::to_string(port) +
         "\nrole = \"source\"\n"
         "[[node]]\nid = \"worker\"\nhost = \"127.0.0.1\"\nport = " +
         std::to_string(port + 1) + "\n";
}

using Buffers = std::vector<std::vector<std::byte>>;

std::vector<deltacast::TensorView> Views(const std::vector<deltacast::TensorSpec>& specs,
                                         Buffers& buffers) {
  std::vector<deltacast::TensorView> views;
  for (size_t i = 0; i < specs.size(); ++i) views.push_back({specs[i], buffers[i]});
  return views;
}

int Fail(const char* what, const deltacast::Status& status) {
  std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 3;
  deltacast::SetLogLevel(deltacast::LogLevel::kWarn);
  // The model: two BF16 matrices and a norm.
  const std::vector<deltacast::TensorSpec> specs = {
      {"model.layers.0.mlp.up_proj.weight", deltacast::DType::kBF16, {1024, 1024}},
      {"model.layers.0.self_attn.q_proj.weight", deltacast::DType::kBF16, {1024, 1024}},
      {"model.norm.weight", deltacast::DType::kBF16, {1024}}};
  std::mt19937 rng(7);
  Buffers trainer;
  for (const auto& spec : specs) {
    std::vector<std::byte> bytes(spec.ByteSize());
    for (auto& b : bytes) b = std::byte(rng());
    trainer.push_back(std::move(bytes));
  }

  auto config = deltacast::Config::Parse(ClusterToml(), "embed.toml");
  if (!config.ok()) return Fail("config", config.status());
  const std::string token = "example-token";

  // Rollout worker: its own buffers hold the trainer's current weights.
  Buffers worker_weights = trainer;
  deltacast::NodeOptions worker_options;
  worker_options.node_id = "worker";
  worker_options.token = token;
  worker_options.on_commit = [](const deltacast::CommitEvent& e) {
    std::printf("worker: version %.12s committed; reload:", e.version.c_str());
    for (const auto& name : e.changed_tensors) std::printf(" %s", name.c_str());
    std::printf("\n");
  };
  auto worker = deltacast::Node::Start(*config, worker_options, Views(specs, worker_weights));
  if (!worker.ok()) return Fail("worker", worker.status());

  // Trainer: a long-lived source; `previous` is what the fleet holds.
  deltacast::SourceOptions source_options;
  source_options.token = token;
  auto source = deltacast::Source::Start(*config, source_options);
  if (!source.ok()) return Fail("source", source.status());
  bool ok = true;
  for (int step = 0; step < steps && ok; ++step) {
    Buffers previous = trainer;
    // A training step: about 2% of the matrices' elements move by one unit in the
    // last place.
    for (size_t t = 0; t + 1 < trainer.size(); ++t) {
      for (size_t i = 0; i < trainer[t].size(); i += 2) {
        if (rng() % 50 == 0) trainer[t][i] ^= std::byte{1};
      }
    }
    auto report = (*source)->Publish(Views(specs, previous), Views(specs, trainer));
    if (!report.ok()) return Fail("publish", report.status());
    std::printf(
        "trainer: step %d %s, %llu delta bytes for %llu bytes of weights, first chunk "
        "%.1f ms after the call\n",
        step + 1, report->committed ? "committed" : ("aborted: " + report->abort_reason).c_str(),
        static_cast<unsigned long long>(report->delta_bytes),
        static_cast<unsigned long long>(report->checkpoint_bytes),
        report->call_to_first_chunk_seconds * 1e3);
    const bool identical = worker_weights == trainer;
    std::printf("worker weights %s the trainer's\n",
                identical ? "are bit-identical to" : "DIFFER from");
    ok = report->committed && identical;
  }
  (*source)->Stop();
  (*worker)->Stop();
  return ok ? 0 : 1;
}
