#include "relay/producers/refit_assembly.h"

#include <algorithm>

namespace deltacast::relay {

RefitAssembly::RefitAssembly(const codec::Manifest* known, uint64_t partition_bytes,
                             std::optional<Digest128>* checked_mesh, const ProducerPieces* expected)
    : known_(known),
      partition_bytes_(partition_bytes),
      checked_mesh_(checked_mesh),
      expected_(expected) {}

Status RefitAssembly::AddCoverage(const std::string& producer, Coverage coverage) {
  if (table_.empty()) table_ = coverage.tensors;
  if (coverage.tensors != table_) {
    return Status::InvalidArgument("producer " + producer +
                                   " holds another canonical tensor table than " +
                                   shares_.begin()->first);
  }
  shares_[producer] =
      ShareReport{producer, std::move(coverage.shares), std::move(coverage.base_pieces), {}, {}};
  layouts_.push_back(
      {"producer " + producer + ": " + coverage.layout_name, std::move(coverage.runs)});
  return Status::Ok();
}

std::vector<const ShareReport*> RefitAssembly::reports() const {
  std::vector<const ShareReport*> out;
  for (const auto& [id, s] : shares_) out.push_back(&s);
  return out;
}

// A rank that claims another's coordinates makes an overlap and a gap that the
// per-partition counts cannot see: some elements would be shipped twice and others
// never. Checked again whenever a producer's layout or the set of producers changes.
Status RefitAssembly::CheckMesh() {
  std::sort(layouts_.begin(), layouts_.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  Hasher128 key;
  for (const auto& t : table_) {
    key.UpdateString(t.name);
    for (uint64_t d : t.shape) key.UpdateValue(d);
  }
  for (const auto& l : layouts_) {
    key.UpdateString(l.name);
    for (const layout::Run& r : l.runs) {
      for (uint64_t v : {uint64_t{r.canonical}, r.dst, r.dst_stride, r.count, r.len}) {
        key.UpdateValue(v);
      }
    }
  }
  const Digest128 fingerprint = key.Finish();
  if (checked_mesh_ != nullptr && *checked_mesh_ == fingerprint) return Status::Ok();
  std::vector<TensorSpec> specs;
  for (const auto& t : table_) specs.push_back({t.name, t.dtype, t.shape});
  Status covered = layout::CheckCoverage(specs, layouts_);
  if (!covered.ok()) {
    return covered.WithContext(
        "the producers' layouts do not cover the model exactly (deltacast layout check says "
        "the same offline)");
  }
  if (checked_mesh_ != nullptr) *checked_mesh_ = fingerprint;
  return Status::Ok();
}

Status RefitAssembly::SettleBase() {
  const std::vector<const ShareReport*> all = reports();
  // The layouts first: their error names the elements and each rank's rule.
  RETURN_IF_ERROR(CheckMesh());
  RETURN_IF_ERROR(CheckShares(table_, partition_bytes_, all));
  if (known_ != nullptr) {
    if (known_->tensors != table_) {
      return Status::FailedPrecondition(
          "the producers' canonical tensor table differs from the base version's");
    }
    base_ = *known_;
    return Status::Ok();
  }
  ASSIGN_OR_RETURN(base_, CombineBaseManifest(table_, partition_bytes_, all));
  return Status::Ok();
}

BaseHashes RefitAssembly::HashesFor(const std::string& producer, uint64_t refit_id) const {
  BaseHashes hashes{refit_id, {}};
  for (const auto& c : shares_.at(producer).coverage) {
    hashes.hashes.push_back(c.Whole() ? base_.partition_hashes[c.tensor][c.partition]
                                      : PartitionHash{});
  }
  return hashes;
}

void RefitAssembly::AddProduced(const std::string& producer, Produced produced) {
  ShareReport& s = shares_.at(producer);
  s.changes = produced.changes;
  s.proof = produced.base_pieces;
  produced_[producer] = std::move(produced);
}

Status RefitAssembly::SettleTarget() {
  const std::vector<const ShareReport*> all = reports();
  // Every producer compared against the base the tree holds, or nothing goes down.
  RETURN_IF_ERROR(CheckBaseProof(base_, all, expected_));
  ASSIGN_OR_RETURN(target_, CombineTargetManifest(base_, all));
  return Status::Ok();
}

}  // namespace deltacast::relay
