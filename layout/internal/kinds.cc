#include "layout/internal/kinds.h"

#include <algorithm>

namespace deltacast::layout::internal {
namespace {

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

uint64_t Product(const std::vector<uint64_t>& shape, size_t from) {
  uint64_t n = 1;
  for (size_t i = from; i < shape.size(); ++i) n *= shape[i];
  return n;
}

uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

Run Contiguous(const Target& t, uint64_t src, uint64_t dst, uint64_t len) {
  Run r;
  r.canonical = t.index;
  r.src = src;
  r.dst = t.base + dst;
  r.count = 1;
  r.len = len;
  r.src_stride = r.dst_stride = len;
  return r;
}

// This rank's rows [first, end) of `n` split over `axis` ranks.
Status SplitRange(const Rule& rule, const Target& t, uint64_t n, uint64_t axis, uint64_t coord,
                  uint64_t& first, uint64_t& end, uint64_t& local_rows) {
  if (rule.split == SplitMode::kEven) {
    if (n % axis != 0) {
      return Status::InvalidArgument("'" + t.name + "' " + ShapeText(t.shape) + ": " +
                                     std::to_string(n) + " does not split evenly over " +
                                     std::to_string(axis) + " ranks (split = \"ceil\"?)");
    }
    local_rows = n / axis;
    first = coord * local_rows;
    end = first + local_rows;
    return Status::Ok();
  }
  const uint64_t c = CeilDiv(n, axis);
  first = std::min(n, coord * c);
  end = std::min(n, first + c);
  local_rows = end - first;
  return Status::Ok();
}

Result<TpRuns> Column(const Rule& rule, const ModelDims& model, const Target& t, uint64_t axis,
                      uint64_t coord) {
  if (t.shape.empty()) return Status::InvalidArgument("'" + t.name + "' is a scalar");
  const uint64_t rows = t.shape[0];
  const uint64_t row = Product(t.shape, 1);
  TpRuns out;
  out.local_shape = t.shape;
  if (rule.pad != VocabPad::kNone) {
    // Megatron pads the vocabulary to a multiple of (divisible_by * tp); vLLM and
    // SGLang pad it to a multiple of the padding size, then split it evenly. Padding
    // rows are never sent.
    const bool megatron = rule.pad == VocabPad::kMegatron;
    const uint64_t m = model.vocab_pad_multiple * (megatron ? axis : 1);
    const uint64_t padded = CeilDiv(rows, m) * m;
    if (padded % axis != 0) {
      return Status::InvalidArgument("'" + t.name + "': the vocabulary of " + std::to_string(rows) +
                                     " rows padded to " + std::to_string(padded) +
                                     " does not split evenly over " + std::to_string(axis) +
                                     " ranks");
    }
    const uint64_t per = padded / axis;
    out.local_shape[0] = per;
    const uint64_t first = coord * per;
    const uint64_t end = std::min(rows, first + per);
    if (end > first) out.runs.push_back(Contiguous(t, 0, first * row, (end - first) * row));
    return out;
  }
  uint64_t first, end, local_rows;
  RETURN_IF_ERROR(SplitRange(rule, t, rows, axis, coord, first, end, local_rows));
  out.local_shape[0] = local_rows;
  if (end > first) out.runs.push_back(Contiguous(t, 0, first * row, (end - first) * row));
  return out;
}

Result<TpRuns> RowSplit(const Rule& rule, const Target& t, uint64_t axis, uint64_t coord) {
  if (t.shape.size() != 2) {
    return Status::InvalidArgument("a row split needs a 2-D tensor; '" + t.name + "' is " +
                                   ShapeText(t.shape));
  }
  const uint64_t rows = t.shape[0], cols = t.shape[1];
  uint64_t first, end, width;
  RETURN_IF_ERROR(SplitRange(rule, t, cols, axis, coord, first, end, width));
  TpRuns out;
  out.local_shape = {rows, width};
  if (width == 0 || rows == 0) return out;
  Run r;
  r.canonical = t.index;
  r.src = 0;
  r.src_stride = width;
  r.dst = t.base + first;
  r.dst_stride = cols;
  r.count = rows;
  r.len = width;
  if (rows == 1) r.dst_stride = width;
  out.runs.push_back(r);
  return out;
}

Result<TpRuns> Qkv(const ModelDims& m, const std::vector<Target>& t, uint64_t axis,
                   uint64_t coord) {
  const Target &q = t[0], &k = t[1], &v = t[2];
  const uint64_t row = Product(q.shape, 1);
  const uint64_t hpg = m.heads / m.kv_heads;
  const uint64_t hd = m.head_dim;
  if (q.shape.empty() || q.shape[0] != m.heads * hd || k.shape.empty() ||
      k.shape[0] != m.kv_heads * hd || v.shape != k.shape || Product(k.shape, 1) != row) {
    return Status::InvalidArgument(
        "fused QKV with heads " + std::to_string(m.heads) + ", kv_heads " +
        std::to_string(m.kv_heads) + ", head_dim " + std::to_string(hd) + " needs q [" +
        std::to_string(m.heads * hd) + ", ...] and k, v [" + std::to_string(m.kv_heads * hd) +
        ", ...] of equal row size; the canonical table has '" + q.name + "' " + ShapeText(q.shape) +
        ", '" + k.name + "' " + ShapeText(k.shape) + ", '" + v.name + "' " + ShapeText(v.shape));
  }
  const uint64_t block = (hpg + 2) * hd;  // fused rows per KV group: q heads, k, v
  const uint64_t total = m.kv_heads * block;
  if (total % axis != 0) {
    return Status::InvalidArgument("fused QKV of " + std::to_string(total) +
                                   " rows does not split evenly over " + std::to_string(axis) +
                                   " ranks");
  }
  const uint64_t per = total / axis;
  TpRuns out;
  out.local_shape = q.shape;
  out.local_shape[0] = per;
  // Walk this rank's fused rows, cutting at every part boundary: with kv_heads >=
  // tp a rank holds whole groups (3 runs per group, coalesced into 3 strided runs);
  // with kv_heads < tp it holds part of one group (at most 3 runs).
  for (uint64_t j = coord * per, end = j + per; j < end;) {
    const uint64_t g = j / block, in = j % block;
    uint64_t part_end, dst_row;
    const Target* target;
    if (in < hpg * hd) {
      target = &q;
      part_end = g * block + hpg * hd;
      dst_row = g * hpg * hd + in;
    } else if (in < (hpg + 1) * hd) {
      target = &k;
      part_end = g * block + (hpg + 1) * hd;
      dst_row = g * hd + in - hpg * hd;
    } else {
      target = &v;
      part_end = (g + 1) * block;
      dst_row = g * hd + in - (hpg + 1) * hd;
    }
    const uint64_t stop = std::min(end, part_end);
    out.runs.push_back(
        Contiguous(*target, (j - coord * per) * row, dst_row * row, (stop - j) * row));
    j = stop;
  }
  // Coalesce only merges runs that follow each other; group the parts so Q, K, V of
  // successive groups line up.
  std::stable_sort(out.runs.begin(), out.runs.end(),
                   [](const Run& a, const Run& b) { return a.canonical < b.canonical; });
  Coalesce(out.runs);
  return out;
}

// vLLM's and SGLang's QKVParallelLinear: rank r holds its nh/tp query heads, then
// the k rows of its KV heads, then their v rows. With kv_heads >= tp the KV heads
// split evenly; with kv_heads < tp each lies on tp/kv_heads neighbouring ranks
// (rank r holds head r / (tp/kv_heads)).
// A block-scale grid (rule.block = b > 1) is placed the same way in units of b
// weight rows: each rank's q rows and its k and v rows must be whole blocks, as the
// engines require of a fused FP8 QKV (a block may hold several heads).
Result<TpRuns> QkvHeads(const Rule& rule, const ModelDims& m, const std::vector<Target>& t,
                        uint64_t axis, uint64_t coord) {
  const Target &q = t[0], &k = t[1], &v = t[2];
  const uint64_t row = Product(q.shape, 1), b = rule.block;
  const uint64_t hd = m.head_dim, nh = m.heads, ng = m.kv_heads;
  const auto rows = [b](uint64_t weight_rows) { return (weight_rows + b - 1) / b; };
  if (q.shape.empty() || q.shape[0] != rows(nh * hd) || k.shape.empty() ||
      k.shape[0] != rows(ng * hd) || v.shape != k.shape || Product(k.shape, 1) != row) {
    return Status::InvalidArgument(
        "fused QKV (per-rank heads) with heads " + std::to_string(nh) + ", kv_heads " +
        std::to_string(ng) + ", head_dim " + std::to_string(hd) +
        (b > 1 ? " in blocks of " + std::to_string(b) + " rows" : "") + " needs q [" +
        std::to_string(rows(nh * hd)) + ", ...] and k, v [" + std::to_string(rows(ng * hd)) +
        ", ...] of equal row size; the canonical table has '" + q.name + "' " + ShapeText(q.shape) +
        ", '" + k.name + "' " + ShapeText(k.shape) + ", '" + v.name + "' " + ShapeText(v.shape));
  }
  if (nh % axis != 0) {
    return Status::InvalidArgument(std::to_string(nh) + " query heads do not split over " +
                                   std::to_string(axis) + " ranks");
  }
  TpRuns out;
  uint64_t kv_here = 0, kv_first = 0;
  if (ng >= axis) {
    if (ng % axis != 0) {
      return Status::InvalidArgument(std::to_string(ng) + " KV heads do not split over " +
                                     std::to_string(axis) + " ranks");
    }
    kv_here = ng / axis;
    kv_first = coord * kv_here;
  } else {
    if (axis % ng != 0) {
      return Status::InvalidArgument("KV replication factor " + std::to_string(axis) + " / " +
                                     std::to_string(ng) + " is not whole: " + std::to_string(ng) +
                                     " KV heads cannot be replicated evenly over " +
                                     std::to_string(axis) + " ranks");
    }
    kv_here = 1;
    out.kv_replicas = axis / ng;
    out.kv_index = coord % out.kv_replicas;
    kv_first = coord / out.kv_replicas;
  }
  // In weight rows, then in the tensor's own rows.
  uint64_t q_rows = nh / axis * hd, kv_rows = kv_here * hd, q_first = coord * q_rows,
           kv_start = kv_first * hd;
  if (b > 1) {
    if (q_rows % b != 0 || kv_rows % b != 0) {
      return Status::InvalidArgument(
          "each rank's q rows (" + std::to_string(q_rows) + ") and k, v rows (" +
          std::to_string(kv_rows) + ") must be whole " + std::to_string(b) +
          "-row scale blocks (the engines refuse a fused FP8 QKV that cuts a block)");
    }
    q_rows /= b, kv_rows /= b, q_first /= b, kv_start /= b;
  }
  out.local_shape = q.shape;
  out.local_shape[0] = q_rows + 2 * kv_rows;
  if (row == 0) return out;
  out.runs.push_back(Contiguous(q, 0, q_first * row, q_rows * row));
  out.runs.push_back(Contiguous(k, q_rows * row, kv_start * row, kv_rows * row));
  out.runs.push_back(Contiguous(v, (q_rows + kv_rows) * row, kv_start * row, kv_rows * row));
  return out;
}

Result<TpRuns> GateUp(const Rule& rule, const std::vector<Target>& t, uint64_t axis,
                      uint64_t coord) {
  const Target &gate = t[0], &up = t[1];
  if (gate.shape != up.shape || gate.shape.empty()) {
    return Status::InvalidArgument("fused gate/up needs two tensors of one shape; '" + gate.name +
                                   "' is " + ShapeText(gate.shape) + ", '" + up.name + "' " +
                                   ShapeText(up.shape));
  }
  const uint64_t row = Product(gate.shape, 1);
  uint64_t first, end, per;
  RETURN_IF_ERROR(SplitRange(rule, gate, gate.shape[0], axis, coord, first, end, per));
  TpRuns out;
  out.local_shape = gate.shape;
  out.local_shape[0] = 2 * per;
  if (per == 0) return out;
  out.runs.push_back(Contiguous(gate, 0, first * row, per * row));
  out.runs.push_back(Contiguous(up, per * row, first * row, per * row));
  return out;
}

}  // namespace

Result<TpRuns> KindRuns(const Rule& rule, const ModelDims& model,
                        const std::vector<Target>& targets, uint64_t axis, uint64_t coord) {
  switch (rule.kind) {
    case Kind::kColumn:
    case Kind::kTied: {
      auto r = Column(rule, model, targets[0], axis, coord);
      if (r.ok() && rule.kind == Kind::kTied) r->runs.clear();
      return r;
    }
    case Kind::kRow:
      return RowSplit(rule, targets[0], axis, coord);
    case Kind::kReplicated:
    case Kind::kGathered: {
      TpRuns out;
      out.local_shape = targets[0].shape;
      const uint64_t n = Product(targets[0].shape, 0);
      if (n > 0) out.runs.push_back(Contiguous(targets[0], 0, 0, n));
      return out;
    }
    case Kind::kQkv:
      return Qkv(model, targets, axis, coord);
    case Kind::kQkvHeads:
      return QkvHeads(rule, model, targets, axis, coord);
    case Kind::kGateUp:
      return GateUp(rule, targets, axis, coord);
  }
  return Status::Internal("unknown kind");
}

}  // namespace deltacast::layout::internal
