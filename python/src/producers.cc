// The many-producer side of the binding: Producer over one rank's live tensors and
// the Root that merges the producers' streams (include/deltacast/producer.h).
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <algorithm>
#include <cstring>

#include "binding_util.h"
#include "deltacast/producer.h"

namespace py = pybind11;

namespace deltacast::python {
namespace {

// One producer over live tensors: like the Source, it keeps a copy of the version
// the fleet holds (its own tensors only), so serve() sends what changed since.
class PyProducer {
 public:
  PyProducer(const Config& config, py::handle tensors, py::handle model, ProducerOptions options)
      : live_(BorrowAll(tensors)) {
    std::vector<TensorSpec> specs;
    for (const auto& t : BorrowAll(model)) specs.push_back(t->view().spec);
    for (const auto& t : live_) {  // refused before dialing the root, not at the first serve
      const TensorSpec& mine = t->view().spec;
      const bool known = std::any_of(specs.begin(), specs.end(), [&](const TensorSpec& m) {
        return m.name == mine.name && m.dtype == mine.dtype && m.shape == mine.shape;
      });
      if (!known) {
        Raise(Status::InvalidArgument("tensor '" + mine.name +
                                      "' is not in the model (or has another dtype or shape)"));
      }
    }
    for (const auto& t : live_) {
      const TensorView& v = t->view();
      held_bytes_.emplace_back(v.bytes.begin(), v.bytes.end());
      held_.push_back({v.spec, held_bytes_.back()});
    }
    Result<std::unique_ptr<Producer>> producer = Status::Internal("not started");
    {
      py::gil_scoped_release released;
      producer = Producer::Connect(config, std::move(options), std::move(specs));
    }
    producer_ = Take(std::move(producer));
  }
  ~PyProducer() { Close(); }

  // Serves the root's next refit with the tensors' current bytes. The caller must
  // not change them until this returns.
  ProduceReport Serve() {
    Result<ProduceReport> report = Status::Internal("not run");
    {
      py::gil_scoped_release released;
      const std::vector<TensorView> live = Views(live_);
      report = producer_->Serve(held_, live);
      if (report.ok() && report->committed) {
        for (size_t i = 0; i < live.size(); ++i) {
          std::memcpy(held_[i].bytes.data(), live[i].bytes.data(), live[i].bytes.size());
        }
      }
    }
    return Take(std::move(report));
  }

  void Close() {
    py::gil_scoped_release released;
    if (producer_) producer_->Close();
  }

 private:
  std::vector<std::unique_ptr<BorrowedTensor>> live_;
  std::vector<std::vector<std::byte>> held_bytes_;  // its tensors' last committed bytes
  std::vector<TensorView> held_;
  std::unique_ptr<Producer> producer_;
};

class PyRoot {
 public:
  PyRoot(const Config& config, RootOptions options) {
    Result<std::unique_ptr<Root>> root = Status::Internal("not started");
    {
      py::gil_scoped_release released;
      root = Root::Start(config, std::move(options));
    }
    root_ = Take(std::move(root));
  }
  ~PyRoot() { Stop(); }

  PublishReport Publish() {
    Result<PublishReport> report = Status::Internal("not run");
    {
      py::gil_scoped_release released;
      report = root_->Publish();
    }
    return Take(std::move(report));
  }
  void Stop() {
    py::gil_scoped_release released;
    if (root_) root_->Stop();
  }
  std::string producer_address() const { return root_->producer_address(); }
  std::string address() const { return root_->listen_address(); }

 private:
  std::unique_ptr<Root> root_;
};

}  // namespace

void BindProducers(py::module_& m) {
  py::class_<ProduceReport>(m, "ProduceReport", "What one producer did in one refit.")
      .def_readonly("committed", &ProduceReport::committed)
      .def_readonly("reason", &ProduceReport::reason)
      .def_readonly("refit_id", &ProduceReport::refit_id)
      .def_readonly("partitions", &ProduceReport::partitions)
      .def_readonly("changed_elements", &ProduceReport::changed_elements)
      .def_readonly("sent_bytes", &ProduceReport::sent_bytes)
      .def_readonly("encode_seconds", &ProduceReport::encode_seconds)
      .def_readonly("seconds", &ProduceReport::seconds)
      .def("__repr__", [](const ProduceReport& r) {
        return std::string("<ProduceReport ") + (r.committed ? "committed " : "aborted ") +
               std::to_string(r.sent_bytes) + " B sent>";
      });

  py::class_<PyProducer>(m, "_Producer")
      .def(py::init([](const Config& config, const std::string& id, py::handle tensors,
                       py::handle model, const std::string& token, const std::string& root,
                       bool context_mode, size_t encode_threads) {
             ProducerOptions o;
             o.id = id;
             o.token = token;
             o.root_address = root;
             o.context_mode = context_mode;
             o.encode_threads = encode_threads;
             return std::make_unique<PyProducer>(config, tensors, model, std::move(o));
           }),
           py::arg("config"), py::arg("id"), py::arg("tensors"), py::arg("model"), py::arg("token"),
           py::arg("root") = "", py::arg("context_mode") = false, py::arg("encode_threads") = 0)
      .def("serve", &PyProducer::Serve)
      .def("close", &PyProducer::Close);

  py::class_<PyRoot>(m, "_Root")
      .def(py::init([](const Config& config, size_t producers, const std::string& token,
                       const std::string& producer_address, const std::string& state_dir,
                       size_t keep_deltas) {
             RootOptions o;
             o.token = token;
             o.producers = producers;
             o.producer_address = producer_address;
             o.state_dir = state_dir;
             o.keep_deltas = keep_deltas;
             return std::make_unique<PyRoot>(config, std::move(o));
           }),
           py::arg("config"), py::arg("producers"), py::arg("token"),
           py::arg("producer_address") = "", py::arg("state_dir") = "", py::arg("keep_deltas") = 4)
      .def("publish", &PyRoot::Publish)
      .def("stop", &PyRoot::Stop)
      .def_property_readonly("producer_address", &PyRoot::producer_address)
      .def_property_readonly("address", &PyRoot::address);
}

}  // namespace deltacast::python
