#include "binding_util.h"

namespace py = pybind11;

namespace deltacast::python {
namespace {
PyObject* g_error = nullptr;
}  // namespace

void SetErrorType(PyObject* type) { g_error = type; }

void Raise(const Status& status) {
  py::object error = py::reinterpret_borrow<py::object>(g_error)(status.ToString());
  error.attr("code") = std::string(StatusCodeName(status.code()));
  PyErr_SetObject(g_error, error.ptr());
  throw py::error_already_set();
}

std::vector<std::unique_ptr<BorrowedTensor>> BorrowAll(py::handle tensors, bool allow_cuda) {
  py::object items = py::hasattr(tensors, "items") ? tensors.attr("items")()
                                                   : py::reinterpret_borrow<py::object>(tensors);
  std::vector<std::unique_ptr<BorrowedTensor>> out;
  for (py::handle item : items) {
    auto pair = item.cast<py::tuple>();
    if (pair.size() != 2) Raise(Status::InvalidArgument("tensors: expected (name, tensor) pairs"));
    out.push_back(Take(BorrowedTensor::Borrow(pair[0].cast<std::string>(), pair[1], allow_cuda)));
  }
  if (out.empty()) Raise(Status::InvalidArgument("tensors: none given"));
  return out;
}

std::vector<TensorView> Views(const std::vector<std::unique_ptr<BorrowedTensor>>& tensors) {
  std::vector<TensorView> views;
  views.reserve(tensors.size());
  for (const auto& t : tensors) views.push_back(t->view());
  return views;
}

}  // namespace deltacast::python
