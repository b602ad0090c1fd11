#include "agent/layout_commands.h"

#include <fmt/core.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "agent/commands.h"
#include "layout/engine.h"
#include "layout/placement.h"
#include "quant/engine_config.h"
#include "relay/producers/shard_input.h"

namespace deltacast::agent {
namespace {

namespace fs = std::filesystem;

int Fail(const Status& status) {
  fmt::print(stderr, "deltacast: {}\n", status.ToString());
  return kExitFailure;
}

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

int RunLayoutEngine(const LayoutEngineArgs& args) {
  auto engine = layout::ParseEngine(args.engine);
  if (!engine) return Fail(Status::InvalidArgument("--engine must be vllm or sglang"));
  auto config = quant::LoadEngineConfig(args.config);
  if (!config.ok()) return Fail(config.status());
  const fs::path canonical_path =
      args.canonical.empty() ? args.config.parent_path() : args.canonical;
  auto table = relay::LoadCanonicalTable(canonical_path.empty() ? "." : canonical_path);
  if (!table.ok()) return Fail(table.status().WithContext("canonical table (--canonical)"));
  std::vector<TensorSpec> canonical;
  for (const auto& t : *table) canonical.push_back({t.name, t.dtype, t.shape});
  if (canonical.empty()) {
    return Fail(Status::InvalidArgument("the canonical table " + canonical_path.string() +
                                        " lists no tensors"));
  }

  const layout::EngineParallel p{*engine, args.tp, args.dp, args.ep};
  auto paths = layout::WriteEngineLayouts(*config, p, canonical_path, args.out);
  if (!paths.ok()) return Fail(paths.status());

  // Read back as any user's files are: every GPU's parameters (names, shapes,
  // dtypes), and that together the plans hold every canonical element once.
  nlohmann::json report = nlohmann::json::array();
  std::vector<layout::PlacementMap> maps;
  for (const fs::path& path : *paths) {
    auto d = layout::LoadLayout(path);
    if (!d.ok()) return Fail(d.status());
    auto expected = layout::ExpectedLocals(*d, canonical);
    if (!expected.ok()) return Fail(expected.status());
    std::vector<TensorSpec> locals;
    nlohmann::json params = nlohmann::json::array();
    for (const layout::ExpectedLocal& x : *expected) {
      auto it = std::find_if(canonical.begin(), canonical.end(),
                             [&](const TensorSpec& t) { return t.name == x.canonical; });
      locals.push_back({x.name, it->dtype, x.shape});
      params.push_back({{"name", x.name}, {"shape", x.shape}, {"dtype", DTypeName(it->dtype)}});
    }
    auto map = layout::ExpandPlacement(*d, canonical, locals);
    if (!map.ok()) return Fail(map.status());
    maps.push_back(std::move(*map));
    report.push_back({{"layout", path.string()}, {"parameters", params}});
  }
  std::vector<const layout::PlacementMap*> pointers;
  for (const auto& m : maps) pointers.push_back(&m);
  if (Status s = layout::CheckCoverage(pointers); !s.ok()) {
    return Fail(s.WithContext("the plans do not hold the checkpoint " + canonical_path.string()));
  }
  if (args.json) {
    fmt::print("{}\n", nlohmann::json{{"engine", args.engine},
                                      {"tp", args.tp},
                                      {"dp", args.dp},
                                      {"ep", args.ep},
                                      {"gpus", report}}
                           .dump(2));
    return kExitOk;
  }
  for (size_t g = 0; g < paths->size(); ++g) {
    const auto& params = report[g]["parameters"];
    fmt::print("GPU {}: {} ({} parameters", g, (*paths)[g].string(), params.size());
    if (!params.empty()) {
      fmt::print(", e.g. {} {}", params[0]["name"].get<std::string>(),
                 ShapeText(params[0]["shape"].get<std::vector<uint64_t>>()));
    }
    fmt::print(")\n");
  }
  fmt::print("the {} plans hold every element of the {} tensors of {} exactly once\n",
             paths->size(), canonical.size(), canonical_path.string());
  return kExitOk;
}

}  // namespace deltacast::agent
