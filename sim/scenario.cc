#include "sim/scenario.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string_view>

namespace deltacast::sim {

const char* FaultName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kReset:
      return "reset";
    case FaultKind::kStall:
      return "stall";
    case FaultKind::kPartition:
      return "partition";
    case FaultKind::kLoss:
      return "loss";
    case FaultKind::kKillNode:
      return "kill-node";
    case FaultKind::kKillSource:
      return "kill-source";
    case FaultKind::kLateJoin:
      return "late-join";
    case FaultKind::kFullDisk:
      return "full-disk";
    case FaultKind::kOutage:
      return "outage";
    case FaultKind::kCrashAt:
      return "crash-at";
  }
  return "?";
}

const char* TrainerFaultName(TrainerFaultKind kind) {
  switch (kind) {
    case TrainerFaultKind::kNone:
      return "none";
    case TrainerFaultKind::kStaleBase:
      return "stale-base";
    case TrainerFaultKind::kCorruptBase:
      return "corrupt-base";
    case TrainerFaultKind::kOverlap:
      return "overlap";
  }
  return "?";
}

namespace {

// Snapshot stores (relay/store/snapshot_store.h) for some of the nodes without an engine,
// and faults aimed at them; from a generator of their own, so the rest of the
// schedule is the seed's as without. Their faults go after the others (`faults`
// sorted already), so every other fault keeps its index (--drop).
void DrawSnapshots(Scenario& s, double intensity, bool disk) {
  std::mt19937_64 snap(s.seed * 0xA0761D6478BD642Full + 11);
  auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(snap) < p; };
  auto pick = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(snap);
  };
  s.snapshots.resize(s.nodes + 1);
  std::vector<int> chosen;
  for (int i = 1; i <= s.nodes; ++i) {
    // The engine model checks the store file, which a snapshot store never writes.
    const bool candidate = !s.engines[i].engine && !s.engines[i].staged;
    NodeSnapshots& n = s.snapshots[i];
    n.on = chance(0.7) && candidate;
    // Often: a build every two or three refits, or once the chain passes 20-90 % of
    // the model (a large delta's spool is ~40 % of it), at 64 KiB/s-1 MiB/s: the
    // model's ~200 KiB take 0.2-3 s of simulated time to write, so faults land inside.
    n.every = 2 + static_cast<uint32_t>(snap() % 2);
    n.chain_percent = chance(0.5) ? 0 : 20 + static_cast<uint32_t>(snap() % 71);
    n.rate = static_cast<uint64_t>(std::pow(2.0, pick(16, 20)));
    if (n.on) chosen.push_back(i);
  }
  if (chosen.empty() || intensity <= 0 || s.producers > 0) return;
  const size_t before = s.faults.size();
  // Crash points inside the refit's commit, a build and the switch.
  const int crashes = static_cast<int>(std::round(intensity * (snap() % 4)));
  for (int k = 0; k < crashes; ++k) {
    Fault f{0, 0, FaultKind::kCrashAt, chosen[snap() % chosen.size()], 0, 0};
    f.publish = static_cast<int>(snap() % s.publishes);
    f.at = pick(0, 0.5);
    constexpr int kChoices = std::size(kSnapshotCrashPoints);
    f.point = kSnapshotCrashPoints[snap() % kChoices];
    f.seconds = chance(0.5) ? pick(0, 0.3) : pick(0.5, 6);
    f.power = disk && chance(0.5);
    s.faults.push_back(f);
  }
  // Kills at any time (a build runs for seconds after a commit, between publishes too).
  const int kills = static_cast<int>(std::round(intensity * (snap() % 3)));
  for (int k = 0; k < kills; ++k) {
    Fault f{0, 0, FaultKind::kKillNode, chosen[snap() % chosen.size()], 0, 0};
    f.publish = static_cast<int>(snap() % s.publishes);
    f.at = pick(0, 1.5);
    f.seconds = chance(0.3) ? pick(0, 0.2) : pick(0.5, 6);
    f.power = disk && chance(0.5);
    s.faults.push_back(f);
  }
  std::stable_sort(s.faults.begin() + static_cast<long>(before), s.faults.end(),
                   [](const Fault& x, const Fault& y) {
                     return x.publish != y.publish ? x.publish < y.publish : x.at < y.at;
                   });
}

}  // namespace

Scenario DrawScenario(uint64_t seed, double intensity, bool disk, bool outages, bool producers,
                      bool staged, bool snapshots) {
  // Its own generator (not the run's): the scenario is fixed before the run draws.
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  auto below = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  Scenario s;
  s.seed = seed;
  s.nodes = 2 + below(6);  // 2..7
  s.fanout = 1 + below(3);
  s.policy_available = below(2) == 1;
  s.keep_deltas = below(3) == 0 ? 0 : 4;
  s.write_back_ms = below(2) ? 0 : 300;
  s.publishes = 4 + below(7);
  for (int i = 0; i < s.publishes; ++i) {
    // 0.01 % .. 30 % of the elements, log-uniform: tiny and huge deltas both.
    s.change_rates.push_back(std::pow(10.0, uniform(-4, std::log10(0.3))));
    s.gaps.push_back(below(3) == 0 ? 0 : uniform(0, 3));
  }
  // Late joiners: under policy `all` a publish waits for them (and fails after the
  // connect timeout), under `available` it goes on without them.
  const int late = below(3) == 0 ? 1 + below(std::max(1, s.nodes / 2)) : 0;
  // A publish of these models takes 0.1 to 0.5 s of simulated time without faults: a
  // fault falls in its first half second, so it hits every phase of a refit.
  auto when = [&](Fault& f) {
    f.publish = below(s.publishes);
    f.at = uniform(0, 0.5);
  };
  for (int i = 0; i < late; ++i) {
    const int node = 1 + below(s.nodes);
    if (!s.late.insert(node).second) continue;
    Fault f{0, 0, FaultKind::kLateJoin, node, 0, 0};
    when(f);
    s.faults.push_back(f);
  }
  const int count = static_cast<int>(std::round(intensity * (1 + below(8))));
  for (int i = 0; i < count; ++i) {
    Fault f;
    when(f);
    // Not kLateJoin nor the disk's faults, drawn below: the draws before the disk was
    // simulated stay as they were, so an old seed keeps its network and kill faults.
    f.kind = static_cast<FaultKind>(below(static_cast<int>(FaultKind::kLateJoin)));
    f.a = below(s.nodes + 1);
    f.b = below(s.nodes + 1);
    if (f.b == f.a) f.b = (f.a + 1) % (s.nodes + 1);
    switch (f.kind) {
      case FaultKind::kReset:
        break;
      case FaultKind::kStall:
        f.seconds = uniform(0.05, 8);
        break;
      case FaultKind::kPartition:
        f.seconds = uniform(0.1, 10);
        break;
      case FaultKind::kLoss:
        f.seconds = uniform(0.5, 5);
        break;
      case FaultKind::kKillNode:
        f.a = 1 + below(s.nodes);
        f.seconds = uniform(0, 1) < 0.3 ? uniform(0, 0.2) : uniform(0.5, 12);
        break;
      case FaultKind::kKillSource:
        f.seconds = uniform(0.05, 6);
        break;
      case FaultKind::kLateJoin:
      case FaultKind::kFullDisk:
      case FaultKind::kOutage:
      case FaultKind::kCrashAt:
        break;
    }
    s.faults.push_back(f);
  }
  if (disk) {
    for (Fault& f : s.faults) {
      if (f.kind == FaultKind::kKillNode || f.kind == FaultKind::kKillSource) f.power = below(2);
    }
    const int full = static_cast<int>(std::round(intensity * below(3)));
    for (int i = 0; i < full; ++i) {
      Fault f{0, 0, FaultKind::kFullDisk, below(s.nodes + 1), 0, 0};
      when(f);
      f.seconds = uniform(0.2, 6);
      s.faults.push_back(f);
    }
    // Drawn last, so every other fault of a seed is what it was before outages.
    // One run in six: a node dies and stays away 25-45 s, longer than the commit
    // timeout (20 s), so every wait for it that is not bounded by the connect
    // timeout is spent in full (the time-lost checker counts from its start).
    const int outage = outages && below(6) == 0 ? static_cast<int>(std::round(intensity)) : 0;
    for (int i = 0; i < outage; ++i) {
      Fault f{0, 0, FaultKind::kOutage, 1 + below(s.nodes), 0, 0};
      when(f);
      f.seconds = uniform(25, 45);
      f.power = below(2);
      s.faults.push_back(f);
    }
  }
  s.engines.resize(s.nodes + 1);
  if (staged) {
    // Its own generator: the rest of the schedule is the seed's as without.
    std::mt19937_64 eng(seed * 0xD6E8FEB86659FD93ull + 3);
    auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(eng) < p; };
    auto pick = [&](double lo, double hi) {
      return std::uniform_real_distribution<double>(lo, hi)(eng);
    };
    // A third of the runs all on arrival, a third all staged, a third mixed.
    const int kind = static_cast<int>(eng() % 3);
    std::vector<int> hooked;
    for (int i = 1; i <= s.nodes; ++i) {
      NodeEngine& e = s.engines[i];
      e.staged = kind == 1 || (kind == 2 && chance(0.5));
      e.engine = e.staged || chance(0.5);
      e.small_memory = e.staged && chance(0.3);
      if (e.engine) hooked.push_back(i);
    }
    if (!hooked.empty() && intensity > 0 && chance(2.0 / 3)) {
      s.hook_fail = pick(0.02, 0.2);
      s.hook_hang = pick(0.01, 0.08);
    }
    const int crashes = hooked.empty() ? 0 : static_cast<int>(std::round(intensity * (eng() % 4)));
    for (int k = 0; k < crashes; ++k) {
      Fault f{0, 0, FaultKind::kCrashAt, hooked[eng() % hooked.size()], 0, 0};
      f.publish = static_cast<int>(eng() % s.publishes);
      f.at = pick(0, 0.3);
      f.point = static_cast<int>(eng() % kCrashPointCount);
      const std::string_view point = kCrashPoints[f.point];
      if (point.starts_with("agent.staged")) {  // only a staged node passes these
        std::vector<int> staged_nodes;
        for (int i : hooked) {
          if (s.engines[i].staged) staged_nodes.push_back(i);
        }
        if (!staged_nodes.empty()) f.a = staged_nodes[eng() % staged_nodes.size()];
      }
      // Back at once (the decision comes while it restarts) or after a while.
      f.seconds = chance(0.5) ? pick(0, 0.3) : pick(0.5, 6);
      f.power = disk && chance(0.5);
      s.faults.push_back(f);
    }
  }
  std::stable_sort(s.faults.begin(), s.faults.end(), [](const Fault& x, const Fault& y) {
    return x.publish != y.publish ? x.publish < y.publish : x.at < y.at;
  });
  if (producers) {
    std::mt19937_64 trainer(seed * 0xC2B2AE3D27D4EB4Full + 7);
    s.producers = 4;
    // The root holds no canonical bytes (docs/producers.md, "Limits"): a node that
    // missed versions catches up only by the kept chain, so the chain must reach back
    // over the whole run.
    s.keep_deltas = 64;
    // Network faults and late joiners only: a node killed or out of disk mid-refit
    // needs partitions from up the tree to recover, which only relays can serve (the
    // root has no bytes; docs/simulation.md, "Producers", lists what this found).
    std::erase_if(s.faults, [](const Fault& f) {
      return f.kind == FaultKind::kKillNode || f.kind == FaultKind::kKillSource ||
             f.kind == FaultKind::kOutage || f.kind == FaultKind::kFullDisk ||
             f.kind == FaultKind::kCrashAt;
    });
    // Nor an engine that refuses to pause: its node misses the version, which it
    // could catch up only from relays (the same gap).
    s.hook_fail = s.hook_hang = 0;
    for (int p = 0; p < s.publishes; ++p) {
      TrainerFault f;
      if (intensity > 0 && trainer() % 4 == 0) {
        f.kind = static_cast<TrainerFaultKind>(1 + trainer() % 3);
        f.rank = 1 + static_cast<int>(trainer() % 3);
      }
      s.trainer_faults.push_back(f);
    }
  }
  if (snapshots) DrawSnapshots(s, intensity, disk);
  return s;
}

const char* SourceLossStageName(SourceLossStage stage) {
  switch (stage) {
    case SourceLossStage::kEarly:
      return "early";
    case SourceLossStage::kMidway:
      return "midway";
    case SourceLossStage::kAllPrepared:
      return "after all PREPARED";
    case SourceLossStage::kRecordWritten:
      return "after the record was written";
  }
  return "?";
}

void DrawCoordination(Scenario& s) {
  std::mt19937_64 rng(s.seed * 0xC2B2AE3D27D4EB4Full + 32);
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  auto below = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  s.coordination.on = true;
  s.coordination.faults.clear();
  for (int p = 0; p < s.publishes; ++p) {
    if (below(2) == 0) {
      CoordFault f;
      f.publish = p;
      f.kind = CoordFaultKind::kLoseSource;
      f.stage = static_cast<SourceLossStage>(below(kSourceLossStages));
      f.at = f.stage == SourceLossStage::kEarly ? uniform(0, 0.02) : uniform(0.05, 0.4);
      // Back before the nodes read the record, or long after the coordinator decided.
      f.seconds = below(2) == 0 ? uniform(0.05, 1) : uniform(2, 8);
      s.coordination.faults.push_back(f);
    }
    if (below(5) == 0) {
      CoordFault f;
      f.publish = p;
      const int kind = below(6);
      f.kind = kind < 3   ? CoordFaultKind::kStoreDown
               : kind < 5 ? CoordFaultKind::kAnswersLost
                          : CoordFaultKind::kAnswerLostThenDown;
      f.at = uniform(0, 0.5);
      // Past the commit timeout (20 s), for the source's wait to end unknown.
      f.seconds = f.kind == CoordFaultKind::kAnswerLostThenDown ? uniform(21, 26) : uniform(0.1, 4);
      s.coordination.faults.push_back(f);
    }
  }
}

const char* StripeFaultName(StripeFaultKind kind) {
  switch (kind) {
    case StripeFaultKind::kCutLink:
      return "stripe-cut";
    case StripeFaultKind::kResetLink:
      return "stripe-reset";
    case StripeFaultKind::kStallLink:
      return "stripe-stall";
    case StripeFaultKind::kKillMixedNode:
      return "kill-mixed-node";
  }
  return "?";
}

void DrawStriping(Scenario& s, double intensity) {
  std::mt19937_64 rng(s.seed * 0x8EBC6AF09C88C6E3ull + 31);
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  auto below = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  // 2..4 stripes, never more than there are receivers (each stripe's tree wants a
  // node to be interior in it).
  s.striping.stripes = 2 + below(std::max(1, std::min(3, s.nodes - 1)));
  s.striping.faults.clear();
  const int links = static_cast<int>(std::round(intensity * (1 + below(4))));
  for (int k = 0; k < links; ++k) {
    StripeFault f;
    f.publish = below(s.publishes);
    f.at = uniform(0, 0.5);
    const int kind = below(3);
    f.kind = kind == 0   ? StripeFaultKind::kCutLink
             : kind == 1 ? StripeFaultKind::kResetLink
                         : StripeFaultKind::kStallLink;
    f.node = 1 + below(s.nodes);
    f.stripe = below(s.striping.stripes);
    f.seconds = f.kind == StripeFaultKind::kCutLink     ? uniform(0.3, 8)
                : f.kind == StripeFaultKind::kStallLink ? uniform(0.05, 8)
                                                        : 0;
    s.striping.faults.push_back(f);
  }
  const std::vector<int> mixed = MixedStripeNodes(s);
  const int kills = mixed.empty() ? 0 : static_cast<int>(std::round(intensity * below(3)));
  for (int k = 0; k < kills; ++k) {
    StripeFault f;
    f.publish = below(s.publishes);
    f.at = uniform(0, 0.4);  // mid-refit: a publish takes 0.1-0.5 s without faults
    f.kind = StripeFaultKind::kKillMixedNode;
    f.node = mixed[below(static_cast<int>(mixed.size()))];
    f.seconds = below(3) == 0 ? uniform(0, 0.2) : uniform(0.5, 6);
    f.power = below(2) == 1;
    s.striping.faults.push_back(f);
  }
  if (s.producers > 0) {
    // Drawn, then dropped (the rest of the draw stays as it is): --producers drops
    // every kill, as a node killed mid-refit recovers only from relays (the root holds
    // no canonical bytes; DrawScenario). Kept, these kills brought that known gap
    // back: a node stayed behind, paused, to the end (seeds 240, 346, 473).
    std::erase_if(s.striping.faults,
                  [](const StripeFault& f) { return f.kind == StripeFaultKind::kKillMixedNode; });
  }
  std::stable_sort(s.striping.faults.begin(), s.striping.faults.end(),
                   [](const StripeFault& x, const StripeFault& y) {
                     return x.publish != y.publish ? x.publish < y.publish : x.at < y.at;
                   });
}

std::string Scenario::Describe() const {
  std::string out = fmt::format(
      "seed {}: {} nodes, fanout {}, policy {}, keep_deltas {}, write-back {} ms, {} publishes, "
      "{} faults",
      seed, nodes, fanout, policy_available ? "available" : "all", keep_deltas, write_back_ms,
      publishes, faults.size());
  if (producers > 0) out += fmt::format(", {} producers", producers);
  if (restream) out += ", restream";
  if (striping.stripes > 0) {
    out += fmt::format(", {} stripes ({} stripe faults:", striping.stripes, striping.faults.size());
    for (const StripeFault& f : striping.faults) {
      out += fmt::format(" p{}@{:.3f}={} n{}", f.publish, f.at, StripeFaultName(f.kind), f.node);
      if (f.kind != StripeFaultKind::kKillMixedNode) out += fmt::format(" stripe {}", f.stripe);
      if (f.power) out += " power-loss";
      if (f.seconds > 0) out += fmt::format(" for {:.2f}s", f.seconds);
    }
    out += ")";
  }
  if (coordination.on) {
    out += fmt::format(", coord ({} faults:", coordination.faults.size());
    for (const CoordFault& f : coordination.faults) {
      out += fmt::format(" p{}@{:.3f}", f.publish, f.at);
      switch (f.kind) {
        case CoordFaultKind::kLoseSource:
          out +=
              fmt::format("=lose-source[{}] for {:.2f}s", SourceLossStageName(f.stage), f.seconds);
          break;
        case CoordFaultKind::kStoreDown:
          out += fmt::format("=store-down {:.2f}s", f.seconds);
          break;
        case CoordFaultKind::kAnswersLost:
          out += fmt::format("=answers-lost {:.2f}s", f.seconds);
          break;
        case CoordFaultKind::kAnswerLostThenDown:
          out += fmt::format("=answer-lost-then-down {:.2f}s", f.seconds);
          break;
      }
    }
    out += ")";
  }
  std::string modes;
  for (size_t i = 1; i < engines.size(); ++i) {
    const NodeEngine& e = engines[i];
    if (!e.staged && !e.engine) continue;
    modes += fmt::format(" n{}:{}{}{}", i, e.staged ? "staged" : "on-arrival",
                         e.engine ? "+engine" : "", e.small_memory ? "+small-memory" : "");
  }
  if (!modes.empty()) {
    out += fmt::format("\n  apply:{}; pause hooks fail {:.3f}, hang {:.3f}", modes, hook_fail,
                       hook_hang);
  }
  std::string stores;
  for (size_t i = 1; i < snapshots.size(); ++i) {
    const NodeSnapshots& n = snapshots[i];
    if (!n.on) continue;
    stores +=
        fmt::format(" n{}:every {}{}, {} KiB/s", i, n.every,
                    n.chain_percent ? fmt::format(" or {} %", n.chain_percent) : "", n.rate >> 10);
  }
  if (!stores.empty()) out += "\n  snapshot stores:" + stores;
  for (size_t p = 0; p < trainer_faults.size(); ++p) {
    if (trainer_faults[p].kind == TrainerFaultKind::kNone) continue;
    out += fmt::format("\n  trainer fault: publish {} {} rank {}", p,
                       TrainerFaultName(trainer_faults[p].kind), trainer_faults[p].rank);
  }
  for (size_t i = 0; i < faults.size(); ++i) {
    const Fault& f = faults[i];
    out += fmt::format("\n  fault {}: publish {} +{:.3f}s {}{} {}{}{}", i, f.publish, f.at,
                       f.power ? "power-loss " : "", FaultName(f.kind),
                       f.a == 0 ? std::string("src") : "n" + std::to_string(f.a),
                       (f.kind == FaultKind::kReset || f.kind == FaultKind::kStall ||
                        f.kind == FaultKind::kPartition)
                           ? (f.b == 0 ? std::string("-src") : "-n" + std::to_string(f.b))
                           : std::string(),
                       f.seconds > 0 ? fmt::format(" for {:.3f}s", f.seconds) : "");
    if (f.kind == FaultKind::kCrashAt) out += std::string(" at ") + kCrashPoints[f.point];
  }
  return out;
}

}  // namespace deltacast::sim
