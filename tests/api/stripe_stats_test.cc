// Node::stats() on a striped tree, through libdeltacast.so alone: one entry per
// stripe, adding up to the totals, and a node that loses its parent in one stripe
// shows it in that stripe alone (docs/protocol.md, "Stripes").
#include <deltacast/deltacast.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "api_fixture.h"

namespace {

using deltacast::NodeStats;
using deltacast::StripeStats;
using deltacast::apitest::Model;

constexpr int kReceivers = 4;

int BasePort() { return 23100 + static_cast<int>(::getpid() % 300) * 10; }

// The source and w1..w4 on loopback, two stripes both rooted at the source, fanout 2.
// With equal uplinks the planner splits the receivers into groups {w1, w3} and
// {w2, w4}, and each group relays its own stripe alone (topology/stripe_plan.h):
//   stripe 0: trainer -> w1; w1 -> w3, w2; w3 -> w4
//   stripe 1: trainer -> w2; w2 -> w4, w1; w4 -> w3
// so w2 is interior in stripe 1 and a leaf in stripe 0.
std::string StripedToml(int base_port) {
  std::string toml =
      "[cluster]\nname = \"stripe-stats\"\n[tree]\nstripes = 2\nfanout = 2\n"
      "chunk_size = \"4KiB\"\nconnect_timeout = \"2s\"\ncommit_policy = \"available\"\n"
      "[[node]]\nid = \"trainer\"\nhost = \"127.0.0.1\"\nport = " +
      std::to_string(base_port) + "\nrole = \"source\"\n";
  for (int i = 1; i <= kReceivers; ++i) {
    toml += "[[node]]\nid = \"w" + std::to_string(i) +
            "\"\nhost = \"127.0.0.1\"\nport = " + std::to_string(base_port + i) + "\n";
  }
  return toml;
}

uint64_t Sum(const std::vector<StripeStats>& stripes, uint64_t StripeStats::*field) {
  return std::accumulate(stripes.begin(), stripes.end(), uint64_t{0},
                         [field](uint64_t sum, const StripeStats& s) { return sum + s.*field; });
}

// The per-stripe counters add up to the node's totals.
void ExpectSumsToTotals(const NodeStats& s, const std::string& who) {
  ASSERT_EQ(s.stripes.size(), 2u) << who;
  EXPECT_EQ(Sum(s.stripes, &StripeStats::parent_joins), s.parent_joins) << who;
  EXPECT_EQ(Sum(s.stripes, &StripeStats::chunk_bytes_resent), s.chunk_bytes_resent) << who;
}

// Sixteen 16 KiB tensors: each a partition of its own, so a delta that moves them
// all takes a chunk or more each.
Model Layers(uint32_t seed) {
  Model m(seed);
  m.specs.clear();
  for (int i = 0; i < 16; ++i) {
    m.specs.push_back(
        {"layers." + std::to_string(i) + ".weight", deltacast::DType::kBF16, {64, 128}});
  }
  std::mt19937 rng(seed);
  m.bytes.clear();
  for (const auto& spec : m.specs) {
    m.bytes.emplace_back(spec.ByteSize());
    for (auto& b : m.bytes.back()) b = std::byte(rng());
  }
  return m;
}

// A training step that moves every tensor: a delta of many chunks.
void Change(Model& m, uint32_t seed) {
  std::mt19937 rng(seed);
  for (auto& tensor : m.bytes) {
    for (size_t i = 0; i < tensor.size(); i += 2) tensor[i] ^= std::byte(rng() | 1);
  }
}

TEST(ApiStripes, PerStripeCountersAddUpAndALostParentShowsInItsStripeAlone) {
  deltacast::SetLogLevel(deltacast::LogLevel::kWarn);
  auto config = deltacast::Config::Parse(StripedToml(BasePort()), "stripes.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  Model trainer = Layers(11);
  std::vector<Model> weights(kReceivers, trainer);
  std::vector<std::unique_ptr<deltacast::Node>> nodes;
  for (int i = 0; i < kReceivers; ++i) {
    deltacast::NodeOptions options;
    options.node_id = "w" + std::to_string(i + 1);
    options.token = "stripes-token";
    options.apply_threads = 1;
    auto node = deltacast::Node::Start(*config, options, weights[i].Views());
    ASSERT_TRUE(node.ok()) << node.status().ToString();
    nodes.push_back(std::move(*node));
  }
  deltacast::SourceOptions options;
  options.token = "stripes-token";
  auto source = deltacast::Source::Start(*config, options);
  ASSERT_TRUE(source.ok()) << source.status().ToString();

  // Refit 1, nothing goes wrong: each stripe's link joined once, carried its data
  // chunks (chunk k on stripe k mod 2) and its own END, nothing twice.
  Model previous = trainer;
  Change(trainer, 0);
  auto report = (*source)->Publish(previous.Views(), trainer.Views());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  const uint64_t data = report->chunks - 1;  // not the END
  ASSERT_GT(data, 8u);
  std::vector<NodeStats> first;
  for (int i = 0; i < kReceivers; ++i) {
    const std::string who = "w" + std::to_string(i + 1);
    EXPECT_EQ(weights[i].bytes, trainer.bytes) << who;
    first.push_back(nodes[i]->stats());
    const NodeStats& s = first.back();
    ASSERT_NO_FATAL_FAILURE(ExpectSumsToTotals(s, who));
    EXPECT_EQ(s.stripes[0].parent_joins, 1u) << who;
    EXPECT_EQ(s.stripes[1].parent_joins, 1u) << who;
    EXPECT_EQ(s.chunk_bytes_resent, 0u) << who;
    EXPECT_EQ(s.stripes[0].chunks, (data + 1) / 2 + 1) << who;
    EXPECT_EQ(s.stripes[1].chunks, data / 2 + 1) << who;
  }

  // w2 stops: its children in the one stripe where it relays lose their parent
  // there and join their failover parent; no node loses a parent in the other.
  constexpr int kStopped = 1;
  nodes[kStopped]->Stop();
  std::vector<int> alive;
  for (int i = 0; i < kReceivers; ++i) {
    if (i != kStopped) alive.push_back(i);
  }
  auto joins = [&] {
    uint64_t n = 0;
    for (int i : alive) n += nodes[i]->stats().parent_joins;
    return n;
  };
  // Until one has rejoined and nothing has changed for a second (its siblings fail
  // over at the same time: ParentLink::kFailoverAfter after the loss).
  const uint64_t before = joins();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  uint64_t last = before;
  auto since = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const uint64_t now = joins();
    if (now != last) {
      last = now;
      since = std::chrono::steady_clock::now();
    } else if (now > before && std::chrono::steady_clock::now() - since > std::chrono::seconds(1)) {
      break;
    }
  }
  ASSERT_GT(last, before) << "no child of w2 joined another parent";

  previous = trainer;
  Change(trainer, 1);
  report = (*source)->Publish(previous.Views(), trainer.Views());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  std::set<size_t> rejoined_stripes;
  int rejoined_nodes = 0;
  for (int i : alive) {
    const std::string who = "w" + std::to_string(i + 1);
    EXPECT_EQ(weights[i].bytes, trainer.bytes) << who;
    const NodeStats s = nodes[i]->stats();
    ASSERT_NO_FATAL_FAILURE(ExpectSumsToTotals(s, who));
    EXPECT_EQ(s.refits_committed, 2u) << who;
    bool rejoined = false;
    for (size_t k = 0; k < s.stripes.size(); ++k) {
      if (s.stripes[k].parent_joins == first[i].stripes[k].parent_joins) continue;
      rejoined_stripes.insert(k);
      rejoined = true;
    }
    rejoined_nodes += rejoined;
    // A stripe whose link never dropped was sent nothing this node had.
    for (size_t k = 0; k < s.stripes.size(); ++k) {
      if (s.stripes[k].parent_joins != first[i].stripes[k].parent_joins) continue;
      EXPECT_EQ(s.stripes[k].chunk_bytes_resent, first[i].stripes[k].chunk_bytes_resent)
          << who << " stripe " << k;
    }
  }
  // The lost links were all of one stripe (w2's as a relay): only its joins rose.
  EXPECT_EQ(rejoined_stripes, std::set<size_t>{1});
  EXPECT_EQ(rejoined_nodes, 2) << "w2 relays stripe 1 to two children";
  for (int i : alive) nodes[i]->Stop();
}

}  // namespace
