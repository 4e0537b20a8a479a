// What the document-masking attention tests share (attention_doc_test.cpp: the flash and fp32 kernels;
// attention_doc_cudnn_test.cpp: cuDNN's ragged attention): a packed micro-batch's document layout, its
// positions, filling rows with random document lengths (each file keeps its own length mix and seed),
// checking a case's layout, counting documents, the random inputs of a case and the NaN check of the
// outputs. Every value a test picks (shapes, lengths, seeds, tolerances) stays in its own file.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "attention_test_util.h"
#include "core/error.h"
#include "core/rng.h"
#include "gpu_test_util.h"

namespace qtrain::test::attention {

// A packed micro-batch: per row, the lengths of its documents in order (they sum to T).
using Layout = std::vector<std::vector<int>>;

// B rows of T filled with documents whose lengths draw(rng) picks, the last one of a row cut at T.
template <class Draw>
Layout fill_rows(int B, int T, uint64_t seed, Draw draw) {
    Rng r(seed);
    Layout rows(B);
    for (auto& row : rows) {
        int left = T;
        while (left > 0) {
            const int len = std::min(draw(r), left);
            row.push_back(len);
            left -= len;
        }
    }
    return rows;
}

// A test case's layout, checked: B rows, each summing to T (else every comparison on it would be off).
inline Layout checked_layout(Layout l, const char* name, int B, int T) {
    QT_CHECK(static_cast<int>(l.size()) == B, "test case ", name, ": ", l.size(), " rows for B=", B);
    for (const auto& row : l)
        QT_CHECK(std::accumulate(row.begin(), row.end(), 0) == T, "test case ", name, ": a row's documents do not sum to T");
    return l;
}

// Batch::positions of a layout: 0, 1, ... within each document.
inline std::vector<int32_t> positions_of(const Layout& rows) {
    std::vector<int32_t> pos;
    for (const auto& row : rows)
        for (int len : row)
            for (int p = 0; p < len; ++p) pos.push_back(p);
    return pos;
}

// How many documents a layout holds, how many of them of length 1, and the most in one row.
struct DocCounts {
    int docs = 0, ones = 0, most = 0;
};
inline DocCounts count_docs(const Layout& rows) {
    DocCounts n;
    for (const auto& row : rows) {
        n.docs += static_cast<int>(row.size());
        n.most = std::max(n.most, static_cast<int>(row.size()));
        for (int len : row) n.ones += len == 1;
    }
    return n;
}

// A case's inputs: random qkv (q and k with std qk_std) and output gradient from `seed`, bf16-rounded
// when `bf16` so that the reference sees exactly the GPU's values; the layout's positions.
struct Inputs {
    std::vector<float> qkv, dout;
    std::vector<int32_t> pos;
};
inline Inputs random_inputs(const AttentionShape& s, float qk_std, bool bf16, uint64_t seed, const Layout& layout) {
    Inputs in;
    in.qkv = random_qkv(s, qk_std, seed);
    in.dout = random_vector(tokens(s) * s.Hq * s.D, seed + 1);
    if (bf16) {
        in.qkv = round_bf16(in.qkv);
        in.dout = round_bf16(in.dout);
    }
    in.pos = positions_of(layout);
    return in;
}

// Elements of the outputs that are not finite: left unwritten (the NaN fill) or overflowed.
inline std::size_t non_finite(const Result& r) {
    std::size_t n = 0;
    for (const auto* v : {&r.out, &r.lse, &r.d.q, &r.d.k, &r.d.v})
        for (float x : *v) n += !std::isfinite(x);
    return n;
}

}  // namespace qtrain::test::attention
