// The data side of qtrain for Python on its own: token files (write_tokens; BIN.TOK, io/token_file.h)
// and the training data loader (train/data_loader.h) that hands out the same micro-batches a run uses.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include "core/error.h"
#include "core/files.h"
#include "io/token_file.h"
#include "python/bindings.h"
#include "train/data_loader.h"

namespace nb = nanobind;

namespace qtrain::python {

namespace {

using Array = nb::ndarray<nb::numpy, int32_t, nb::ndim<2>>;

Array to_array(std::vector<int32_t>&& values, size_t rows, size_t cols) {
    auto* owned = new std::vector<int32_t>(std::move(values));
    nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<int32_t>*>(p); });
    const size_t shape[2] = {rows, cols};
    return Array(owned->data(), 2, shape, owner);
}

// (qtrain.write_tokens checks the array's dtype and range, then calls this with int32: python/qtrain/__init__.py)
void write_tokens(const std::string& path, nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> tokens,
                  int vocab_size) {
    const int32_t* data = tokens.data();
    const size_t n = tokens.size();
    nb::gil_scoped_release released;
    TokenFileWriter writer(path, vocab_size, false);
    writer.append(data, n);
    writer.finish();
}

// A token file with optional loss masks (one byte per token, nonzero = trained) and document starts
// (token indices, ascending): what `tokenize --chat` writes (qtrain.tokenize(..., chat=True, out=...)).
void write_token_file_full(const std::string& path,
                           nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> tokens, int vocab_size,
                           std::optional<nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>> mask,
                           std::optional<std::vector<int64_t>> document_starts) {
    const size_t n = tokens.size();
    QT_CHECK(!mask || mask->size() == n, "write_token_file: ", mask ? mask->size() : 0, " mask bytes for ", n, " tokens");
    std::vector<int32_t> ids(tokens.data(), tokens.data() + n);
    std::vector<uint8_t> bits;
    if (mask) bits.assign(mask->data(), mask->data() + n);
    if (document_starts) {
        for (std::size_t i = 0; i < document_starts->size(); ++i) {
            const int64_t s = (*document_starts)[i];
            QT_CHECK(s >= 0 && s < static_cast<int64_t>(std::max<size_t>(n, 1)) && (i == 0 || s > (*document_starts)[i - 1]),
                     "write_token_file: document starts must ascend within [0, ", n, "); got ", s);
        }
    }
    nb::gil_scoped_release released;
    write_token_file(path, ids, vocab_size, mask ? &bits : nullptr, document_starts ? &*document_starts : nullptr);
}

class PyDataLoader {
public:
    PyDataLoader(const std::string& files, int batch_size, int seq_len, uint64_t seed, bool shuffle, int vocab_size,
                 bool document_masking, int eos_token_id, const std::string& packing_mode)
        : loader_(std::make_unique<DataLoader>(expand_glob(files, "files"), checked(batch_size, "batch_size"),
                                               checked(seq_len, "seq_len"), seed, shuffle, vocab_size, "files",
                                               packing(document_masking, eos_token_id, packing_mode))),
          batch_(batch_size), seq_(seq_len) {}
    // (inputs, targets), or with document masking (inputs, targets, positions)
    nb::object next_batch() {
        std::vector<int32_t> in, tgt, pos;
        loader_->next_batch(in, tgt, loader_->packed() ? &pos : nullptr);
        if (!loader_->packed())
            return nb::cast(std::make_tuple(to_array(std::move(in), batch_, seq_), to_array(std::move(tgt), batch_, seq_)));
        return nb::cast(std::make_tuple(to_array(std::move(in), batch_, seq_), to_array(std::move(tgt), batch_, seq_),
                                        to_array(std::move(pos), batch_, seq_)));
    }
    double fill_rate() const { return loader_->pack_stats().fill_rate(static_cast<int>(seq_)); }
    double epoch_progress() const { return loader_->epoch_progress(); }
    int64_t num_tokens() const { return loader_->num_tokens(); }

private:
    // The sizes, checked before the loader is made: seq_len 0 divided by zero (the interpreter died of
    // SIGFPE), a negative batch_size failed in std::vector and batch_size 0 gave empty batches.
    static int checked(int value, const char* name) {
        QT_CHECK(value > 0, "DataLoader: ", name, " must be positive, got ", value);
        return value;
    }
    // train's --document-masking=on with --packing=MODE (documents end after eos_token_id where a file
    // records no document starts)
    static Packing packing(bool document_masking, int eos_token_id, const std::string& mode) {
        QT_CHECK(mode == "greedy" || mode == "one-per-row", "DataLoader: packing must be 'greedy' or 'one-per-row', got '",
                 mode, "'");
        Packing p;
        p.enabled = document_masking;
        p.eos_token_id = eos_token_id;
        p.one_per_row = mode == "one-per-row";
        return p;
    }

    std::unique_ptr<DataLoader> loader_;  // (held by pointer: its files are not copyable)
    size_t batch_, seq_;
};

}  // namespace

void bind_data(nb::module_& m) {
    // noconvert: no implicit cast to int32 (numpy's astype wraps 2**32 + 5 to 5 and truncates 2.7 to 2)
    m.def("write_tokens", &write_tokens, nb::arg("path"), nb::arg("tokens").noconvert(), nb::arg("vocab_size"),
          "Writes a 1-D C-contiguous int32 array of token ids as a BIN.TOK file (what `tokenize` writes and "
          "`train` reads); qtrain.write_tokens takes any integer array.");
    m.def("write_token_file", &write_token_file_full, nb::arg("path"), nb::arg("tokens").noconvert(),
          nb::arg("vocab_size"), nb::arg("mask") = nb::none(), nb::arg("document_starts") = nb::none(),
          "Writes a BIN.TOK file with optional loss masks (uint8, nonzero = trained) and document starts.");
    nb::class_<PyDataLoader>(m, "DataLoader",
                             "The training data loader: chunks of seq_len + 1 tokens of BIN.TOK files, shuffled by "
                             "(seed, epoch); targets are the inputs shifted by one (-1: no loss). document_masking=True "
                             "packs documents into rows as train --document-masking=on does (document starts, or ending "
                             "after eos_token_id; packing='greedy' or 'one-per-row').")
        .def(nb::init<const std::string&, int, int, uint64_t, bool, int, bool, int, const std::string&>(), nb::arg("files"),
             nb::arg("batch_size"), nb::arg("seq_len"), nb::arg("seed") = 42, nb::arg("shuffle") = true,
             nb::arg("vocab_size"), nb::arg("document_masking") = false, nb::arg("eos_token_id") = -1,
             nb::arg("packing") = "greedy")
        .def("next_batch", &PyDataLoader::next_batch,
             "(inputs, targets), each [batch_size, seq_len] int32; with document_masking also positions (each "
             "token's position in its document, as train passes them to the model).")
        .def_prop_ro("fill_rate", &PyDataLoader::fill_rate, "With document_masking: document tokens / row slots.")
        .def_prop_ro("epoch_progress", &PyDataLoader::epoch_progress)
        .def_prop_ro("num_tokens", &PyDataLoader::num_tokens);
}

}  // namespace qtrain::python
