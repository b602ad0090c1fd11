// RangeReader: how the encoder and the manifest hash read one version's tensor
// bytes, one partition at a time.
//
// A reader either returns a view of memory it already holds (host buffers) or
// copies the bytes into the caller's `buffer` and returns a view of that (a
// checkpoint directory, with pread by default; GPU stores). On the VMs measured
// here a process's first touch of a mapped file page cost more than copying it into
// a reused, cache-resident buffer, so a checkpoint directory copies unless told to
// view its populated mapping (apply/checkpoint_dir.h, ReadPath; README, "Encode
// speed of the command line").
//
// Thread safety: a reader is called from several threads at once, each with its own
// buffer.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/bytes.h"
#include "common/status.h"

namespace deltacast::codec {

// Bytes [byte_offset, byte_offset + length) of tensor `tensor`, either in `buffer`
// (which must hold at least `length` bytes; what is past them is left alone) or
// viewed where they are. The view is valid until `buffer` is next changed or the
// reader's source goes away. kInvalidArgument for a range outside the tensor or a
// buffer too small; a reader of files returns kIoError when a read fails or comes
// back short.
using RangeReader = std::function<Result<ByteSpan>(size_t tensor, uint64_t byte_offset,
                                                   uint64_t length, MutableByteSpan buffer)>;

// A reader over whole tensors already in memory (tensor_data(i) is tensor i's bytes):
// returns views, never copies. The bytes must outlive the reader.
RangeReader ReadFromSpans(std::function<ByteSpan(size_t)> tensor_data);

}  // namespace deltacast::codec
