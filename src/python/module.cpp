// The Python extension `qtrain._qtrain` (nanobind): the engine's entry points for Python, with the
// CLI's own validation. The package (python/qtrain/__init__.py) turns keywords into flags; this side
// parses them with the same code as `train` (train_options_from_args), so a bad option raises with
// the command line's message, and releases the GIL while training or tokenizing runs.
#include <cstdint>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "core/error.h"
#include "python/bindings.h"
#include "tokenizer/tokenizer.h"
#include "train/option_info.h"
#include "train/train_options.h"
#include "train/trainer.h"

namespace nb = nanobind;

namespace {

// `train` with these flags (no program name): the exit code (0; 130 after Ctrl-C with a checkpoint).
int run_training(const std::vector<std::string>& args) {
    qtrain::TrainOptions options = qtrain::train_options_from_args(args);
    std::string cmd = "python: qtrain.train";
    for (const std::string& a : args) cmd += " " + a;
    nb::gil_scoped_release released;  // the run takes minutes; other Python threads go on
    return qtrain::Trainer(std::move(options), cmd).run();
}

// Validates the flags without running anything (what train() would refuse before it starts).
void check_options(const std::vector<std::string>& args) { (void)qtrain::train_options_from_args(args); }

}  // namespace

NB_MODULE(_qtrain, m) {
    m.doc() = "qtrain's engine (C++/CUDA); use the qtrain package's functions";
    nb::register_exception_translator([](const std::exception_ptr& p, void*) {
        try {
            std::rethrow_exception(p);
        } catch (const qtrain::Error& e) {
            PyErr_SetString(PyExc_ValueError, e.what());
        }
    });
    qtrain::python::bind_session(m);
    qtrain::python::bind_data(m);
    m.def(
        "describe_options",
        [] {
            nb::list out;
            for (const qtrain::OptionInfo& i : qtrain::describe_train_options()) {
                nb::dict d;
                d["flag"] = i.flag;
                d["aliases"] = i.aliases;
                d["keyword"] = i.python;
                d["type"] = i.type;
                d["default"] = i.default_value;
                d["help"] = i.help;
                d["group"] = i.group;
                d["choices"] = i.choices;
                d["resume"] = i.resume;
                out.append(d);
            }
            return out;
        },
        "Every `train` option (the engine's option table): flag, keyword, type, default, help, group, choices.");
    m.def("run_training", &run_training, nb::arg("args"),
          "Runs `train` with these command-line flags; returns its exit code.");
    m.def("check_options", &check_options, nb::arg("args"),
          "Raises ValueError with the command line's message when `train` would refuse these flags.");

    nb::class_<qtrain::Tokenizer>(m, "Tokenizer", "A HF tokenizer.json or tiktoken file, as `train` and `tokenize` use it.")
        .def_static("load", &qtrain::Tokenizer::load, nb::arg("path"), "Loads tokenizer.json or a tiktoken rank file.")
        .def(
            "encode",
            [](const qtrain::Tokenizer& t, const std::string& text) {
                nb::gil_scoped_release released;
                return t.encode(text);
            },
            nb::arg("text"), "The token ids of `text` (special tokens' text encoded as text).")
        .def(
            "decode", [](const qtrain::Tokenizer& t, const std::vector<int32_t>& ids) { return t.decode_text(ids); },
            nb::arg("ids"), "The text of `ids` (a cut character becomes U+FFFD).")
        .def(
            "token_id", [](const qtrain::Tokenizer& t, const std::string& token) { return t.token_id(token); },
            nb::arg("token"), "The id of a token (e.g. '<|endoftext|>'), or None when it is not one.")
        .def(
            "encode_with_offsets",
            [](const qtrain::Tokenizer& t, const std::string& text) {
                std::vector<int32_t> ids;
                std::vector<qtrain::TokenOffset> offsets;
                {
                    nb::gil_scoped_release released;
                    t.encode_with_offsets(text, ids, offsets, qtrain::SpecialTokens::kRecognize);
                }
                std::vector<std::pair<uint32_t, uint32_t>> spans;
                spans.reserve(offsets.size());
                for (const auto& o : offsets) spans.emplace_back(o.begin, o.end);
                return std::make_pair(std::move(ids), std::move(spans));
            },
            nb::arg("text"),
            "(ids, [(begin, end)]): the ids with every added token recognised (transformers' tokenizer(text, "
            "add_special_tokens=False), as for a rendered chat) and the UTF-8 bytes of `text` each comes from.")
        .def_prop_ro("source", &qtrain::Tokenizer::source, "The file it was loaded from.")
        .def_prop_ro("vocab_size", &qtrain::Tokenizer::vocab_size)
        .def_prop_ro("bos_id", &qtrain::Tokenizer::bos_id,
                     "The token the post-processor puts before each document (Llama 3's <|begin_of_text|>), or None.")
        .def_prop_ro("end_of_text", &qtrain::Tokenizer::end_of_text,
                     "The end-of-document token `tokenize` appends by default (<|endoftext|>, "
                     "<|end_of_text|>), or None.");
}
