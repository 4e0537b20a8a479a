// Document masking on the cuDNN backend (attention.h with positions and AttentionShape::max_docs):
// cuDNN's variable-length SDPA, one ragged sequence per document, max_docs slots per row with the
// spare slots copying the row's shortest document (cuda/attention_ragged.h). bf16, fresh random
// inputs, the tolerances of the other attention tests (attention_test_util.h):
//   - forward out + lse and backward dq / dk / dv against the CPU reference (lse read token-major,
//     [B*T, Hq], as this backend writes it) and against the flash kernels with the same positions;
//   - layouts with documents of length 1, a whole row as one document, many short ones, GQA, head
//     dims 64 and 128;
//   - spare slots change nothing: max_docs = the most documents in a row and max_docs + 5 give the
//     same bytes; two runs and the backward in chunks are bit-identical;
//   - the index kernel's arrays against a host computation of the documented layout.
// Every output buffer starts as NaN with a NaN guard zone behind it (attention_test_util.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "attention_doc_util.h"
#include "attention_test_util.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "cuda/attention.h"
#include "cuda/attention_ragged.h"
#include "gpu_test_util.h"

namespace qtrain {
namespace {

using test::AllClose;
using test::DeviceBuffer;
using test::random_vector;
using namespace test::attention;

// Layout, fill_rows, checked_layout, positions_of, count_docs, Inputs / random_inputs and non_finite:
// attention_doc_util.h.

struct RaggedCase {
    const char* name;
    int B, T, Hq, Hkv, D;
    Layout docs;  // empty: random lengths from the case's seed
};

// Many short documents (1-20 tokens, a fifth of them of length 1) with an occasional long one.
Layout random_layout(int B, int T, uint64_t seed) {
    return fill_rows(B, T, seed, [](Rng& r) {
        const uint64_t kind = r.below(10);
        return kind < 2 ? 1 : kind < 9 ? 2 + static_cast<int>(r.below(19)) : 100 + static_cast<int>(r.below(300));
    });
}

Layout layout_of(const RaggedCase& c) {
    return checked_layout(c.docs.empty() ? random_layout(c.B, c.T, 6007ull * c.T + 13ull * c.B + c.D) : c.docs, c.name,
                          c.B, c.T);
}

int most_docs(const Layout& rows) { return count_docs(rows).most; }

const RaggedCase kCases[] = {
    // length 1 first, last and between; a tile-edge document; a row that is one document
    {"ones_and_whole_row_d64", 3, 300, 4, 2, 64, {{1, 63, 64, 1, 100, 70, 1}, {300}, {1, 1, 298}}},
    // D = 128, GQA 3, a row of equal documents (the shortest is the first of equals)
    {"gqa3_d128", 2, 257, 6, 2, 128, {{128, 129}, {50, 50, 50, 50, 57}}},
    // every token its own document (T documents in the row)
    {"all_length_1", 1, 96, 2, 1, 64, {std::vector<int>(96, 1)}},
    // Qwen2.5-0.5B heads, many short documents with a few long ones
    {"random_0p5b", 2, 1024, 14, 2, 64, {}},
    // Qwen2.5-1.5B heads, D = 128
    {"random_1p5b_d128", 2, 700, 12, 2, 128, {}},
};

std::string case_name(const ::testing::TestParamInfo<RaggedCase>& info) { return info.param.name; }

// Skips where the cuDNN backend cannot run (no frontend in the build, an old GPU), and where cuDNN
// refuses the ragged graphs, after checking the refusal is cuDNN's clear error.
#define REQUIRE_CUDNN_RAGGED(s)                                                                             \
    do {                                                                                                    \
        std::string why_;                                                                                   \
        if (!attention_backend_available(AttentionBackend::Cudnn, &why_)) GTEST_SKIP() << why_;             \
        try {                                                                                               \
            (void)attention_backward_workspace_bytes(DType::BF16, (s), 1, AttentionBackend::Cudnn);         \
        } catch (const Error& e_) {                                                                         \
            ASSERT_NE(std::string(e_.what()).find("cuDNN attention"), std::string::npos) << e_.what();      \
            GTEST_SKIP() << "cuDNN refuses the ragged graphs: " << e_.what();                               \
        }                                                                                                   \
    } while (0)

// bf16 inputs, q and k of std 1.
Inputs inputs_of(const RaggedCase& c, const AttentionShape& s, uint64_t seed) {
    return random_inputs(s, 1.0f, true, seed, layout_of(c));
}

AttentionShape shape_of(const RaggedCase& c, int max_docs) {
    AttentionShape s{c.B, c.T, c.Hq, c.Hkv, c.D};
    s.max_docs = max_docs;
    return s;
}

// cuDNN's token-major lse [B*T, Hq] in attention.h's [B, Hq, T] order.
std::vector<float> lse_bht(const std::vector<float>& token_major, const AttentionShape& s) {
    std::vector<float> out(token_major.size());
    for (int b = 0; b < s.B; ++b)
        for (int h = 0; h < s.Hq; ++h)
            for (int t = 0; t < s.T; ++t)
                out[(static_cast<std::size_t>(b) * s.Hq + h) * s.T + t] =
                    token_major[(static_cast<std::size_t>(b) * s.T + t) * s.Hq + h];
    return out;
}

void expect_close(const Result& gpu, const Result& ref, bool compare_lse, const std::string& label) {
    const Tolerances tol = tolerances(DType::BF16);
    EXPECT_TRUE(AllClose(label + " out", gpu.out, ref.out, tol.out.rtol, tol.out.atol, tol.out.min_cosine));
    if (compare_lse) EXPECT_TRUE(AllClose(label + " lse", gpu.lse, ref.lse, tol.lse.rtol, tol.lse.atol, tol.lse.min_cosine));
    // dq and dk of documents of one token are exactly zero (a softmax over one score has no gradient):
    // two GPU kernels leave different rounding noise there (~1e-7), whose cosine means nothing, so a
    // reference below the absolute tolerance everywhere is compared by that tolerance alone
    const auto grad_cosine = [&](const std::vector<float>& r) {
        float most = 0.0f;
        for (float x : r) most = std::max(most, std::abs(x));
        return most < tol.grad.atol ? 0.0 : static_cast<double>(tol.grad.min_cosine);  // 0: no cosine check
    };
    EXPECT_TRUE(AllClose(label + " dq", gpu.d.q, ref.d.q, tol.grad.rtol, tol.grad.atol, grad_cosine(ref.d.q)));
    EXPECT_TRUE(AllClose(label + " dk", gpu.d.k, ref.d.k, tol.grad.rtol, tol.grad.atol, grad_cosine(ref.d.k)));
    EXPECT_TRUE(AllClose(label + " dv", gpu.d.v, ref.d.v, tol.grad.rtol, tol.grad.atol, tol.grad.min_cosine));
}

Result run_cudnn(const Inputs& in, const AttentionShape& s, int chunks = 1) {
    Result r = run_gpu(DType::BF16, AttentionBackend::Cudnn, in.qkv, in.dout, s, &in.pos, chunks);
    r.lse = lse_bht(r.lse, s);
    return r;
}

class AttentionDocCudnn : public ::testing::TestWithParam<RaggedCase> {};

TEST_P(AttentionDocCudnn, ForwardAndBackwardMatchReferenceAndFlash) {
    QTRAIN_REQUIRE_GPU();
    const RaggedCase& c = GetParam();
    const AttentionShape s = shape_of(c, most_docs(layout_of(c)));
    REQUIRE_CUDNN_RAGGED(s);
    const Inputs in = inputs_of(c, s, 7001ull * c.T + 17ull * c.Hq + c.D);
    const Result gpu = run_cudnn(in, s);
    const Result cpu = run_cpu(in.qkv, in.dout, s, in.pos.data());
    expect_close(gpu, cpu, true, "cuDNN ragged vs CPU:");
    // the flash kernels with the same positions (their lse is [B, Hq, T], like the converted one)
    const Result flash = run_gpu(DType::BF16, AttentionBackend::Flash, in.qkv, in.dout, s, &in.pos);
    expect_close(gpu, flash, true, "cuDNN ragged vs flash:");
    EXPECT_EQ(non_finite(gpu), 0u) << "outputs left unwritten (NaN fill) or overflowed";
}

// The spare slots (copies of each row's shortest document) write the bytes the document's own slot
// writes: more slots change nothing. Two runs and the backward in 2 chunks (groups of B/2 rows with
// offsets from each chunk's base) are bit-identical too.
TEST_P(AttentionDocCudnn, SpareSlotsRepeatsAndChunksAreBitIdentical) {
    QTRAIN_REQUIRE_GPU();
    const RaggedCase& c = GetParam();
    const int most = most_docs(layout_of(c));
    const AttentionShape exact = shape_of(c, most), spare = shape_of(c, most + 5);
    REQUIRE_CUDNN_RAGGED(exact);
    REQUIRE_CUDNN_RAGGED(spare);
    const Inputs in = inputs_of(c, exact, 31ull + c.T);
    const Result a = run_cudnn(in, exact);
    const Result again = run_cudnn(in, exact);
    const Result padded = run_cudnn(in, spare);
    for (const auto& [what, other] : {std::pair<const char*, const Result*>{"a second run", &again},
                                      std::pair<const char*, const Result*>{"5 spare slots per row", &padded}}) {
        SCOPED_TRACE(what);
        EXPECT_TRUE(a.out_bytes == other->out_bytes) << "out";
        EXPECT_TRUE(a.lse_bytes == other->lse_bytes) << "lse";
        EXPECT_TRUE(a.dqkv_bytes == other->dqkv_bytes) << "dqkv";
    }
    if (c.B % 2 == 0) {
        const Result chunked = run_cudnn(in, exact, 2);
        EXPECT_TRUE(a.dqkv_bytes == chunked.dqkv_bytes) << "dqkv, backward in 2 chunks";
    }
}

INSTANTIATE_TEST_SUITE_P(Layouts, AttentionDocCudnn, ::testing::ValuesIn(kCases), case_name);

// The index kernel against the documented layout, computed here on the host: per row, documents in
// order with the spare slots right after the (first) shortest one; offsets from the group's base.
TEST(AttentionDocCudnnIndex, MatchesTheDocumentedLayout) {
    QTRAIN_REQUIRE_GPU();
    const int B = 4, T = 333, Hq = 6, Hkv = 2, D = 64, M = 40;
    const Layout rows = random_layout(B, T, 99);
    ASSERT_LE(most_docs(rows), M);
    const std::vector<int32_t> pos = positions_of(rows);
    EXPECT_EQ(cuda::max_documents_per_row(pos.data(), B, T), most_docs(rows));
    DeviceBuffer d_pos = test::to_device(pos);
    for (int rpg : {4, 2, 1}) {
        SCOPED_TRACE(cat(rpg, " rows per group"));
        DeviceBuffer mem(cuda::ragged_index_bytes(B, M));
        mem.fill_bytes(0xFF);
        const cuda::RaggedIndex idx = cuda::ragged_index_at(mem.get(), B, M);
        cuda::ragged_document_index(idx, d_pos.as<int32_t>(), B, T, M, rpg, Hq, Hkv, D, nullptr);
        test::sync_device();
        const std::size_t E = static_cast<std::size_t>(B) * M + B;
        const auto qkv_off = test::to_host<int64_t>(idx.qkv_off, E), o_off = test::to_host<int64_t>(idx.o_off, E);
        const auto lse_off = test::to_host<int64_t>(idx.lse_off, E);
        const auto len = test::to_host<int32_t>(idx.seq_len, E);
        const int64_t C = static_cast<int64_t>(Hq + 2 * Hkv) * D;
        for (int b = 0; b < B; ++b) {
            const int g = b / rpg, r = b % rpg;
            const std::vector<int>& docs = rows[b];
            const int n = static_cast<int>(docs.size());
            const int shortest = static_cast<int>(std::min_element(docs.begin(), docs.end()) - docs.begin());
            std::vector<int> starts(n, 0);
            for (int j = 1; j < n; ++j) starts[j] = starts[j - 1] + docs[j - 1];
            for (int s = 0; s < M; ++s) {
                const int j = s <= shortest ? s : s <= shortest + (M - n) ? shortest : s - (M - n);
                const std::size_t e = static_cast<std::size_t>(g) * (rpg * M + 1) + r * M + s;
                const int64_t token = static_cast<int64_t>(r) * T + starts[j];
                ASSERT_EQ(qkv_off[e], token * C) << "row " << b << " slot " << s;
                ASSERT_EQ(o_off[e], token * Hq * D) << "row " << b << " slot " << s;
                ASSERT_EQ(lse_off[e], token * Hq) << "row " << b << " slot " << s;
                ASSERT_EQ(len[e], docs[j]) << "row " << b << " slot " << s;
            }
        }
        for (int g = 0; g < B / rpg; ++g) {  // each group's end entry
            const std::size_t e = static_cast<std::size_t>(g) * (rpg * M + 1) + rpg * M;
            EXPECT_EQ(qkv_off[e], static_cast<int64_t>(rpg) * T * C);
            EXPECT_EQ(len[e], 0);
        }
    }
}

// Argument checks run on the host before the device is touched, so these run anywhere.
TEST(AttentionDocCudnnArgs, PositionsAndMaxDocsGoTogether) {
    alignas(16) float dummy[16] = {};
    const int32_t pos[8] = {0, 1, 2, 0, 1, 0, 1, 2};
    const AttentionShape plain{1, 8, 2, 2, 64};
    EXPECT_ERROR(attention_forward(DType::BF16, dummy, dummy, dummy, plain, nullptr, nullptr, AttentionBackend::Cudnn,
                                   dummy, pos),
                 "needs AttentionShape::max_docs > 0");
    EXPECT_ERROR(attention_backward(DType::BF16, dummy, dummy, dummy, dummy, dummy, dummy, plain, nullptr, 1,
                                    AttentionBackend::Cudnn, pos),
                 "needs AttentionShape::max_docs > 0");
    AttentionShape ragged = plain;
    ragged.max_docs = 4;
    EXPECT_ERROR(attention_forward(DType::BF16, dummy, dummy, dummy, ragged, nullptr, nullptr, AttentionBackend::Cudnn,
                                   dummy, nullptr),
                 "asks for cuDNN's ragged (document-masked) attention, but no positions were given");
}

// The test layouts are what they claim: lengths of 1, a row as one document, many short documents.
TEST(AttentionDocCudnnArgs, LayoutsAreWellFormed) {
    for (const RaggedCase& c : kCases) {
        SCOPED_TRACE(c.name);
        const Layout l = layout_of(c);
        const DocCounts n = count_docs(l);
        EXPECT_EQ(positions_of(l).size(), static_cast<std::size_t>(c.B) * c.T);
        if (c.docs.empty()) {
            EXPECT_GE(n.docs, 10 * c.B);
            EXPECT_GE(n.ones, 1);
        }
    }
}

}  // namespace
}  // namespace qtrain
