#include "borrowed_tensor.h"

#include <dlpack/dlpack.h>

#include <optional>

namespace deltacast::python {
namespace {

std::optional<DType> ToDType(const DLDataType& t) {
  if (t.lanes != 1) return std::nullopt;
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 16) return DType::kF16;
      if (t.bits == 32) return DType::kF32;
      if (t.bits == 64) return DType::kF64;
      return std::nullopt;
    case kDLBfloat:
      return t.bits == 16 ? std::optional(DType::kBF16) : std::nullopt;
    case kDLInt:
      if (t.bits == 8) return DType::kI8;
      if (t.bits == 16) return DType::kI16;
      if (t.bits == 32) return DType::kI32;
      if (t.bits == 64) return DType::kI64;
      return std::nullopt;
    case kDLUInt:
      if (t.bits == 8) return DType::kU8;
      if (t.bits == 16) return DType::kU16;
      if (t.bits == 32) return DType::kU32;
      if (t.bits == 64) return DType::kU64;
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

bool RowMajor(const DLTensor& t) {
  if (t.strides == nullptr) return true;
  int64_t expected = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

}  // namespace

Result<std::unique_ptr<BorrowedTensor>> BorrowedTensor::Borrow(const std::string& name,
                                                               pybind11::handle object,
                                                               bool allow_cuda) {
  namespace py = pybind11;
  if (!py::hasattr(object, "__dlpack__")) {
    return Status::InvalidArgument("tensor '" + name + "' (a " +
                                   std::string(py::str(py::type::of(object).attr("__name__"))) +
                                   ") has no __dlpack__: pass torch tensors or numpy arrays");
  }
  // A CUDA tensor is asked for with stream=1 (DLPack: the consumer's stream, 1 being
  // the legacy default stream): its producer orders that stream after the work that
  // writes the tensor (torch records an event on its current stream), and the node
  // waits for that stream before it reads (GpuWeights::stream). Host tensors take no
  // stream (numpy refuses one).
  bool cuda = false;
  if (allow_cuda && py::hasattr(object, "__dlpack_device__")) {
    auto where = object.attr("__dlpack_device__")().cast<py::tuple>();
    cuda = where.size() >= 1 && where[0].cast<int>() == kDLCUDA;
  }
  py::object capsule;
  if (cuda) {
    try {
      capsule = object.attr("__dlpack__")(py::arg("stream") = 1);
    } catch (py::error_already_set& e) {
      // A producer older than DLPack's stream argument: take the tensor without it;
      // the node then waits for the whole device before reading (stream 0).
      if (!e.matches(PyExc_TypeError)) throw;
      cuda = false;
      capsule = object.attr("__dlpack__")();
    }
  } else {
    capsule = object.attr("__dlpack__")();
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) {
    PyErr_Clear();
    return Status::InvalidArgument("tensor '" + name + "': __dlpack__ returned no DLPack tensor");
  }
  // Consumed: from now on the deleter is ours to call (DLPack's capsule protocol).
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");
  auto owned = std::unique_ptr<BorrowedTensor>(
      new BorrowedTensor(managed, py::reinterpret_borrow<py::object>(object), {}));
  const DLTensor& t = managed->dl_tensor;
  if (t.device.device_type == kDLCUDA && allow_cuda) {
    owned->device_ = t.device.device_id;
    owned->stream_ = cuda ? 1 : 0;
  } else if (t.device.device_type != kDLCPU) {
    return Status::Unsupported(
        "tensor '" + name + "' is not in host memory (DLPack device " +
        std::to_string(t.device.device_type) +
        (allow_cuda ? "): deltacast takes host and CUDA tensors"
                    : "): pass GPU weights to Node(gpus=...), or move it to the CPU"));
  }
  if (!RowMajor(t)) {
    return Status::InvalidArgument("tensor '" + name +
                                   "' is not contiguous: deltacast patches bytes in place, so it "
                                   "needs the tensor's own row-major storage (call .contiguous() "
                                   "on a tensor you then keep)");
  }
  const auto dtype = ToDType(t.dtype);
  if (!dtype) {
    return Status::Unsupported(
        "tensor '" + name + "' has a dtype deltacast does not carry (DLPack code " +
        std::to_string(t.dtype.code) + ", " + std::to_string(t.dtype.bits) + " bits)");
  }
  TensorView& view = owned->view_;
  view.spec.name = name;
  view.spec.dtype = *dtype;
  for (int d = 0; d < t.ndim; ++d) view.spec.shape.push_back(static_cast<uint64_t>(t.shape[d]));
  auto* data = static_cast<std::byte*>(t.data) + t.byte_offset;
  view.bytes = std::span<std::byte>(data, view.spec.ByteSize());
  return owned;
}

BorrowedTensor::~BorrowedTensor() {
  if (managed_ && managed_->deleter) managed_->deleter(managed_);
}

}  // namespace deltacast::python
