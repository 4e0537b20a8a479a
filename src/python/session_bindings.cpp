// qtrain._qtrain.Session: the engine's TrainingSession (train/session.h) for Python. The qtrain
// package's Trainer wraps it (python/qtrain/trainer.py). Every call that runs the model releases the
// GIL; rank 0's JSONL lines reach the Python listener as they are written (with the GIL taken for
// it), and an exception the listener raises is re-raised when the call returns.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "core/error.h"
#include "model/lora.h"
#include "model/parameters.h"
#include "python/bindings.h"
#include "train/run_context.h"
#include "train/session.h"
#include "train/train_options.h"

namespace nb = nanobind;

namespace qtrain::python {

namespace {

using Tokens = nb::ndarray<const int32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

std::string command_line_of(const std::vector<std::string>& args) {
    std::string cmd = "python: qtrain.Trainer";
    for (const std::string& a : args) cmd += " " + a;
    return cmd;
}

nb::dict plan_dict(const CheckedPlan& checked) {
    nb::list entries;
    for (const MemoryPlan::Entry& e : checked.plan.entries) {
        nb::dict d;
        d["category"] = e.category;
        d["device_bytes"] = e.device_bytes;
        d["pinned_bytes"] = e.pinned_bytes;
        entries.append(d);
    }
    nb::dict out;
    out["device"] = checked.plan.device;
    out["entries"] = entries;
    out["total_device_bytes"] = checked.plan.total_device();
    out["total_pinned_bytes"] = checked.plan.total_pinned();
    out["device_limit_bytes"] = checked.limit;
    out["host_limit_bytes"] = checked.host_limit;
    return out;
}

// The memory plan these flags would train with (per rank), checked against the limits: raises as the
// command line would when it does not fit. Allocates nothing.
nb::dict memory_plan_of(const std::vector<std::string>& args) {
    TrainOptions o = train_options_from_args(args);
    o.plan_only = true;
    const RunContext ctx = make_run_context(o, command_line_of(args));
    return plan_dict(ctx.plan);
}

class Session {
public:
    Session(const std::vector<std::string>& args, nb::object listener) : listener_(std::move(listener)) {
        TrainOptions o = train_options_from_args(args);
        QT_CHECK(!o.plan_only, "plan_only: use qtrain.memory_plan(**options) for the plan alone");
        QT_CHECK(o.export_checkpoint.empty(), "export_checkpoint: use qtrain.train(export_checkpoint=..., out_dir=...)");
        nb::gil_scoped_release released;
        RunContext ctx = make_run_context(o, command_line_of(args), nullptr, nullptr, {}, /*need_train_file=*/false);
        if (!listener_.is_none()) {
            ctx.log_listener = [this](const std::string& line) {
                nb::gil_scoped_acquire acquired;
                if (listener_error_) return;  // the first error is the one re-raised
                try {
                    listener_(line);
                } catch (nb::python_error& e) {
                    listener_error_ = std::make_unique<nb::python_error>(std::move(e));
                }
            };
        }
        session_ = std::make_unique<TrainingSession>(std::move(ctx));
        // (opening wrote the first log lines: options, system, model, datasets, memory)
    }
    // The open session's first lines went to the listener while the GIL was released; now re-raise
    // what it raised, as after every call.
    void check_listener() {
        if (listener_error_) {
            std::unique_ptr<nb::python_error> e = std::move(listener_error_);
            e->restore();
            throw nb::python_error();
        }
    }

    nb::dict step(std::optional<Tokens> inputs, std::optional<Tokens> targets, std::optional<float> lr) {
        open();
        QT_CHECK(inputs.has_value() == targets.has_value(), "step(): give both inputs and targets, or neither");
        StepTokens tokens;
        if (inputs) tokens = step_tokens(*inputs, *targets, "step()");
        StepReport r;
        {
            nb::gil_scoped_release released;
            r = session_->step(inputs ? &tokens : nullptr, lr);
        }
        check_listener();
        nb::dict d;
        d["step"] = r.step;
        d["loss"] = r.loss;
        d["grad_norm"] = r.grad_norm;
        d["lr"] = r.lr;
        d["ms"] = r.ms;
        d["tokens"] = r.tokens;
        d["tokens_per_s"] = r.ms > 0 ? r.tokens / (r.ms / 1000.0) : 0.0;
        d["applied"] = r.applied;
        d["evaluated"] = r.evaluated;
        return d;
    }

    nb::dict evaluate() {
        open();
        EvalResult r;
        {
            nb::gil_scoped_release released;
            r = session_->evaluate();
        }
        check_listener();
        nb::dict d;
        d["loss"] = r.loss;
        d["tokens"] = r.tokens;
        return d;
    }

    std::string save_checkpoint() {
        open();
        std::string dir;
        {
            nb::gil_scoped_release released;
            dir = session_->save_checkpoint();
        }
        check_listener();
        return dir;
    }

    void load_checkpoint(const std::string& dir) {
        open();
        {
            nb::gil_scoped_release released;
            session_->load_checkpoint(dir);
        }
        check_listener();
    }

    void export_model(const std::string& dir) {
        open();
        {
            nb::gil_scoped_release released;
            session_->export_model(dir);
        }
        check_listener();
    }

    int finish() {
        open();
        int code;
        {
            nb::gil_scoped_release released;
            code = session_->finish();
        }
        check_listener();
        return code;
    }

    // (name, shape, trainable) of every tensor the Trainer can read: the model's parameters in the
    // canonical order (model/parameters.h), then with LoRA (--lora-rank) the adapters by their PEFT
    // names (model/lora.h). Under LoRA the base is frozen (not trainable: no gradient) and only the
    // adapters train.
    std::vector<std::tuple<std::string, std::vector<int64_t>, bool>> tensors() const {
        open();
        std::vector<std::tuple<std::string, std::vector<int64_t>, bool>> out;
        for (const auto& [spec, trainable] : readable()) out.emplace_back(spec.name, spec.shape, trainable);
        return out;
    }

    nb::ndarray<nb::numpy, float> read(const std::string& name, bool gradient) {
        open();
        const std::vector<std::pair<ParamSpec, bool>> all = readable();
        const std::pair<ParamSpec, bool>* found = nullptr;
        for (const auto& t : all)
            if (t.first.name == name) found = &t;
        QT_CHECK(found, "no parameter named '", name, "' (Trainer.parameter_names() lists them)");
        // refused here, not by the model: a model's error would end the session (train/session.h)
        QT_CHECK(!gradient || found->second, "'", name, "' is frozen under LoRA (--lora-rank=", lora().rank,
                 "): it has no gradient (Trainer.trainable_parameter_names() lists the tensors that have one)");
        const ParamSpec& spec = found->first;
        auto* values = new std::vector<float>();
        {
            nb::gil_scoped_release released;
            *values = session_->read_tensor(name, gradient ? IModel::TensorKind::Gradient : IModel::TensorKind::Weights);
        }
        nb::capsule owner(values, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
        std::vector<size_t> shape(spec.shape.begin(), spec.shape.end());
        return nb::ndarray<nb::numpy, float>(values->data(), shape.size(), shape.data(), owner);
    }

    // The gradients step(inputs, targets) would apply, left readable (TrainingSession::compute_gradients).
    void compute_gradients(Tokens inputs, Tokens targets) {
        open();
        // the GPU model clears only the adapters' gradients (IModel::zero_gradients); refused here, as
        // the model's refusal would end the session
        QT_CHECK(session_->context().device != "cuda" || lora().enabled(),
                 "compute_gradients(): --device=cuda supports it with LoRA (--lora-rank) only, not for the full model yet");
        const StepTokens tokens = step_tokens(inputs, targets, "compute_gradients()");
        {
            nb::gil_scoped_release released;
            session_->compute_gradients(tokens);
        }
        check_listener();
    }

    // (each checks that the session is open: a closed one has no context, and reading it crashed)
    int next_step() const {
        open();
        return session_->next_step();
    }
    int steps() const {
        open();
        return session_->context().options.steps;
    }
    int world() const {
        open();
        return session_->context().world;
    }
    std::string device() const {
        open();
        return session_->context().device;
    }
    std::string options_json() const {
        open();
        return session_->context().options.to_json();
    }
    nb::dict memory_plan() const {
        open();
        return plan_dict(session_->context().plan);
    }
    int seq_len() const {
        open();
        return session_->context().options.seq_len;
    }
    int vocab_size() const {
        open();
        return session_->config().vocab_size;
    }
    int64_t rows_per_step() const {
        open();
        const TrainOptions& o = session_->context().options;
        return static_cast<int64_t>(o.grad_accumulation) * session_->context().world * o.batch_size;
    }

    void close() {
        nb::gil_scoped_release released;
        session_.reset();
    }

private:
    void open() const { QT_CHECK(session_, "the Trainer is closed"); }
    // The arrays of a step (checked: shapes, --seq-len columns, ids in range) as StepTokens.
    StepTokens step_tokens(const Tokens& inputs, const Tokens& targets, const char* where) const {
        const int T = session_->context().options.seq_len;
        QT_CHECK(inputs.shape(0) == targets.shape(0) && inputs.shape(1) == targets.shape(1), where,
                 ": inputs and targets must have the same shape, got (", inputs.shape(0), ", ", inputs.shape(1),
                 ") and (", targets.shape(0), ", ", targets.shape(1), ")");
        QT_CHECK(static_cast<int64_t>(inputs.shape(1)) == T, where, ": arrays of --seq-len=", T,
                 " columns expected, got ", inputs.shape(1));
        check_token_range(inputs.data(), inputs.size(), where, "inputs", 0);
        check_token_range(targets.data(), targets.size(), where, "targets", -1);
        return {inputs.data(), targets.data(), static_cast<int64_t>(inputs.shape(0))};
    }
    const LoraOptions& lora() const { return session_->context().model_options.lora; }
    // Every readable tensor and whether it trains (tensors()).
    std::vector<std::pair<ParamSpec, bool>> readable() const {
        std::vector<std::pair<ParamSpec, bool>> out;
        const bool frozen_base = lora().enabled();
        for (const ParamSpec& s : model_parameters(session_->config())) out.emplace_back(s, !frozen_base);
        if (frozen_base) {
            for (const ParamSpec& s : lora_parameters(session_->config(), lora())) out.emplace_back(s, true);
            // --train-also's base tensors train beside the adapters, under the names PEFT saves them by
            // ("base_model.model.model.norm.weight"): the model's gradients and moments are kept there
            for (const ParamSpec& s : lora_train_also_parameters(session_->config(), lora())) out.emplace_back(s, true);
        }
        return out;
    }
    void check_token_range(const int32_t* data, size_t n, const char* where, const char* what, int32_t lowest) const {
        const int vocab = session_->config().vocab_size;
        for (size_t i = 0; i < n; ++i)
            QT_CHECK(data[i] >= lowest && data[i] < vocab, where, ": ", what, "[", i, "] = ", data[i],
                     " is outside [", lowest, ", ", vocab, ") (the model's vocab_size", lowest < 0 ? "; -1 = no loss" : "",
                     ")");
    }

    nb::object listener_;
    std::unique_ptr<nb::python_error> listener_error_;
    std::unique_ptr<TrainingSession> session_;
};

}  // namespace

void bind_session(nb::module_& m) {
    m.def("memory_plan", &memory_plan_of, nb::arg("args"),
          "The memory plan (per rank) these `train` flags would train with, checked against the limits.");
    nb::class_<Session>(m, "Session", "A training session: the engine's calls, driven from Python.")
        .def(nb::init<const std::vector<std::string>&, nb::object>(), nb::arg("args"), nb::arg("listener").none(),
             "Opens a run with these `train` flags: plans, allocates, loads, initialises or resumes. "
             "`listener(line)` gets every JSONL log line as it is written.")
        .def("check_listener", &Session::check_listener)
        // noconvert: nanobind would otherwise cast any array to int32 as numpy's astype does (2**32 + 5
        // becomes 5, 2.7 becomes 2); qtrain.Trainer.step checks dtype, shape and range first, then converts
        .def("step", &Session::step, nb::arg("inputs").none().noconvert() = nb::none(),
             nb::arg("targets").none().noconvert() = nb::none(), nb::arg("lr").none() = nb::none(),
             "One optimizer step; returns loss, grad_norm, lr, ms, tokens, tokens_per_s, applied, evaluated.")
        .def("evaluate", &Session::evaluate, "Evaluates on --eval-file; returns loss and tokens.")
        .def("save_checkpoint", &Session::save_checkpoint, "Writes a checkpoint into --checkpoint-dir; returns it.")
        .def("load_checkpoint", &Session::load_checkpoint, nb::arg("dir"),
             "Loads a checkpoint directory (verified, and checked to be this run's).")
        .def("export_model", &Session::export_model, nb::arg("dir"), "Writes the HF model into `dir`.")
        .def("finish", &Session::finish, "The command line's end: final evaluation, export to --out-dir, done.")
        .def("tensors", &Session::tensors,
             "(name, shape, trainable) of every tensor: the parameters, then with LoRA the adapters (PEFT names); "
             "under LoRA the base is frozen.")
        .def("compute_gradients", &Session::compute_gradients, nb::arg("inputs").noconvert(),
             nb::arg("targets").noconvert(),
             "The gradients a step on these tokens would apply, left to read (no update; the next step clears them).")
        .def("read", &Session::read, nb::arg("name"), nb::arg("gradient") = false,
             "A parameter (or its accumulated gradient) as a float32 numpy array.")
        .def_prop_ro("next_step", &Session::next_step)
        .def_prop_ro("steps", &Session::steps)
        .def_prop_ro("world", &Session::world)
        .def_prop_ro("device", &Session::device)
        .def_prop_ro("rows_per_step", &Session::rows_per_step)
        .def_prop_ro("seq_len", &Session::seq_len)
        .def_prop_ro("vocab_size", &Session::vocab_size)
        .def("options_json", &Session::options_json)
        .def("memory_plan", &Session::memory_plan)
        .def("close", &Session::close, "Releases the model and its memory.");
}

}  // namespace qtrain::python
