// A tensor borrowed from Python through DLPack (torch, numpy, anything with
// __dlpack__): its bytes are used in place, never copied, and the producer's
// object is kept alive (the managed tensor's deleter runs when this is destroyed,
// which must happen with the GIL held).
//
// Thread safety: create and destroy with the GIL held; view() from any thread.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>

#include "deltacast/status.h"
#include "deltacast/tensor.h"

struct DLManagedTensor;

namespace deltacast::python {

class BorrowedTensor {
 public:
  // Refuses, naming `name`: an object without __dlpack__, a tensor off the host
  // (CUDA tensors are taken with `allow_cuda`), a non-contiguous one, or a dtype
  // deltacast does not carry.
  static Result<std::unique_ptr<BorrowedTensor>> Borrow(const std::string& name,
                                                        pybind11::handle object,
                                                        bool allow_cuda = false);
  ~BorrowedTensor();
  BorrowedTensor(const BorrowedTensor&) = delete;
  BorrowedTensor& operator=(const BorrowedTensor&) = delete;

  const TensorView& view() const { return view_; }
  // The CUDA device whose memory the bytes lie in; -1 for host memory.
  int device() const { return device_; }
  // The CUDA stream the tensor's producer ordered its writes with (1: the legacy
  // default stream, asked for through __dlpack__(stream=1)); 0 for host tensors.
  uintptr_t stream() const { return stream_; }

 private:
  BorrowedTensor(DLManagedTensor* managed, pybind11::object owner, TensorView view)
      : managed_(managed), owner_(std::move(owner)), view_(std::move(view)) {}
  DLManagedTensor* managed_;
  pybind11::object owner_;  // the Python tensor, held as long as its bytes are used
  TensorView view_;
  int device_ = -1;
  uintptr_t stream_ = 0;
};

}  // namespace deltacast::python
