// deltacast._deltacast: the Python binding of the public API (include/deltacast/).
// Tensors cross by DLPack, in place; the GIL is released while bytes move; the
// engine's callbacks reach Python on one dispatcher thread. The Python package
// (python/deltacast/__init__.py) adds conveniences on top.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <cstring>
#include <memory>
#include <optional>

#include "binding_util.h"
#include "borrowed_tensor.h"
#include "deltacast/deltacast.h"
#include "dispatcher.h"

namespace py = pybind11;

namespace deltacast::python {
namespace {

// The trainer's end over live tensors: it keeps a copy of the version the fleet
// holds, so publish() sends what changed in the tensors since the last commit.
class PySource {
 public:
  PySource(const Config& config, py::handle tensors, SourceOptions options)
      : live_(BorrowAll(tensors)) {
    for (const auto& t : live_) {
      const TensorView& v = t->view();
      held_bytes_.emplace_back(v.bytes.begin(), v.bytes.end());
      held_.push_back({v.spec, held_bytes_.back()});
    }
    Result<std::unique_ptr<Source>> source = Status::Internal("not started");
    {
      py::gil_scoped_release released;
      source = Source::Start(config, std::move(options));
      // Nodes that join are checked against the version it starts with.
      if (source.ok()) {
        Status announced = (*source)->SetVersion(held_);
        if (!announced.ok()) source = announced;
      }
    }
    source_ = Take(std::move(source));
  }
  ~PySource() {
    py::gil_scoped_release released;
    if (source_) source_->Stop();
  }

  // Publishes the tensors' current bytes as the next version. The caller must not
  // change them until this returns.
  PublishReport Publish() {
    Result<PublishReport> report = Status::Internal("not run");
    {
      py::gil_scoped_release released;
      const std::vector<TensorView> live = Views(live_);
      report = source_->Publish(held_, live);
      if (report.ok() && report->committed) {
        for (size_t i = 0; i < live.size(); ++i) {
          std::memcpy(held_[i].bytes.data(), live[i].bytes.data(), live[i].bytes.size());
        }
      }
    }
    return Take(std::move(report));
  }

  PublishReport PublishCheckpoints(const std::filesystem::path& base,
                                   const std::filesystem::path& target,
                                   const std::filesystem::path& serving) {
    Result<PublishReport> report = Status::Internal("not run");
    {
      py::gil_scoped_release released;
      report = source_->PublishCheckpoints(base, target, serving);
    }
    return Take(std::move(report));
  }

  void Stop() {
    py::gil_scoped_release released;
    if (source_) source_->Stop();
  }
  std::string address() const { return source_->listen_address(); }
  std::string version() const { return source_->version(); }

 private:
  std::vector<std::unique_ptr<BorrowedTensor>> live_;
  std::vector<std::vector<std::byte>> held_bytes_;  // the last committed version
  std::vector<TensorView> held_;
  std::unique_ptr<Source> source_;
};

// A receiver over live tensors (patched in place) or a checkpoint directory.
class PyNode {
 public:
  PyNode(const Config& config, NodeOptions options, py::object tensors, py::object gpus,
         py::object on_commit, py::object pause, py::object resume)
      : on_commit_(std::move(on_commit)), pause_(std::move(pause)), resume_(std::move(resume)) {
    if (!on_commit_.is_none()) {
      options.on_commit = [this](const CommitEvent& e) {
        dispatcher_.Post([this, e] { on_commit_(e.version, e.changed_tensors); });
      };
    }
    // The engine's hooks run on the node's hook thread, which waits for the GIL: the
    // pause's timeout covers that wait too. They hold `this`, not the callables, so
    // no Python object is released on a thread without the GIL.
    if (!pause_.is_none()) {
      options.pause_engine = [this]() -> Status {
        py::gil_scoped_acquire gil;
        try {
          pause_();
          return Status::Ok();
        } catch (py::error_already_set& e) {
          return Status::Aborted(std::string("pause raised ") + e.what());
        }
      };
    }
    if (!resume_.is_none()) {
      options.resume_engine = [this] {
        py::gil_scoped_acquire gil;
        try {
          resume_();
        } catch (py::error_already_set& e) {
          e.discard_as_unraisable("deltacast Node resume hook");
        }
      };
    }
    Result<std::unique_ptr<Node>> node = Status::Internal("not started");
    if (!gpus.is_none()) {
      std::vector<GpuWeights> weights = BorrowGpus(gpus);
      py::gil_scoped_release released;
      node = Node::StartOnGpus(config, std::move(options), std::move(weights));
    } else if (py::isinstance<py::str>(tensors) || py::hasattr(tensors, "__fspath__")) {
      const std::filesystem::path dir = tensors.cast<std::filesystem::path>();
      py::gil_scoped_release released;
      node = Node::StartOnCheckpoint(config, std::move(options), dir);
    } else {
      tensors_ = BorrowAll(tensors);
      py::gil_scoped_release released;
      node = Node::Start(config, std::move(options), Views(tensors_));
    }
    node_ = Take(std::move(node));
  }
  ~PyNode() { Stop(); }

  void Stop() {
    py::gil_scoped_release released;
    if (node_) node_->Stop();
    dispatcher_.Stop();  // after the node: no callback is queued any more
  }

  // (layout path, tensors) per GPU: the tensors of one GPU all lie on one CUDA
  // device, or all in host memory (device -1).
  std::vector<GpuWeights> BorrowGpus(py::handle gpus) {
    std::vector<GpuWeights> out;
    for (py::handle item : gpus) {
      auto pair = item.cast<py::tuple>();
      if (pair.size() != 2)
        Raise(Status::InvalidArgument("gpus: expected (layout, tensors) pairs"));
      GpuWeights gpu;
      gpu.layout = pair[0].cast<std::filesystem::path>();
      auto borrowed = BorrowAll(pair[1], /*allow_cuda=*/true);
      gpu.device = borrowed.front()->device();
      gpu.stream = borrowed.front()->stream();  // what their producer ordered writes with
      for (const auto& t : borrowed) {
        if (t->device() != gpu.device) {
          Raise(Status::InvalidArgument("gpus[" + std::to_string(out.size()) + "]: tensor '" +
                                        t->view().spec.name + "' lies on another device than '" +
                                        borrowed.front()->view().spec.name + "'"));
        }
        gpu.parameters.push_back(t->view());
      }
      for (auto& t : borrowed) tensors_.push_back(std::move(t));
      out.push_back(std::move(gpu));
    }
    if (out.empty()) Raise(Status::InvalidArgument("gpus: none given"));
    return out;
  }
  NodeStats stats() const { return node_->stats(); }
  std::string address() const { return node_->listen_address(); }
  void WaitForJoin(double timeout_seconds) const {
    Status status;
    {
      py::gil_scoped_release released;
      status = node_->WaitForJoin(
          std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000)));
    }
    if (!status.ok()) Raise(status);
  }
  VerifyReport Verify() {
    Result<VerifyReport> report = Status::Internal("not run");
    {
      py::gil_scoped_release released;
      report = node_->Verify();
    }
    return Take(std::move(report));
  }

 private:
  py::object on_commit_, pause_, resume_;
  Dispatcher dispatcher_;
  std::vector<std::unique_ptr<BorrowedTensor>> tensors_;  // held until the node is gone
  std::unique_ptr<Node> node_;
};

}  // namespace
}  // namespace deltacast::python

PYBIND11_MODULE(_deltacast, m) {
  using namespace deltacast;
  using namespace deltacast::python;
  m.doc() = "deltacast: LLM weight updates to many inference nodes, bit for bit";
  static py::exception<std::runtime_error> error(m, "Error");
  SetErrorType(error.ptr());

  py::class_<Config>(m, "Config", "A cluster config (TOML): nodes, addresses, tree tuning.")
      .def_static(
          "load", [](const std::filesystem::path& path) { return Take(Config::Load(path)); },
          py::arg("path"), "Loads and validates a config file.")
      .def_static(
          "parse",
          [](const std::string& toml, const std::string& name) {
            return Take(Config::Parse(toml, name));
          },
          py::arg("toml"), py::arg("name") = "config", "Parses TOML text.")
      .def_property_readonly("source", &Config::source)
      .def_property_readonly("receivers", &Config::receivers)
      .def("token_from_environment", [](const Config& c) { return Take(c.TokenFromEnvironment()); })
      .def("describe_plan", [](const Config& c) { return Take(c.DescribePlan()); });

  py::class_<NodeReport>(m, "NodeReport")
      .def_readonly("node", &NodeReport::node)
      .def_readonly("delta_bytes", &NodeReport::delta_bytes)
      .def_readonly("prepared_seconds", &NodeReport::prepared_seconds)
      .def_readonly("partitions_applied", &NodeReport::partitions_applied)
      .def_readonly("receive_seconds", &NodeReport::receive_seconds)
      .def_readonly("check_seconds", &NodeReport::check_seconds)
      .def_readonly("write_seconds", &NodeReport::write_seconds)
      .def_readonly("apply_cpu_seconds", &NodeReport::apply_cpu_seconds)
      .def_readonly("cpu_wait_seconds", &NodeReport::cpu_wait_seconds)
      .def_readonly("disk_wait_seconds", &NodeReport::disk_wait_seconds)
      .def_readonly("pause_seconds", &NodeReport::pause_seconds)
      .def_readonly("prepared_hold_seconds", &NodeReport::prepared_hold_seconds)
      .def("__repr__", [](const NodeReport& n) {
        return "<NodeReport " + n.node + " " + std::to_string(n.delta_bytes) + " B>";
      });

  py::class_<PublishReport>(m, "PublishReport", "What one publish did.")
      .def_readonly("committed", &PublishReport::committed)
      .def_readonly("abort_reason", &PublishReport::abort_reason)
      .def_readonly("refit_id", &PublishReport::refit_id)
      .def_readonly("base_version", &PublishReport::base_version)
      .def_readonly("bf16_base_version", &PublishReport::bf16_base_version)
      .def_readonly("bf16_target_version", &PublishReport::bf16_target_version)
      .def_readonly("target_version", &PublishReport::target_version)
      .def_readonly("delta_bytes", &PublishReport::delta_bytes)
      .def_readonly("checkpoint_bytes", &PublishReport::checkpoint_bytes)
      .def_readonly("chunks", &PublishReport::chunks)
      .def_readonly("seconds", &PublishReport::seconds)
      .def_readonly("call_to_first_chunk_seconds", &PublishReport::call_to_first_chunk_seconds)
      .def_readonly("nodes_decided", &PublishReport::nodes_decided)
      .def_readonly("nodes", &PublishReport::nodes)
      .def("__repr__", [](const PublishReport& r) {
        return std::string("<PublishReport ") + (r.committed ? "committed " : "aborted ") +
               r.target_version.substr(0, 12) + ", " + std::to_string(r.delta_bytes) + " B>";
      });

  py::class_<StripeStats>(m, "StripeStats",
                          "One stripe's share of a node's traffic (NodeStats.stripes).")
      .def_readonly("chunks", &StripeStats::chunks)
      .def_readonly("chunk_bytes_resent", &StripeStats::chunk_bytes_resent)
      .def_readonly("parent_joins", &StripeStats::parent_joins)
      .def("__repr__", [](const StripeStats& s) {
        return "<StripeStats " + std::to_string(s.chunks) + " chunks, " +
               std::to_string(s.parent_joins) + " joins>";
      });

  py::class_<NodeStats>(m, "NodeStats")
      .def_readonly("refits_committed", &NodeStats::refits_committed)
      .def_readonly("refits_aborted", &NodeStats::refits_aborted)
      .def_readonly("chunk_bytes_received", &NodeStats::chunk_bytes_received)
      .def_readonly("chunk_bytes_resent", &NodeStats::chunk_bytes_resent)
      .def_readonly("parent_joins", &NodeStats::parent_joins)
      .def_readonly("partitions_repaired", &NodeStats::partitions_repaired)
      .def_readonly("partitions_caught_up", &NodeStats::partitions_caught_up)
      .def_readonly("deltas_caught_up", &NodeStats::deltas_caught_up)
      .def_readonly("last_pause_seconds", &NodeStats::last_pause_seconds)
      .def_readonly("last_prepared_hold_seconds", &NodeStats::last_prepared_hold_seconds)
      .def_readonly("pause_seconds_total", &NodeStats::pause_seconds_total)
      .def_readonly("version", &NodeStats::version)
      .def_readonly("stripes", &NodeStats::stripes);

  py::class_<TensorMismatch>(m, "TensorMismatch")
      .def_readonly("tensor", &TensorMismatch::tensor)
      .def_readonly("what", &TensorMismatch::what)
      .def("__repr__", [](const TensorMismatch& t) {
        return "<TensorMismatch " + t.tensor + ": " + t.what + ">";
      });

  py::class_<VerifyReport>(m, "VerifyReport",
                           "Node.verify(): the weights against the active version.")
      .def_readonly("version", &VerifyReport::version)
      .def_readonly("tensors", &VerifyReport::tensors)
      .def_readonly("partitions", &VerifyReport::partitions)
      .def_readonly("mismatches", &VerifyReport::mismatches)
      .def_readonly("summary", &VerifyReport::summary)
      .def_property_readonly("ok", &VerifyReport::ok)
      .def("__repr__", [](const VerifyReport& r) {
        return "<VerifyReport " + r.version.substr(0, 12) + " " + r.summary + ">";
      });

  py::class_<PySource>(m, "_Source")
      .def(py::init([](const Config& config, py::handle tensors, const std::string& token,
                       const std::string& state_dir, size_t keep_deltas, bool context_mode,
                       size_t encode_threads) {
             SourceOptions o;
             o.token = token;
             o.state_dir = state_dir;
             o.keep_deltas = keep_deltas;
             o.context_mode = context_mode;
             o.encode_threads = encode_threads;
             return std::make_unique<PySource>(config, tensors, std::move(o));
           }),
           py::arg("config"), py::arg("tensors"), py::arg("token"), py::arg("state_dir") = "",
           py::arg("keep_deltas") = 4, py::arg("context_mode") = false,
           py::arg("encode_threads") = 0)
      .def("publish", &PySource::Publish)
      .def("publish_checkpoints", &PySource::PublishCheckpoints, py::arg("base"), py::arg("new"),
           py::arg("serving") = std::filesystem::path())
      .def("stop", &PySource::Stop)
      .def_property_readonly("address", &PySource::address)
      .def_property_readonly("version", &PySource::version);

  py::class_<PyNode>(m, "_Node")
      .def(py::init([](const Config& config, const std::string& node_id, const std::string& token,
                       py::object tensors, py::object on_commit, size_t apply_threads,
                       py::object gpus, const std::string& apply_mode, py::object pause,
                       py::object resume, double hook_timeout, const std::string& checkpoint) {
             NodeOptions o;
             o.node_id = node_id;
             o.token = token;
             o.apply_threads = apply_threads;
             o.apply_mode = apply_mode;
             o.checkpoint = checkpoint;
             o.hook_timeout = std::chrono::milliseconds(static_cast<int64_t>(hook_timeout * 1000));
             return std::make_unique<PyNode>(config, std::move(o), std::move(tensors),
                                             std::move(gpus), std::move(on_commit),
                                             std::move(pause), std::move(resume));
           }),
           py::arg("config"), py::arg("node_id"), py::arg("token"), py::arg("tensors"),
           py::arg("on_commit") = py::none(), py::arg("apply_threads") = 0,
           py::arg("gpus") = py::none(), py::arg("apply_mode") = "", py::arg("pause") = py::none(),
           py::arg("resume") = py::none(), py::arg("hook_timeout") = 10.0,
           py::arg("checkpoint") = "")
      .def("stats", &PyNode::stats)
      .def("wait_for_join", &PyNode::WaitForJoin, py::arg("timeout"))
      .def("verify", &PyNode::Verify)
      .def("stop", &PyNode::Stop)
      .def_property_readonly("address", &PyNode::address);

  BindProducers(m);

  m.def(
      "_engine_layouts",
      [](const std::filesystem::path& config, const std::string& engine, uint64_t tp, uint64_t dp,
         uint64_t ep, const std::filesystem::path& out, const std::filesystem::path& canonical) {
        EngineLayoutOptions o;
        o.config = config;
        o.canonical = canonical;
        o.out_dir = out;
        o.engine = engine;
        o.tp = tp;
        o.dp = dp;
        o.ep = ep;
        return Take(WriteEngineLayouts(o));
      },
      py::arg("config"), py::arg("engine"), py::arg("tp"), py::arg("dp"), py::arg("ep"),
      py::arg("out"), py::arg("canonical"));

  m.def(
      "set_log_level",
      [](const std::string& level) {
        static const std::pair<const char*, LogLevel> kLevels[] = {{"debug", LogLevel::kDebug},
                                                                   {"info", LogLevel::kInfo},
                                                                   {"warn", LogLevel::kWarn},
                                                                   {"error", LogLevel::kError},
                                                                   {"off", LogLevel::kOff}};
        for (const auto& [name, l] : kLevels) {
          if (level == name) return SetLogLevel(l);
        }
        Raise(
            Status::InvalidArgument("log level '" + level + "': debug, info, warn, error or off"));
      },
      py::arg("level"));
}
