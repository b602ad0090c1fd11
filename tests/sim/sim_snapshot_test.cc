// The simulator with snapshot stores (issue 33; relay/store/snapshot_store.h): nodes whose
// checkpoint is a snapshot plus the committed chain, snapshots built in steps on
// simulated time, crashes and power losses inside a build and at its switch, and the
// checkers that read a snapshot node's weights (in memory, and rebuilt from its disk).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <string_view>

#include "sim/run.h"
#include "sim/scenario.h"

namespace deltacast::sim {
namespace {

// As sim_test.cc: the runs' files go to /dev/shm when it is there.
const bool kShm = [] {
  if (::access("/dev/shm", W_OK) == 0) ::setenv("TMPDIR", "/dev/shm", /*overwrite=*/0);
  return true;
}();

// A seed's schedule as deltacast_sim draws it: staged nodes, engines, snapshot stores.
Scenario Drawn(uint64_t seed, double intensity = 1.0, bool staged = true) {
  return DrawScenario(seed, intensity, /*disk=*/true, /*outages=*/true, /*producers=*/false, staged,
                      /*snapshots=*/true);
}

int SnapshotNodes(const Scenario& s) {
  int n = 0;
  for (const NodeSnapshots& x : s.snapshots) n += x.on;
  return n;
}

std::string Failures(const RunResult& r) {
  std::string out;
  for (const auto& f : r.failures) out += f + "\n";
  return out;
}

int PointIndex(std::string_view name) {
  for (int k = 0; k < static_cast<int>(std::size(kCrashPoints)); ++k) {
    if (name == kCrashPoints[k]) return k;
  }
  return -1;
}

// Every fault, timing and engine a seed drew before snapshot stores is still its own:
// the snapshot draw only adds nodes' stores and its faults after the others.
TEST(SimSnapshotTest, TheSnapshotDrawLeavesEveryOtherDrawOfASeedAsItWas) {
  int with_snapshots = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    for (bool staged : {false, true}) {
      const Scenario before = DrawScenario(seed, 1.0, true, true, false, staged);
      const Scenario after = Drawn(seed, 1.0, staged);
      ASSERT_EQ(after.nodes, before.nodes);
      ASSERT_EQ(after.gaps, before.gaps);
      ASSERT_EQ(after.change_rates, before.change_rates);
      ASSERT_GE(after.faults.size(), before.faults.size());
      for (size_t k = 0; k < before.faults.size(); ++k) {
        const Fault& x = before.faults[k];
        const Fault& y = after.faults[k];
        ASSERT_TRUE(x.publish == y.publish && x.at == y.at && x.kind == y.kind && x.a == y.a &&
                    x.b == y.b && x.seconds == y.seconds && x.power == y.power &&
                    x.point == y.point)
            << "seed " << seed << " fault " << k;
      }
      for (int i = 1; i <= before.nodes; ++i) {
        ASSERT_EQ(after.engines[i].staged, before.engines[i].staged);
        ASSERT_EQ(after.engines[i].engine, before.engines[i].engine);
        // The engine model reads the store file, which a snapshot store never writes.
        ASSERT_FALSE(after.snapshots[i].on && after.engines[i].engine) << "seed " << seed;
      }
      with_snapshots += SnapshotNodes(after) > 0;
    }
  }
  EXPECT_GT(with_snapshots, 200);
}

// With no fault, snapshot nodes commit every version bit-exact (checked in memory
// and rebuilt from their disk at the end) and build and switch snapshots on the way.
TEST(SimSnapshotTest, AFaultFreeRunBuildsSnapshotsAndStaysBitExact) {
  int runs = 0;
  for (uint64_t seed = 1; runs < 3 && seed < 100; ++seed) {
    Scenario s = Drawn(seed, 0, /*staged=*/false);
    if (SnapshotNodes(s) == 0 || s.publishes < 6) continue;
    ++runs;
    const RunResult r = RunScenario(s);
    EXPECT_TRUE(r.ok()) << "seed " << seed << ":\n" << Failures(r);
    EXPECT_EQ(r.snapshots.nodes, SnapshotNodes(s));
    EXPECT_GT(r.snapshots.built, 0u) << "seed " << seed;
    EXPECT_EQ(r.committed, r.publishes) << "seed " << seed;
  }
  EXPECT_EQ(runs, 3);
}

TEST(SimSnapshotTest, ASeedWithSnapshotStoresReplaysExactly) {
  uint64_t seed = 1;
  while (SnapshotNodes(Drawn(seed)) == 0) ++seed;
  const RunResult a = RunScenario(Drawn(seed));
  const RunResult b = RunScenario(Drawn(seed));
  EXPECT_EQ(a.trace_hash, b.trace_hash);
  EXPECT_EQ(a.trace, b.trace);
  EXPECT_EQ(a.snapshots.built, b.snapshots.built);
}

// A fault-free schedule whose n1 keeps a snapshot store that builds every two refits,
// slowly (~1.5 s a build), with one crash of n1 at `point` armed from the first
// publish: it dies at the point's first pass, comes back, rebuilds its version from
// what its disk kept, and the run's checkers stay green.
RunResult CrashAt(const std::string& point, bool power, double back_after) {
  uint64_t seed = 1;
  while (Drawn(seed, 0, false).publishes < 7) ++seed;
  Scenario s = Drawn(seed, 0, /*staged=*/false);
  s.snapshots[1] = NodeSnapshots{true, 2, 0, 128 << 10};
  Fault f{0, 0.01, FaultKind::kCrashAt, 1, 0, back_after};
  f.power = power;
  f.point = PointIndex(point);
  EXPECT_GE(f.point, 0) << point;
  s.faults.push_back(f);
  return RunScenario(s);
}

class SimSnapshotCrashTest : public ::testing::TestWithParam<std::tuple<const char*, bool>> {};

TEST_P(SimSnapshotCrashTest, ACrashThereLeavesTheNodeItsCommittedVersion) {
  const auto [point, power] = GetParam();
  for (double back_after : {0.05, 2.0}) {
    const RunResult r = CrashAt(point, power, back_after);
    EXPECT_TRUE(r.ok()) << point << (power ? " (power loss)" : "") << ":\n" << Failures(r);
    EXPECT_EQ(r.crashes, 1u) << point << ": the crash point was never reached";
    EXPECT_GT(r.snapshots.built, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(
    EveryPoint, SimSnapshotCrashTest,
    ::testing::Combine(::testing::Values("snapshot.kept", "snapshot.applied", "snapshot.copy_block",
                                         "snapshot.flushed", "snapshot.renamed",
                                         "snapshot.switched", "snapshot.dropped", "agent.commit",
                                         "agent.committed"),
                       ::testing::Bool()),
    [](const auto& info) {
      std::string name = std::get<0>(info.param);
      for (char& c : name) c = c == '.' ? '_' : c;
      return name + (std::get<1>(info.param) ? "_power_loss" : "_kill");
    });

// Seeds that found bugs (docs/simulation.md, "What it found", 37 and 38), kept:
// 95, 144 and 197 reopened a snapshot node that had never committed at version 0
// over its catch-up's bytes (a power loss between a catch-up's snapshot switch and
// its `active`; relay/store/snapshot_store.cc); 1430 and 1640 start a snapshot node for
// the first time on a full disk (the simulator then failed the run; a supervisor
// starts it again).
TEST(SimSnapshotTest, SeedsOfTheSnapshotStoreBugsPass) {
  for (uint64_t seed : {95, 144, 197, 1430, 1640}) {
    const RunResult r = RunScenario(Drawn(seed));
    EXPECT_TRUE(r.ok()) << "seed " << seed << ":\n" << Failures(r);
  }
}

// The disk check fails where a snapshot node's disk does not rebuild its version:
// a byte of its current snapshot changed behind the engine's back once the workload
// is done (the live weights, copied at open, do not see it; its restart does).
TEST(SimSnapshotTest, ASnapshotChangedBehindTheStoreFailsTheDiskCheck) {
  RunOptions sabotage;
  sabotage.sabotage_snapshot = true;
  uint64_t seed = 1;
  while (Drawn(seed, 0, false).publishes < 7) ++seed;
  Scenario s = Drawn(seed, 0, /*staged=*/false);
  s.snapshots[1] = NodeSnapshots{true, 2, 0, 0};
  const RunResult r = RunScenario(s, sabotage);
  ASSERT_FALSE(r.ok());
  bool named = false;
  for (const auto& f : r.failures) named |= f.find("n1") != std::string::npos;
  EXPECT_TRUE(named) << Failures(r);
}

}  // namespace
}  // namespace deltacast::sim
