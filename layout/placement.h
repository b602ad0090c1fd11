// Placement maps: for one rank, where each element of each local (shard) tensor
// sits in canonical coordinates, as strided runs (runs.h), and back.
//
// - Shard -> canonical (producers): ToCanonical maps one changed local element;
//   a producer walks a tensor's runs directly.
// - Canonical -> shard (receiver-side load plans): ShardPieces lists which local
//   elements hold a canonical range.
//
// ExpandPlacement checks what one rank can check: every local tensor matches a rule
// or is reported unmatched (residual: never a guessed map), names resolve in the
// canonical table, shapes and dtypes agree with what the rule implies, and no
// canonical element is mapped twice by this rank. CheckCoverage checks a whole
// mesh: every canonical element covered exactly once.
//
// Thread safety: a PlacementMap is immutable once built; const use from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "deltacast/tensor.h"
#include "layout/description.h"
#include "layout/runs.h"

namespace deltacast::layout {

// What happens to a local tensor.
enum class Role : uint8_t {
  kProjected,  // its runs carry bits to canonical coordinates
  kResidual,   // its runs carry values through a transform (value != bits)
  kGathered,   // a whole canonical tensor gathered for this rank: residual
  kReplica,    // another replica scans it
  kTied,       // a copy of a tensor another rule owns
  kFlat,       // a flat-buffer slice: runs per parameter it owns a part of
  kUnmatched,  // no rule covers it: not projected (fails closed)
};
std::string_view RoleName(Role role);

struct LocalTensor {
  TensorSpec spec;
  Role role = Role::kUnmatched;
  int line = 0;  // the rule (or [[flat]]) that matched; 0 if none
};

struct CanonicalPosition {
  uint32_t canonical = 0;
  uint64_t element = 0;
};

// What a map is for. A producer scans each replicated element once (one replica
// is picked; the others map nothing). A receiver's load plan must write every
// copy: replicas keep their runs (their role stays kReplica).
enum class PlacementUse : uint8_t { kScan, kLoad };

// A flat range of one canonical tensor's elements, [begin, end).
struct ElementRange {
  std::string tensor;
  uint64_t begin = 0;
  uint64_t end = 0;
};

class PlacementMap {
 public:
  PlacementMap() = default;

  const std::vector<TensorSpec>& canonical() const { return canonical_; }
  const std::vector<LocalTensor>& locals() const { return locals_; }
  // Sorted by (local, src).
  const std::vector<Run>& runs() const { return runs_; }
  // Runs of one local tensor.
  std::span<const Run> RunsOf(uint32_t local) const;
  // "FILE (tp=0 pp=1 dp=0 ep=0)", for messages.
  const std::string& name() const { return name_; }

  std::optional<CanonicalPosition> ToCanonical(uint32_t local, uint64_t index) const;
  // The runs that put bytes in canonical tensor `canonical`'s elements [begin, end),
  // clipped to that range, in destination order.
  std::vector<Run> ShardPieces(uint32_t canonical, uint64_t begin, uint64_t end) const;
  // Canonical tensors this rank covers any element of, ascending.
  std::vector<uint32_t> CoveredCanonical() const;
  // Elements of canonical tensor `canonical` this rank covers.
  uint64_t CoveredElements(uint32_t canonical) const;

 private:
  friend Result<PlacementMap> ExpandPlacement(const LayoutDescription&, std::vector<TensorSpec>,
                                              std::vector<TensorSpec>, PlacementUse);
  friend Result<PlacementMap> MapWhole(std::vector<TensorSpec>, std::vector<std::string>);
  friend Result<PlacementMap> MapRuns(std::string, std::vector<TensorSpec>,
                                      std::vector<LocalTensor>, std::vector<Run>);
  friend Result<PlacementMap> MapRanges(std::vector<TensorSpec>, std::vector<ElementRange>,
                                        std::string);
  void Index();

  std::string name_;
  std::vector<TensorSpec> canonical_;  // sorted by name
  std::vector<LocalTensor> locals_;    // in the shard's order
  std::vector<Run> runs_;
  std::vector<size_t> local_begin_;     // runs_ of local t: [local_begin_[t], local_begin_[t + 1])
  std::vector<uint32_t> by_canonical_;  // run indices sorted by (canonical, dst)
};

// Expands `description` for its rank. `canonical` is the canonical tensor table
// (any order; the map keeps it sorted by name), `local` the rank's shard tensors
// (names, dtypes and shapes from its header). Errors name the rule (FILE:LINE) and
// the tensor.
Result<PlacementMap> ExpandPlacement(const LayoutDescription& description,
                                     std::vector<TensorSpec> canonical,
                                     std::vector<TensorSpec> local,
                                     PlacementUse use = PlacementUse::kScan);

// A local tensor a description expects its rank to hold.
struct ExpectedLocal {
  std::string name;             // the local name the rule gives it on this rank
  std::string canonical;        // a canonical tensor it holds part of
  int line = 0;                 // the rule
  std::vector<uint64_t> shape;  // the shape the rule implies; empty under FSDP
};

// Every local tensor `description` expects on its rank, by name: for each canonical
// tensor a rule maps onto (its patterns reversed; layers of this stage, experts of
// this EP rank), the local name that rule gives it, when the rule is the first to
// match that name. Tied and gathered rules expect nothing. Lets a receiver name a
// parameter its engine lacks, not only the canonical elements nobody holds.
Result<std::vector<ExpectedLocal>> ExpectedLocals(const LayoutDescription& description,
                                                  std::vector<TensorSpec> canonical);

// The map of a producer that holds canonical tensors as they are (a whole
// checkpoint, or a set of its tensors): identity runs for `names` (all when empty).
Result<PlacementMap> MapWhole(std::vector<TensorSpec> canonical, std::vector<std::string> names);

// The map of a producer that holds ranges of canonical tensors as they are (a flat
// shard of each, like FSDP2's dim-0 chunks of canonical tensors): local tensor k is
// range k, 1-D, in the canonical dtype, mapped by one identity run. `name` names
// the map in messages. Ranges must lie inside their tensors and not overlap.
Result<PlacementMap> MapRanges(std::vector<TensorSpec> canonical, std::vector<ElementRange> ranges,
                               std::string name);

// A map made from runs another map was rebuilt from (a share's FP8 image,
// relay/producers/fp8_share.h): `canonical` sorted by name, each run's local and canonical
// indices into `locals` and `canonical`. kInvalidArgument for a run that lies
// outside its local or canonical tensor, or a table that is not sorted.
Result<PlacementMap> MapRuns(std::string name, std::vector<TensorSpec> canonical,
                             std::vector<LocalTensor> locals, std::vector<Run> runs);

// Checks that `maps` (every rank of a mesh, all over the same canonical table)
// cover every canonical element exactly once. kInvalidArgument naming the tensor,
// the element range and the ranks (FILE:LINE of their rules) for a gap or overlap.
Status CheckCoverage(std::span<const PlacementMap* const> maps);

// A rank's runs seen from the canonical side (where its elements land), without its
// shard: what a process that holds no shard (the root of many producers) needs to
// check a mesh's coverage. The runs' `local` and `src` are not looked at.
struct CanonicalRuns {
  std::string name;  // for messages, e.g. "producer rank-00001: FILE (tp=1 ...)"
  std::vector<Run> runs;
};
CanonicalRuns CanonicalRunsOf(const PlacementMap& map, std::string name);

// CheckCoverage for ranks known by their canonical runs, all over `canonical`
// (sorted by name, as a PlacementMap keeps it). Runs that do not lie inside their
// tensor are refused too (kInvalidArgument naming the rank): they may come from
// another process.
Status CheckCoverage(const std::vector<TensorSpec>& canonical,
                     std::span<const CanonicalRuns> ranks);

}  // namespace deltacast::layout
