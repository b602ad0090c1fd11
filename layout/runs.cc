#include "layout/runs.h"

#include <algorithm>

namespace deltacast::layout {

std::vector<RowPiece> ClipRows(uint64_t start, uint64_t stride, uint64_t len, uint64_t count,
                               uint64_t begin, uint64_t end) {
  std::vector<RowPiece> out;
  if (count == 0 || len == 0 || begin >= end) return out;
  if (count == 1) stride = len;  // a single row: any stride
  // First row ending after `begin`, last row starting before `end`.
  uint64_t first = 0;
  if (begin >= start + len) first = (begin - start - len) / stride + 1;
  if (end <= start) return out;
  const uint64_t last = std::min(count - 1, (end - 1 - start) / stride);
  if (first > last) return out;
  auto clip = [&](uint64_t row) {
    const uint64_t row_start = start + row * stride;
    const uint64_t a = std::max(begin, row_start);
    const uint64_t b = std::min(end, row_start + len);
    return RowPiece{row, 1, a - row_start, b - a};
  };
  const RowPiece head = clip(first);
  if (head.len == 0) return out;  // `begin..end` falls between rows
  uint64_t middle_first = first;
  if (head.offset != 0 || head.len != len) {
    out.push_back(head);
    middle_first = first + 1;
  }
  if (middle_first > last) return out;
  const RowPiece tail = clip(last);
  const bool tail_partial = tail.len != len || tail.offset != 0;
  const uint64_t middle_last = tail_partial ? last - 1 : last;  // inclusive
  if (middle_last + 1 > middle_first) {
    out.push_back(RowPiece{middle_first, middle_last + 1 - middle_first, 0, len});
  }
  if (tail_partial && last >= middle_first && tail.len > 0) out.push_back(tail);
  return out;
}

namespace {

Run Piece(const Run& run, const RowPiece& p) {
  Run r = run;
  r.src = run.src + p.first_row * run.src_stride + p.offset;
  r.dst = run.dst + p.first_row * run.dst_stride + p.offset;
  r.count = p.rows;
  r.len = p.len;
  if (r.count == 1) {
    r.src_stride = r.len;
    r.dst_stride = r.len;
  }
  return r;
}

}  // namespace

std::vector<Run> ClipSource(const Run& run, uint64_t begin, uint64_t end, uint64_t rebase) {
  std::vector<Run> out;
  for (const RowPiece& p : ClipRows(run.src, run.src_stride, run.len, run.count, begin, end)) {
    Run r = Piece(run, p);
    r.src = r.src - begin + rebase;
    out.push_back(r);
  }
  return out;
}

std::vector<Run> ClipDestination(const Run& run, uint64_t begin, uint64_t end) {
  std::vector<Run> out;
  for (const RowPiece& p : ClipRows(run.dst, run.dst_stride, run.len, run.count, begin, end)) {
    out.push_back(Piece(run, p));
  }
  return out;
}

void Coalesce(std::vector<Run>& runs) {
  std::vector<Run> out;
  for (const Run& b : runs) {
    if (!out.empty()) {
      Run& a = out.back();
      const bool same = a.local == b.local && a.canonical == b.canonical && a.value == b.value &&
                        a.copy == b.copy;
      if (same && a.count == 1 && b.count == 1 && b.src == a.src + a.len &&
          b.dst == a.dst + a.len) {
        a.len += b.len;
        a.src_stride = a.dst_stride = a.len;
        continue;
      }
      if (same && b.count == 1 && b.len == a.len && b.src > a.src && b.dst > a.dst) {
        const uint64_t ss = a.count == 1 ? b.src - a.src : a.src_stride;
        const uint64_t ds = a.count == 1 ? b.dst - a.dst : a.dst_stride;
        if (ss >= a.len && ds >= a.len && b.src == a.src + a.count * ss &&
            b.dst == a.dst + a.count * ds) {
          a.src_stride = ss;
          a.dst_stride = ds;
          ++a.count;
          continue;
        }
      }
    }
    out.push_back(b);
  }
  runs = std::move(out);
}

std::optional<uint64_t> Project(const Run& run, uint64_t index) {
  if (run.count == 0 || index < run.src || index >= run.SrcEnd()) return std::nullopt;
  const uint64_t rel = index - run.src;
  const uint64_t row = run.count == 1 ? 0 : rel / run.src_stride;
  const uint64_t col = rel - row * (run.count == 1 ? 0 : run.src_stride);
  if (row >= run.count || col >= run.len) return std::nullopt;
  return run.dst + row * run.dst_stride + col;
}

}  // namespace deltacast::layout
