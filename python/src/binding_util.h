// What the binding's parts share: errors raised as deltacast.Error, and named
// tensors borrowed from Python.
//
// Thread safety: call with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "borrowed_tensor.h"
#include "deltacast/status.h"
#include "deltacast/tensor.h"

namespace deltacast::python {

// The Python type Raise throws (deltacast.Error); set once by the module.
void SetErrorType(PyObject* type);

// Raises deltacast.Error with the Status's message ("INVALID_ARGUMENT: ...") and its
// code name as the exception's `code`.
[[noreturn]] void Raise(const Status& status);

template <typename T>
T Take(Result<T> result) {
  if (!result.ok()) Raise(result.status());
  return std::move(*result);
}

// Named tensors from a mapping (a state_dict) or a sequence of (name, tensor), in
// the order given. `allow_cuda`: CUDA tensors are taken too (BorrowedTensor::device).
std::vector<std::unique_ptr<BorrowedTensor>> BorrowAll(pybind11::handle tensors,
                                                       bool allow_cuda = false);

std::vector<TensorView> Views(const std::vector<std::unique_ptr<BorrowedTensor>>& tensors);

// Binds Producer, Root and ProduceReport (producers.cc).
void BindProducers(pybind11::module_& m);

}  // namespace deltacast::python
