// deltacast_sim: runs simulated schedules of the relay tree (docs/simulation.md).
//
//   deltacast_sim --seed S [--drop 1,4] [--trace] [--log]   one seed; replays exactly
//   deltacast_sim --seeds A-B [--json FILE] [--shrink]       a range of seeds
//                 [--known S,T]   seeds of known, unfixed bugs: they must fail
//                 [--no-disk]     no power losses, no full disks, no outages: the
//                                 schedules drawn before the disk was simulated
//                 [--no-outages]  no outages: the schedules drawn before them
//                 [--restream]    each publish's source killed before END, the same
//                                 delta streamed again renumbered (docs/simulation.md)
//                 [--producers]   the delta from four producers through the root's
//                                 checks and merge, with trainer faults
//                 [--no-staged]   every node applies on arrival with no engine, no
//                                 crash-point faults: the schedules drawn before them
//                 [--no-snapshots]  no snapshot stores and none of their faults
//                 [--coord]       the commit record store and a standby coordinator,
//                                 with sources lost at every stage of a refit and the
//                                 store down or losing answers (docs/simulation.md)
//                 [--stripes]     striped trees (2-4 stripes), with one stripe's link
//                                 cut, reset or stalled and nodes interior in one stripe
//                                 and a leaf in another killed mid-refit
//
// Exit status 0 when every run passed every checker, 1 otherwise, 2 on bad usage.
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "sim/run.h"
#include "sim/scenario.h"
#include "sim/shrink.h"

namespace {

using namespace deltacast::sim;

int Usage(const std::string& why) {
  std::fprintf(
      stderr,
      "deltacast_sim: %s\nusage: deltacast_sim --seed S [--drop I,J] [--trace] [--log] [--debug]\n"
      "       deltacast_sim --seeds A-B [--known S,T] [--intensity X] [--no-disk] [--no-outages] "
      "[--producers] [--restream] [--coord] [--stripes] [--no-staged] [--no-snapshots] "
      "[--shrink] "
      "[--json FILE]\n",
      why.c_str());
  return 2;
}

bool ParseU64(const std::string& s, uint64_t& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  out = std::strtoull(s.c_str(), &end, 10);
  return end && *end == '\0';
}

void PrintTrace(const Scenario& s, const RunResult& r) {
  std::printf("%s\n", s.Describe().c_str());
  for (const auto& line : r.trace) std::printf("  %s\n", line.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t first = 1, last = 1;
  bool one = false, trace = false, shrink = false;
  double intensity = 1.0;
  bool disk = true;
  bool producers = false;
  bool restream = false;
  bool coord = false;
  bool stripes = false;
  bool outages = true;
  bool staged = true;
  bool snapshots = true;
  RunOptions options;
  std::string json;
  std::set<uint64_t> known;  // seeds of known, unfixed bugs: expected to fail
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : std::string(); };
    if (a == "--seed") {
      if (!ParseU64(value(), first)) return Usage("--seed needs a number");
      last = first;
      one = true;
    } else if (a == "--seeds") {
      const std::string v = value();
      const auto dash = v.find('-');
      if (dash == std::string::npos || !ParseU64(v.substr(0, dash), first) ||
          !ParseU64(v.substr(dash + 1), last) || last < first) {
        return Usage("--seeds needs A-B with A <= B");
      }
    } else if (a == "--drop") {
      std::string v = value();
      size_t pos = 0;
      while (pos < v.size()) {
        const size_t comma = std::min(v.find(',', pos), v.size());
        uint64_t k = 0;
        if (!ParseU64(v.substr(pos, comma - pos), k)) return Usage("--drop needs I,J,...");
        options.drop_faults.insert(k);
        pos = comma + 1;
      }
    } else if (a == "--known") {
      std::string v = value();
      size_t pos = 0;
      while (pos < v.size()) {
        const size_t comma = std::min(v.find(',', pos), v.size());
        uint64_t k = 0;
        if (!ParseU64(v.substr(pos, comma - pos), k)) return Usage("--known needs S,T,...");
        known.insert(k);
        pos = comma + 1;
      }
    } else if (a == "--intensity") {
      intensity = std::atof(value().c_str());
    } else if (a == "--producers") {
      producers = true;
    } else if (a == "--restream") {
      restream = true;
    } else if (a == "--coord") {
      coord = true;
    } else if (a == "--stripes") {
      stripes = true;
    } else if (a == "--no-disk") {
      disk = false;
    } else if (a == "--no-staged") {
      staged = false;
    } else if (a == "--no-snapshots") {
      snapshots = false;
    } else if (a == "--no-outages") {
      outages = false;
    } else if (a == "--trace") {
      trace = true;
    } else if (a == "--log") {
      options.engine_log = true;
    } else if (a == "--debug") {
      options.engine_debug = true;
    } else if (a == "--shrink") {
      shrink = true;
    } else if (a == "--json") {
      json = value();
    } else {
      return Usage("unknown argument '" + a + "'");
    }
  }

  int failed = 0, known_failed = 0;
  uint64_t runs = 0, publishes = 0, committed = 0, node_refits = 0, tasks = 0;
  uint64_t chunk_bytes = 0, resent = 0, power_losses = 0, enospc = 0;
  uint64_t trainer_faults = 0, trainer_refused = 0;
  uint64_t restreams = 0, stream_rollbacks = 0;
  RunResult::CoordCounts coord_counts;
  // --stripes: runs per S, stripe faults per kind, what the checkers looked at, and
  // each receiver's upload in copies of the delta (its CHUNK bytes / one copy).
  std::array<uint64_t, 5> runs_by_stripes{};
  std::array<uint64_t, kStripeFaultKinds> stripe_faults{};
  uint64_t chunks_checked = 0, prepared_checked = 0;
  uint64_t upload_nodes = 0, upload_idle = 0;
  double upload_sum = 0, upload_max = 0, source_sum = 0;
  double sim_seconds = 0;
  uint64_t staged_nodes = 0, engine_nodes = 0, crashes = 0;
  uint64_t snapshot_nodes = 0, snapshots_built = 0, snapshot_bytes = 0, snapshot_repaired = 0;
  uint64_t killed_building = 0;
  EngineCounts engine;
  double pause_reported = 0;
  std::array<uint64_t, kFaultKinds> faults{};
  NetworkCounts net;
  std::vector<uint64_t> failing;
  for (uint64_t seed = first; seed <= last; ++seed) {
    Scenario s = DrawScenario(seed, intensity, disk, outages, producers, staged, snapshots);
    s.restream = restream;
    if (coord) DrawCoordination(s);
    if (stripes) DrawStriping(s, intensity);
    RunResult r = RunScenario(s, options);
    if (stripes) {
      const auto& st = r.stripes;
      ++runs_by_stripes[std::min<size_t>(st.stripes, 4)];
      for (int k = 0; k < kStripeFaultKinds; ++k) stripe_faults[k] += st.faults[k];
      chunks_checked += st.chunks_checked;
      prepared_checked += st.prepared_checked;
      if (st.delta_bytes > 0 && !st.upload_bytes.empty()) {
        const double copy = static_cast<double>(st.delta_bytes);
        source_sum += st.upload_bytes[0] / copy;
        for (size_t i = 1; i < st.upload_bytes.size(); ++i) {
          const double share = st.upload_bytes[i] / copy;
          ++upload_nodes;
          upload_sum += share;
          upload_max = std::max(upload_max, share);
          upload_idle += st.upload_bytes[i] == 0;
        }
        if (one) {
          std::printf("upload in copies of the delta (%.0f bytes a copy): src %.2f", copy,
                      st.upload_bytes[0] / copy);
          for (size_t i = 1; i < st.upload_bytes.size(); ++i)
            std::printf(", n%zu %.2f", i, st.upload_bytes[i] / copy);
          std::printf("\n");
        }
      }
    }
    ++runs;
    publishes += r.publishes;
    committed += r.committed;
    node_refits += r.node_refits;
    tasks += r.tasks;
    sim_seconds += r.sim_seconds;
    chunk_bytes += r.chunk_bytes;
    resent += r.resent_bytes;
    power_losses += r.power_losses;
    enospc += r.enospc_writes;
    trainer_faults += r.trainer_faults;
    trainer_refused += r.trainer_refused;
    staged_nodes += r.staged_nodes;
    engine_nodes += r.engine_nodes;
    crashes += r.crashes;
    restreams += r.restreams;
    stream_rollbacks += r.stream_rollbacks;
    for (int k = 0; k < kSourceLossStages; ++k)
      coord_counts.sources_lost[k] += r.coord.sources_lost[k];
    coord_counts.store_down += r.coord.store_down;
    coord_counts.answers_lost += r.coord.answers_lost;
    coord_counts.answer_lost_then_down += r.coord.answer_lost_then_down;
    coord_counts.commit_records += r.coord.commit_records;
    coord_counts.abort_records += r.coord.abort_records;
    coord_counts.coordinator_aborts += r.coord.coordinator_aborts;
    coord_counts.unknown_outcomes += r.coord.unknown_outcomes;
    coord_counts.held_settled_from_record += r.coord.held_settled_from_record;
    snapshot_nodes += r.snapshots.nodes;
    snapshots_built += r.snapshots.built;
    snapshot_bytes += r.snapshots.bytes_written;
    snapshot_repaired += r.snapshots.repaired;
    killed_building += r.snapshots.killed_building;
    engine.pauses += r.engine.pauses;
    engine.failed += r.engine.failed;
    engine.hung += r.engine.hung;
    engine.resumes += r.engine.resumes;
    engine.checked += r.engine.checked;
    engine.refits += r.engine.refits;
    engine.paused_seconds += r.engine.paused_seconds;
    pause_reported += r.pause_seconds;
    for (int k = 0; k < kFaultKinds; ++k) faults[k] += r.faults[k];
    net.resets += r.net.resets;
    net.losses += r.net.losses;
    net.messages += r.net.messages;
    if (one || (!r.ok() && !known.count(seed))) {
      std::printf("seed %llu: %s (trace %016llx, %llu tasks, %.1f s simulated, %d/%d committed)\n",
                  static_cast<unsigned long long>(seed), r.ok() ? "ok" : "FAILED",
                  static_cast<unsigned long long>(r.trace_hash),
                  static_cast<unsigned long long>(r.tasks), r.sim_seconds, r.committed,
                  r.publishes);
    }
    if (known.count(seed)) {
      // A known bug's seed: it must still fail, or the list is stale.
      if (r.ok()) {
        std::printf("seed %llu: listed as a known bug but passes now: take it off --known\n",
                    static_cast<unsigned long long>(seed));
        ++failed;
      } else {
        std::printf("seed %llu: fails as known (%s)\n", static_cast<unsigned long long>(seed),
                    r.failures.front().c_str());
        ++known_failed;
      }
      continue;
    }
    if (!r.ok()) {
      ++failed;
      failing.push_back(seed);
      for (const auto& f : r.failures) std::printf("  failure: %s\n", f.c_str());
      if (shrink) {
        Shrunk sh = ShrinkFaults(s, r);
        std::string dropped;
        for (size_t k : sh.dropped) dropped += (dropped.empty() ? "" : ",") + std::to_string(k);
        std::printf("  shrunk in %d runs: still fails with --drop %s (%zu of %zu faults left)\n",
                    sh.runs, dropped.empty() ? "(none)" : dropped.c_str(),
                    s.faults.size() - sh.dropped.size(), s.faults.size());
        r = sh.result;
        for (const auto& f : r.failures) std::printf("  failure: %s\n", f.c_str());
      }
      PrintTrace(s, r);
    } else if (trace) {
      PrintTrace(s, r);
    }
    std::fflush(stdout);
  }
  std::printf(
      "%llu runs, %d failed (%d more as known); %llu publishes, %llu committed, %llu node refits; "
      "%.0f s simulated, "
      "%llu tasks\nfaults:",
      static_cast<unsigned long long>(runs), failed, known_failed,
      static_cast<unsigned long long>(publishes), static_cast<unsigned long long>(committed),
      static_cast<unsigned long long>(node_refits), sim_seconds,
      static_cast<unsigned long long>(tasks));
  for (int k = 0; k < kFaultKinds; ++k) {
    std::printf(" %s %llu", FaultName(static_cast<FaultKind>(k)),
                static_cast<unsigned long long>(faults[k]));
  }
  std::printf(
      "; segment losses %llu; re-sent %llu of %llu chunk bytes; power losses %llu; writes "
      "refused by a full disk %llu\n",
      static_cast<unsigned long long>(net.losses), static_cast<unsigned long long>(resent),
      static_cast<unsigned long long>(chunk_bytes), static_cast<unsigned long long>(power_losses),
      static_cast<unsigned long long>(enospc));
  std::printf(
      "staged nodes %llu, nodes with an engine %llu; crash points reached %llu; engine pauses "
      "%llu (%llu refused, %llu past the timeout), resumes %llu, store checked unchanged while "
      "serving %llu times, refits committed under a pause %llu, paused %.1f s, refit pauses "
      "reported %.1f s\n",
      static_cast<unsigned long long>(staged_nodes), static_cast<unsigned long long>(engine_nodes),
      static_cast<unsigned long long>(crashes), static_cast<unsigned long long>(engine.pauses),
      static_cast<unsigned long long>(engine.failed), static_cast<unsigned long long>(engine.hung),
      static_cast<unsigned long long>(engine.resumes),
      static_cast<unsigned long long>(engine.checked),
      static_cast<unsigned long long>(engine.refits), engine.paused_seconds, pause_reported);
  std::printf(
      "snapshot stores %llu: snapshots built %llu (%llu bytes written), kills during a build "
      "%llu, partitions repaired from the tree %llu\n",
      static_cast<unsigned long long>(snapshot_nodes),
      static_cast<unsigned long long>(snapshots_built),
      static_cast<unsigned long long>(snapshot_bytes),
      static_cast<unsigned long long>(killed_building),
      static_cast<unsigned long long>(snapshot_repaired));
  if (restream) {
    std::printf(
        "restreamed after a kill mid-stream %llu, nodes that rolled back a lost stream %llu\n",
        static_cast<unsigned long long>(restreams),
        static_cast<unsigned long long>(stream_rollbacks));
  }
  if (coord) {
    std::printf(
        "sources lost: early %llu, midway %llu, after all PREPARED %llu, after the record %llu; "
        "store down %llu, answers lost %llu, an answer lost then down %llu; records COMMIT "
        "%llu, ABORT %llu (by the "
        "coordinator %llu); publishes ended with the outcome unknown %llu; held deltas "
        "settled from the record %llu\n",
        static_cast<unsigned long long>(coord_counts.sources_lost[0]),
        static_cast<unsigned long long>(coord_counts.sources_lost[1]),
        static_cast<unsigned long long>(coord_counts.sources_lost[2]),
        static_cast<unsigned long long>(coord_counts.sources_lost[3]),
        static_cast<unsigned long long>(coord_counts.store_down),
        static_cast<unsigned long long>(coord_counts.answers_lost),
        static_cast<unsigned long long>(coord_counts.answer_lost_then_down),
        static_cast<unsigned long long>(coord_counts.commit_records),
        static_cast<unsigned long long>(coord_counts.abort_records),
        static_cast<unsigned long long>(coord_counts.coordinator_aborts),
        static_cast<unsigned long long>(coord_counts.unknown_outcomes),
        static_cast<unsigned long long>(coord_counts.held_settled_from_record));
  }
  if (stripes) {
    const double runs_with_upload = static_cast<double>(std::max<uint64_t>(1, runs));
    std::printf(
        "stripes: runs with 2/3/4 stripes %llu/%llu/%llu; stripe faults: cut %llu, reset %llu, "
        "stall %llu, kill of a node interior in one stripe and a leaf in another %llu; chunk "
        "sends checked %llu, PREPAREDs checked %llu; upload per receiver in copies of the "
        "delta: mean %.2f, max %.2f, none %llu of %llu; the source %.2f a run\n",
        static_cast<unsigned long long>(runs_by_stripes[2]),
        static_cast<unsigned long long>(runs_by_stripes[3]),
        static_cast<unsigned long long>(runs_by_stripes[4]),
        static_cast<unsigned long long>(stripe_faults[0]),
        static_cast<unsigned long long>(stripe_faults[1]),
        static_cast<unsigned long long>(stripe_faults[2]),
        static_cast<unsigned long long>(stripe_faults[3]),
        static_cast<unsigned long long>(chunks_checked),
        static_cast<unsigned long long>(prepared_checked),
        upload_nodes ? upload_sum / upload_nodes : 0.0, upload_max,
        static_cast<unsigned long long>(upload_idle), static_cast<unsigned long long>(upload_nodes),
        source_sum / runs_with_upload);
  }
  if (producers) {
    std::printf("trainer faults %llu, refused at the root %llu\n",
                static_cast<unsigned long long>(trainer_faults),
                static_cast<unsigned long long>(trainer_refused));
  }
  if (!json.empty()) {
    std::ofstream out(json);
    out << fmt::format(
        "{{\n  \"seeds\": [{}, {}],\n  \"runs\": {},\n  \"failed\": {},\n  \"publishes\": {},\n"
        "  \"committed\": {},\n  \"node_refits\": {},\n  \"simulated_seconds\": {:.0f},\n"
        "  \"tasks\": {},\n  \"chunk_bytes\": {},\n  \"resent_bytes\": {},\n"
        "  \"segment_losses\": {},\n  \"power_losses\": {},\n  \"enospc_writes\": {},\n"
        "  \"faults\": {{",
        first, last, runs, failed, publishes, committed, node_refits, sim_seconds, tasks,
        chunk_bytes, resent, net.losses, power_losses, enospc);
    for (int k = 0; k < kFaultKinds; ++k) {
      out << fmt::format("{}\"{}\": {}", k ? ", " : "", FaultName(static_cast<FaultKind>(k)),
                         faults[k]);
    }
    out << "},\n";
    out << fmt::format(
        "  \"staged_nodes\": {},\n  \"engine_nodes\": {},\n  \"crash_points_reached\": {},\n"
        "  \"engine\": {{\"pauses\": {}, \"refused\": {}, \"past_timeout\": {}, \"resumes\": {}, "
        "\"checked_unchanged\": {}, \"refits_under_pause\": {}, \"paused_seconds\": {:.1f}}},\n"
        "  \"refit_pause_reported_seconds\": {:.1f},\n",
        staged_nodes, engine_nodes, crashes, engine.pauses, engine.failed, engine.hung,
        engine.resumes, engine.checked, engine.refits, engine.paused_seconds, pause_reported);
    out << fmt::format(
        "  \"snapshot_nodes\": {},\n  \"snapshots_built\": {},\n  \"snapshot_bytes_written\": "
        "{},\n  \"kills_during_a_snapshot_build\": {},\n  \"snapshot_partitions_repaired\": "
        "{},\n",
        snapshot_nodes, snapshots_built, snapshot_bytes, killed_building, snapshot_repaired);
    if (producers) {
      out << fmt::format(
          "  \"producers\": 4,\n  \"trainer_faults\": {},\n"
          "  \"trainer_refused_at_root\": {},\n",
          trainer_faults, trainer_refused);
    }
    if (coord) {
      const auto& c = coord_counts;
      out << fmt::format(
          "  \"coord\": {{\"sources_lost\": {{\"early\": {}, \"midway\": {}, "
          "\"after_all_prepared\": {}, \"after_the_record\": {}}}, \"store_down\": {}, "
          "\"answers_lost\": {}, \"answer_lost_then_down\": {}, \"commit_records\": {}, "
          "\"abort_records\": {}, \"coordinator_aborts\": {}, \"unknown_outcomes\": {}, "
          "\"held_settled_from_record\": {}}},\n",
          c.sources_lost[0], c.sources_lost[1], c.sources_lost[2], c.sources_lost[3], c.store_down,
          c.answers_lost, c.answer_lost_then_down, c.commit_records, c.abort_records,
          c.coordinator_aborts, c.unknown_outcomes, c.held_settled_from_record);
    }
    if (stripes) {
      out << fmt::format(
          "  \"stripes\": {{\"runs_by_stripes\": {{\"2\": {}, \"3\": {}, \"4\": {}}}, "
          "\"faults\": {{\"cut\": {}, \"reset\": {}, \"stall\": {}, \"kill_mixed_node\": {}}}, "
          "\"chunk_sends_checked\": {}, \"prepared_checked\": {}, "
          "\"upload_copies_per_receiver\": {{\"mean\": {:.3f}, \"max\": {:.3f}, \"none\": {}, "
          "\"receivers\": {}}}, \"source_upload_copies_per_run\": {:.3f}}},\n",
          runs_by_stripes[2], runs_by_stripes[3], runs_by_stripes[4], stripe_faults[0],
          stripe_faults[1], stripe_faults[2], stripe_faults[3], chunks_checked, prepared_checked,
          upload_nodes ? upload_sum / upload_nodes : 0.0, upload_max, upload_idle, upload_nodes,
          source_sum / std::max<uint64_t>(1, runs));
    }
    out << "  \"failing_seeds\": [";
    for (size_t i = 0; i < failing.size(); ++i) out << (i ? ", " : "") << failing[i];
    out << "]\n}\n";
  }
  return failed ? 1 : 0;
}
