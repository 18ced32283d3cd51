// FedAvg from Python: the C++ server and client runtimes, with the client's
// Trainer implemented in Python (xsilo.fl.Trainer subclasses this one).
#include <pybind11/stl.h>

#include <cmath>

#include "common.h"
#include "xsilo/fl/fedavg.h"

namespace xsilo::python {

namespace {

using fl::EvalResult;
using fl::LocalWork;
using fl::TrainResult;

// A Python exception raised inside a trainer call, as a Status: ValueError
// and TypeError are the trainer's InvalidArgument, everything else Internal.
Status FromPythonError(py::error_already_set& e, const char* call) {
  std::string what = std::string("python trainer ") + call + " raised " + e.what();
  if (e.matches(PyExc_ValueError) || e.matches(PyExc_TypeError)) return InvalidArgument(what);
  return Internal(what);
}

// The runtime calls these from the thread that runs FedAvgClient::Run (the
// GIL released there); each call takes the GIL and dispatches to the
// Python subclass's method.
class PyTrainer : public fl::Trainer {
 public:
  Result<TensorMap> GetParameters() override {
    py::gil_scoped_acquire gil;
    try {
      py::object out = Method("get_parameters")();
      return TensorsFromPython(out);
    } catch (py::error_already_set& e) {
      return FromPythonError(e, "get_parameters");
    } catch (std::exception& e) {
      return InvalidArgument(std::string("python trainer get_parameters: ") + e.what());
    }
  }

  Status SetParameters(const TensorMap& parameters) override {
    py::gil_scoped_acquire gil;
    try {
      Method("set_parameters")(TensorsToPython(parameters));
      return Status::OK();
    } catch (py::error_already_set& e) {
      return FromPythonError(e, "set_parameters");
    }
  }

  Result<TrainResult> Train(const LocalWork& work) override {
    py::gil_scoped_acquire gil;
    try {
      py::object out = Method("train")(work.epochs, work.steps);
      TrainResult r;
      auto d = out.cast<py::dict>();
      if (!d.contains("samples"))
        return InvalidArgument("train() must return a dict with 'samples'");
      r.samples = d["samples"].cast<uint64_t>();
      if (r.samples == 0) return InvalidArgument("train() returned samples = 0");
      for (auto item : d) {
        std::string key = py::str(item.first);
        if (key != "samples") r.metrics[key] = item.second.cast<double>();
      }
      return r;
    } catch (py::error_already_set& e) {
      return FromPythonError(e, "train");
    } catch (py::cast_error& e) {
      return InvalidArgument(std::string("train() must return {'samples': int, metric: float}: ") +
                             e.what());
    }
  }

  Result<EvalResult> Evaluate() override {
    py::gil_scoped_acquire gil;
    try {
      auto d = Method("evaluate")().cast<py::dict>();
      EvalResult r;
      r.loss = d.contains("loss") ? d["loss"].cast<double>() : NAN;
      r.accuracy = d.contains("accuracy") ? d["accuracy"].cast<double>() : NAN;
      r.samples = d.contains("samples") ? d["samples"].cast<uint64_t>() : 0;
      return r;
    } catch (py::error_already_set& e) {
      return FromPythonError(e, "evaluate");
    } catch (py::cast_error& e) {
      return InvalidArgument(
          std::string(
              "evaluate() must return {'loss': float, 'accuracy': float, 'samples': int}: ") +
          e.what());
    }
  }

 private:
  py::function Method(const char* name) {
    py::function f = py::get_override(static_cast<const fl::Trainer*>(this), name);
    if (!f) {
      throw py::type_error(std::string("xsilo.fl.Trainer subclass must define ") + name + "()");
    }
    return f;
  }
};

py::dict RoundDict(const fl::RoundReport& r) {
  py::dict d;
  d["round"] = r.round;
  d["selected"] = r.selected;
  d["received"] = r.received;
  d["required"] = r.required;
  d["discarded"] = r.discarded;
  d["completed"] = r.completed;
  d["contributors"] = r.contributors;
  d["train_loss"] = r.train_loss;
  d["eval_loss"] = r.eval_loss;
  d["eval_accuracy"] = r.eval_accuracy;
  d["eval_samples"] = r.eval_samples;
  d["bytes_sent"] = r.bytes_sent;
  d["bytes_received"] = r.bytes_received;
  d["seconds"] = r.seconds;
  d["started_unix_s"] = r.started_unix_s;
  d["broadcast_s"] = r.broadcast_s;
  py::list timeline;
  for (const auto& t : r.timeline) {
    py::dict u;
    u["rank"] = t.rank;
    u["model_at_s"] = t.model_at_s;
    u["train_s"] = t.train_s;
    u["sent_at_s"] = t.sent_at_s;
    u["arrived_s"] = t.arrived_s;
    timeline.append(u);
  }
  d["timeline"] = timeline;
  return d;
}

Duration Seconds(double s, const char* what) {
  if (!std::isfinite(s) || s <= 0) {
    throw py::value_error(std::string(what) + " must be a positive number of seconds");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(s * 1000.0)));
}

}  // namespace

void RegisterFl(py::module_& m) {
  py::class_<fl::Trainer, PyTrainer>(m, "_Trainer").def(py::init<>());

  m.def(
      "_run_server",
      [](PyTransport& transport, const py::dict& initial_model, uint64_t rounds,
         uint32_t clients_per_round, double quorum_fraction, uint32_t quorum_count,
         double round_deadline, double finish_deadline, uint64_t local_steps, uint64_t local_epochs,
         uint32_t max_failed_rounds, uint64_t seed, bool finish, py::object on_round,
         std::string checkpoint_dir) {
        fl::ServerOptions o;
        o.rounds = rounds;
        o.clients_per_round = clients_per_round;
        if (!(quorum_fraction >= 0 && quorum_fraction <= 1)) {
          throw py::value_error("quorum fraction must lie in [0, 1]");
        }
        o.quorum_fraction = quorum_fraction;
        o.quorum_count = quorum_count;
        o.round_deadline = Seconds(round_deadline, "round_deadline");
        o.finish_deadline = Seconds(finish_deadline, "finish_deadline");
        o.local_work = LocalWork{local_epochs, local_steps};
        o.max_failed_rounds = max_failed_rounds;
        o.seed = seed;
        o.finish = finish;
        o.checkpoint_dir = std::move(checkpoint_dir);
        if (!on_round.is_none()) {
          o.on_round = [on_round](const fl::RoundReport& r) {
            py::gil_scoped_acquire gil;
            try {
              on_round(RoundDict(r));
            } catch (py::error_already_set& e) {
              // A reporting callback must not kill the job; say so once per round.
              PySys_WriteStderr("xsilo: on_round raised %s\n", e.what());
            }
          };
        }
        TensorMap model = TensorsFromPython(initial_model);
        Transport& t = transport.get();
        Result<fl::JobReport> job = Cancelled("");
        {
          py::gil_scoped_release release;
          fl::FedAvgServer server(t, std::move(o));
          job = server.Run(std::move(model));
        }
        fl::JobReport report = Check(std::move(job));
        py::dict out;
        py::list round_list;
        for (const auto& r : report.rounds) round_list.append(RoundDict(r));
        out["rounds"] = round_list;
        py::dict fin;
        fin["clients"] = report.final_evaluation.clients;
        fin["loss"] = report.final_evaluation.loss;
        fin["accuracy"] = report.final_evaluation.accuracy;
        fin["samples"] = report.final_evaluation.samples;
        out["final_evaluation"] = fin;
        out["late_updates_discarded"] = report.late_updates_discarded;
        out["model"] = TensorsToPython(report.model);
        return out;
      },
      py::arg("transport"), py::arg("initial_model"), py::arg("rounds"),
      py::arg("clients_per_round"), py::arg("quorum_fraction"), py::arg("quorum_count"),
      py::arg("round_deadline"), py::arg("finish_deadline"), py::arg("local_steps"),
      py::arg("local_epochs"), py::arg("max_failed_rounds"), py::arg("seed"), py::arg("finish"),
      py::arg("on_round"), py::arg("checkpoint_dir"));

  m.def(
      "_run_client",
      [](PyTransport& transport, fl::Trainer& trainer, double idle_timeout, double send_timeout) {
        fl::ClientOptions o;
        o.idle_timeout = Seconds(idle_timeout, "idle_timeout");
        o.send_timeout = Seconds(send_timeout, "send_timeout");
        Transport& t = transport.get();
        Result<fl::ClientReport> got = Cancelled("");
        {
          py::gil_scoped_release release;
          fl::FedAvgClient client(t, trainer, o);
          got = client.Run();
        }
        fl::ClientReport r = Check(std::move(got));
        py::dict out;
        out["rounds_trained"] = r.rounds_trained;
        out["stale_models_skipped"] = r.stale_models_skipped;
        out["failed_sends"] = r.failed_sends;
        out["finished"] = r.finished;
        py::dict fin;
        fin["loss"] = r.final_evaluation.loss;
        fin["accuracy"] = r.final_evaluation.accuracy;
        fin["samples"] = r.final_evaluation.samples;
        out["final_evaluation"] = fin;
        return out;
      },
      py::arg("transport"), py::arg("trainer"), py::arg("idle_timeout"), py::arg("send_timeout"));
}

}  // namespace xsilo::python
