#include "relay/producers/fp8_share.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "common/parallel.h"
#include "quant/fp8_quantizer.h"

namespace deltacast::relay {

using layout::Run;

namespace {

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

// One quantized canonical tensor the share holds elements of.
struct QTensor {
  uint32_t bf16 = 0;               // index into the BF16 canonical table
  uint32_t weight = 0, scale = 0;  // indices into the FP8 table
  const quant::Fp8Scheme* scheme = nullptr;
  std::string name;
  uint64_t rows = 0, cols = 0, br = 0, bc = 0, grid_cols = 0, blocks = 0;
  std::vector<uint64_t> held;  // elements held, per block
  std::vector<uint8_t> owner;  // holds the block's first element
  std::vector<uint8_t> split;  // held in part (a flag, not a division per piece)
  std::vector<uint16_t> amax_base, amax_target;
  std::vector<uint8_t> reduced;       // split block: the exchange set its amax
  std::vector<size_t> runs;           // indices into State::qruns
  uint32_t scale_local = UINT32_MAX;  // its scale local, if it owns any scale

  uint64_t BlockElements(uint64_t b) const {
    const uint64_t r0 = (b / grid_cols) * br, c0 = (b % grid_cols) * bc;
    return std::min(br, rows - r0) * std::min(bc, cols - c0);
  }
  // Calls fn(block, src element, packed offset, row, col, n) for each piece of a
  // block row that run `r` covers, in run order.
  template <class Fn>
  void Walk(const Run& r, Fn&& fn) const {
    for (uint64_t i = 0; i < r.count; ++i) {
      uint64_t src = r.src + i * r.src_stride, off = i * r.len;
      const uint64_t d = r.dst + i * r.dst_stride;
      // Divisions once per canonical row: a piece ends at a block's edge, the
      // tensor's row end, or the run row's end (the last piece).
      uint64_t row = d / cols, col = d % cols, block_col = col / bc;
      uint64_t block_row_first = (row / br) * grid_cols;
      for (uint64_t left = r.len; left > 0;) {
        const uint64_t n = std::min({left, (block_col + 1) * bc - col, cols - col});
        fn(block_row_first + block_col, src, off, row, col, n);
        src += n;
        off += n;
        left -= n;
        col += n;
        if (col == cols) {
          col = block_col = 0;
          ++row;
          block_row_first = (row / br) * grid_cols;
        } else {
          ++block_col;
        }
      }
    }
  }
};

// A BF16 run into a quantized tensor and the FP8 local that packs its bytes.
struct QRun {
  Run run;  // the BF16 map's run
  uint32_t local = 0;
  size_t tensor = 0;  // index into State::tensors
};

struct Fp8Share::State {
  ShareInput bf16;
  std::vector<quant::ServedTensor> plan;
  layout::PlacementMap map;
  size_t bf16_locals = 0;
  std::vector<QTensor> tensors;
  std::vector<QRun> qruns;
  std::vector<std::vector<std::byte>> base, target;  // per FP8 local; empty for BF16 ones
  Fp8ShareStats stats;
  bool amaxes = false;
  bool quantized = false;
};

std::vector<TensorSpec> Fp8CanonicalTable(std::span<const quant::ServedTensor> plan) {
  std::vector<TensorSpec> out;
  for (const quant::ServedTensor& s : plan) {
    out.push_back(s.weight);
    if (s.quantized()) out.push_back(s.scale);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

Fp8Share::Fp8Share(std::unique_ptr<State> state) : state_(std::move(state)) {}
Fp8Share::~Fp8Share() = default;
const layout::PlacementMap& Fp8Share::map() const { return state_->map; }
const Fp8ShareStats& Fp8Share::stats() const { return state_->stats; }

Result<std::unique_ptr<Fp8Share>> Fp8Share::Plan(const ShareInput& bf16,
                                                 std::vector<quant::ServedTensor> plan) {
  if (bf16.memory != nullptr) {
    return Status::Unsupported("FP8 serving from a share in device memory is not built");
  }
  const layout::PlacementMap& in = *bf16.map;
  if (plan.size() != in.canonical().size()) {
    return Status::InvalidArgument("the serving plan does not list the share's canonical tensors");
  }
  auto s = std::make_unique<State>();
  s->bf16 = bf16;
  s->plan = std::move(plan);
  const std::vector<TensorSpec> table = Fp8CanonicalTable(s->plan);
  auto index_of = [&](const std::string& name) {
    return static_cast<uint32_t>(
        std::lower_bound(table.begin(), table.end(), name,
                         [](const auto& t, const std::string& n) { return t.name < n; }) -
        table.begin());
  };
  std::vector<size_t> qtensor_of(s->plan.size(), SIZE_MAX);
  std::vector<layout::LocalTensor> locals = in.locals();
  s->bf16_locals = locals.size();
  std::vector<Run> runs;
  for (const Run& r0 : in.runs()) {
    const quant::ServedTensor& served = s->plan[r0.canonical];
    if (served.canonical != in.canonical()[r0.canonical]) {
      return Status::InvalidArgument("the serving plan's tensor '" + served.canonical.name +
                                     "' is not the share's");
    }
    Run r = r0;
    r.canonical = index_of(served.weight.name);
    if (!served.quantized()) {
      runs.push_back(r);
      continue;
    }
    if (r0.value != layout::Value::kBits) {
      return Status::Unsupported("tensor '" + served.canonical.name +
                                 "' is served FP8 but this share holds it through a value "
                                 "transform (rule line " +
                                 std::to_string(r0.line) +
                                 "); quantizing transformed values is not built");
    }
    if (qtensor_of[r0.canonical] == SIZE_MAX) {
      QTensor q;
      q.bf16 = r0.canonical;
      q.weight = r.canonical;
      q.scale = index_of(served.scale.name);
      q.scheme = served.scheme;
      q.name = served.canonical.name;
      q.rows = served.canonical.shape[0];
      q.cols = served.canonical.shape[1];
      q.br = q.scheme->BlockRows(q.rows);
      q.bc = q.scheme->BlockCols(q.cols);
      q.grid_cols = served.scale.shape[1];
      q.blocks = served.scale.shape[0] * served.scale.shape[1];
      q.held.assign(q.blocks, 0);
      q.owner.assign(q.blocks, 0);
      q.split.assign(q.blocks, 0);
      qtensor_of[r0.canonical] = s->tensors.size();
      s->tensors.push_back(std::move(q));
    }
    QRun qr;
    qr.run = r0;
    qr.tensor = qtensor_of[r0.canonical];
    qr.local = static_cast<uint32_t>(locals.size());
    const layout::LocalTensor& from = in.locals()[r0.local];
    locals.push_back(
        {{from.spec.name + " -> " + served.weight.name + " (FP8)", DType::kF8E4M3, {r0.Elements()}},
         layout::Role::kProjected,
         r0.line});
    r.local = qr.local;
    r.src = 0;
    r.src_stride = r.len;
    runs.push_back(r);
    s->tensors[qr.tensor].runs.push_back(s->qruns.size());
    s->qruns.push_back(qr);
  }
  // Geometry: which blocks the share holds, whole or in part, and whose scale it writes.
  for (QTensor& q : s->tensors) {
    for (size_t k : q.runs) {
      q.Walk(s->qruns[k].run,
             [&](uint64_t b, uint64_t, uint64_t, uint64_t row, uint64_t col, uint64_t n) {
               q.held[b] += n;
               if (row % q.br == 0 && col % q.bc == 0) q.owner[b] = 1;
             });
    }
    std::vector<Run> scale_runs;
    for (uint64_t b = 0; b < q.blocks; ++b) {
      if (q.held[b] == 0) continue;
      ++s->stats.blocks;
      if (q.held[b] < q.BlockElements(b)) {
        q.split[b] = 1;
        ++s->stats.split_blocks;
        s->stats.split_elements += q.held[b];
      }
      if (!q.owner[b]) continue;
      ++s->stats.scales_written;
      Run r;
      r.canonical = q.scale;
      r.src = r.dst = b;
      r.src_stride = r.dst_stride = 1;
      r.count = r.len = 1;
      scale_runs.push_back(r);
    }
    if (scale_runs.empty()) continue;
    q.scale_local = static_cast<uint32_t>(locals.size());
    for (Run& r : scale_runs) r.local = q.scale_local;
    layout::Coalesce(scale_runs);
    locals.push_back({{table[q.scale].name + " (scales written here)", DType::kF32, {q.blocks}},
                      layout::Role::kProjected,
                      0});
    runs.insert(runs.end(), scale_runs.begin(), scale_runs.end());
  }
  s->base.resize(locals.size());
  s->target.resize(locals.size());
  ASSIGN_OR_RETURN(s->map, layout::MapRuns(in.name() + " (FP8 serving image)", table,
                                           std::move(locals), std::move(runs)));
  return std::unique_ptr<Fp8Share>(new Fp8Share(std::move(s)));
}

namespace {

std::string NonFinite(const QTensor& q, std::span<const uint16_t> piece, uint64_t row, uint64_t col,
                      const char* version) {
  for (size_t j = 0; j < piece.size(); ++j) {
    const uint16_t b = piece[j];
    if (quant::Bf16AbsBits(b) < quant::kBf16NonFinite) continue;
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%04x", b);
    const bool nan = quant::Bf16AbsBits(b) > quant::kBf16NonFinite;
    return "tensor '" + q.name + "' element [" + std::to_string(row) + ", " +
           std::to_string(col + j) + "] of the " + version + " version is " +
           (nan ? "NaN" : (b & 0x8000 ? "-Inf" : "Inf")) + " (BF16 " + hex +
           "): FP8 serving weights are not made from non-finite values (docs/fp8.md)";
  }
  return "tensor '" + q.name + "': a non-finite amax with no non-finite element";
}

std::span<const uint16_t> Bf16(ByteSpan bytes) {
  return {reinterpret_cast<const uint16_t*>(bytes.data()), bytes.size() / 2};
}

Status FirstError(std::vector<Status>& statuses) {
  for (Status& s : statuses) RETURN_IF_ERROR(s);
  return Status::Ok();
}

}  // namespace

Status Fp8Share::TakeBaseFrom(Fp8Share& previous) {
  State& s = *state_;
  State& p = *previous.state_;
  if (s.amaxes) return Status::FailedPrecondition("TakeBaseFrom after ComputeAmaxes");
  if (!p.quantized) return Status::FailedPrecondition("the previous FP8 image is not quantized");
  bool same = p.map.runs() == s.map.runs() && p.map.canonical() == s.map.canonical() &&
              p.map.locals().size() == s.map.locals().size() && p.bf16_locals == s.bf16_locals;
  for (size_t l = 0; same && l < s.map.locals().size(); ++l) {
    same = p.map.locals()[l].spec == s.map.locals()[l].spec;
  }
  if (!same) return Status::FailedPrecondition("the previous FP8 image has another layout");
  for (size_t l = s.bf16_locals; l < s.base.size(); ++l) {
    s.base[l] = std::move(p.target[l]);
    // The previous refit's base is stale now: its buffers, already the right size
    // and faulted in, take this refit's new image, so a steady refit allocates and
    // zero-fills nothing (Quantize overwrites every byte of them).
    s.target[l] = std::move(p.base[l]);
  }
  p.quantized = false;
  s.stats.base_kept = true;
  return Status::Ok();
}

Status Fp8Share::ComputeAmaxes(size_t threads) {
  State& s = *state_;
  const bool base_kept = s.stats.base_kept;
  const auto start = std::chrono::steady_clock::now();
  std::vector<Status> statuses(s.tensors.size());
  ParallelFor(s.tensors.size(), threads ? threads : DefaultThreadCount(), [&](size_t t) {
    QTensor& q = s.tensors[t];
    q.amax_base.assign(q.blocks, 0);
    q.amax_target.assign(q.blocks, 0);
    q.reduced.assign(q.blocks, 0);
    for (size_t k : q.runs) {
      const Run& r = s.qruns[k].run;
      const auto base = Bf16(s.bf16.base(r.local)), target = Bf16(s.bf16.target(r.local));
      if (base.size() < r.SrcEnd() || target.size() < r.SrcEnd()) {
        statuses[t] = Status::InvalidArgument("tensor '" + q.name +
                                              "': a local tensor's bytes are shorter than its map");
        return;
      }
      q.Walk(r, [&](uint64_t b, uint64_t src, uint64_t, uint64_t row, uint64_t col, uint64_t n) {
        // A kept base still reports its split blocks' partial amaxes: a producer
        // that lost its image (restarted) quantizes the base again and needs them.
        if (!base_kept || q.split[b]) {
          q.amax_base[b] = quant::Fp8PieceAmax(base.subspan(src, n), q.amax_base[b]);
        }
        q.amax_target[b] = quant::Fp8PieceAmax(target.subspan(src, n), q.amax_target[b]);
        if (statuses[t].ok() &&
            std::max(q.amax_base[b], q.amax_target[b]) >= quant::kBf16NonFinite) {
          const bool in_base = q.amax_base[b] >= quant::kBf16NonFinite;
          statuses[t] =
              Status::InvalidArgument(NonFinite(q, (in_base ? base : target).subspan(src, n), row,
                                                col, in_base ? "previous" : "new"));
        }
      });
    }
  });
  RETURN_IF_ERROR(FirstError(statuses));
  s.stats.amax_seconds += Since(start);
  s.amaxes = true;
  return Status::Ok();
}

std::vector<SplitBlockAmax> Fp8Share::SplitBlocks() const {
  std::vector<SplitBlockAmax> out;
  for (const QTensor& q : state_->tensors) {
    for (uint64_t b = 0; b < q.blocks; ++b) {
      if (!q.split[b]) continue;
      out.push_back({q.bf16, b, q.amax_base[b], q.amax_target[b], q.held[b]});
    }
  }
  return out;
}

Status Fp8Share::SetSplitAmaxes(std::span<const SplitBlockAmax> reduced) {
  State& s = *state_;
  if (!s.amaxes) return Status::FailedPrecondition("SetSplitAmaxes before ComputeAmaxes");
  std::map<uint32_t, size_t> by_bf16;
  for (size_t t = 0; t < s.tensors.size(); ++t) by_bf16[s.tensors[t].bf16] = t;
  for (const SplitBlockAmax& a : reduced) {
    const auto it = by_bf16.find(a.tensor);
    if (it == by_bf16.end()) {
      return Status::InvalidArgument("a reduced amax for a tensor this share holds no block of");
    }
    QTensor& q = s.tensors[it->second];
    if (a.block >= q.blocks || !q.split[a.block]) {
      return Status::InvalidArgument("tensor '" + q.name + "' block " + std::to_string(a.block) +
                                     ": a reduced amax for a block not split in this share");
    }
    if (a.base < q.amax_base[a.block] || a.target < q.amax_target[a.block] ||
        std::max(a.base, a.target) >= quant::kBf16NonFinite) {
      return Status::InvalidArgument(
          "tensor '" + q.name + "' block " + std::to_string(a.block) +
          ": the reduced amax is below this share's piece or not finite");
    }
    q.amax_base[a.block] = a.base;
    q.amax_target[a.block] = a.target;
    q.reduced[a.block] = 1;
  }
  return Status::Ok();
}

Status Fp8Share::Quantize(size_t threads) {
  State& s = *state_;
  if (!s.amaxes) return Status::FailedPrecondition("Quantize before ComputeAmaxes");
  const auto start = std::chrono::steady_clock::now();
  const bool base_kept = s.stats.base_kept;
  for (const QTensor& q : s.tensors) {
    for (uint64_t b = 0; b < q.blocks; ++b) {
      if (q.split[b] && !q.reduced[b]) {
        return Status::FailedPrecondition("tensor '" + q.name + "' block " + std::to_string(b) +
                                          " is split across shares and its amax was not "
                                          "exchanged");
      }
    }
  }
  ParallelFor(s.tensors.size(), threads ? threads : DefaultThreadCount(), [&](size_t t) {
    const QTensor& q = s.tensors[t];
    std::vector<float> mult_base(q.blocks), mult_target(q.blocks);
    const quant::Fp8Scheme& scheme = *q.scheme;
    if (q.scale_local != UINT32_MAX) {
      if (!base_kept) s.base[q.scale_local].assign(q.blocks * sizeof(float), std::byte{0});
      s.target[q.scale_local].assign(q.blocks * sizeof(float), std::byte{0});
    }
    const bool writes_scales = q.scale_local != UINT32_MAX;
    auto* scale_base =
        writes_scales ? reinterpret_cast<float*>(s.base[q.scale_local].data()) : nullptr;
    auto* scale_target =
        writes_scales ? reinterpret_cast<float*>(s.target[q.scale_local].data()) : nullptr;
    for (uint64_t b = 0; b < q.blocks; ++b) {
      if (q.held[b] == 0) continue;
      const quant::BlockScale sb =
          quant::ScaleOfBlock(q.amax_base[b], scheme.scale_format, scheme.multiplier);
      const quant::BlockScale st =
          quant::ScaleOfBlock(q.amax_target[b], scheme.scale_format, scheme.multiplier);
      mult_base[b] = sb.multiplier;
      mult_target[b] = st.multiplier;
      if (q.owner[b]) {
        if (!base_kept) scale_base[b] = sb.scale_inv;
        scale_target[b] = st.scale_inv;
      }
    }
    for (size_t k : q.runs) {
      const QRun& qr = s.qruns[k];
      const auto base = Bf16(s.bf16.base(qr.run.local)), target = Bf16(s.bf16.target(qr.run.local));
      std::vector<std::byte>& out_base = s.base[qr.local];
      std::vector<std::byte>& out_target = s.target[qr.local];
      if (!base_kept) out_base.resize(qr.run.Elements());
      out_target.resize(qr.run.Elements());
      auto* ob = reinterpret_cast<uint8_t*>(out_base.data());
      auto* ot = reinterpret_cast<uint8_t*>(out_target.data());
      q.Walk(qr.run, [&](uint64_t b, uint64_t src, uint64_t off, uint64_t, uint64_t, uint64_t n) {
        if (!base_kept) quant::QuantizeFp8Piece(base.subspan(src, n), mult_base[b], {ob + off, n});
        quant::QuantizeFp8Piece(target.subspan(src, n), mult_target[b], {ot + off, n});
      });
    }
  });
  s.stats.quantized_bf16_bytes = 0;
  for (const QRun& qr : s.qruns) s.stats.quantized_bf16_bytes += qr.run.Elements() * 2;
  s.stats.quantize_seconds += Since(start);
  s.quantized = true;
  return Status::Ok();
}

ShareInput Fp8Share::Input() const {
  const State* s = state_.get();
  ShareInput out;
  out.map = &s->map;
  out.base = [s](uint32_t local) -> ByteSpan {
    return local < s->bf16_locals ? s->bf16.base(local) : ByteSpan(s->base[local]);
  };
  out.target = [s](uint32_t local) -> ByteSpan {
    return local < s->bf16_locals ? s->bf16.target(local) : ByteSpan(s->target[local]);
  };
  return out;
}

std::vector<SplitBlockAmax> ReduceSplitAmaxes(std::span<const std::vector<SplitBlockAmax>> shares) {
  std::map<std::pair<uint32_t, uint64_t>, SplitBlockAmax> reduced;
  for (const auto& share : shares) {
    for (const SplitBlockAmax& a : share) {
      auto [it, fresh] = reduced.try_emplace({a.tensor, a.block}, a);
      it->second.elements = 0;
      if (fresh) continue;
      it->second.base = std::max(it->second.base, a.base);
      it->second.target = std::max(it->second.target, a.target);
    }
  }
  std::vector<SplitBlockAmax> out;
  out.reserve(reduced.size());
  for (auto& [key, a] : reduced) out.push_back(a);
  return out;
}

}  // namespace deltacast::relay
