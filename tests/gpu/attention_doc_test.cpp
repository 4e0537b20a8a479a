// Document masking in the GPU attention kernels (attention.h, positions): packed rows of several
// documents, where query t sees only keys t - positions[t] .. t. Against the CPU reference
// (cpu::attention_forward / attention_backward with the same positions, itself tested equal to each
// document run alone in cpu_ops_test) on fresh random inputs, fp32 and bf16 flash, forward out + lse
// and backward dq / dk / dv. The layouts put documents of length 1, documents that end exactly on the
// 64-key and 128-query tile edges and documents that cross them, T not a multiple of any tile, one
// document per row (plain causal through the masked kernels), head dims 64 and 128, GQA ratios 1-7.
// Also: positions 0..T-1 give bit for bit the plain causal result (positions == nullptr); two runs
// and the chunked backward are bit-identical; a packed row equals each of its documents run alone on
// the GPU (a check that does not go through the CPU reference). The cuDNN backend with positions:
// attention_doc_cudnn_test.cpp.
// Every output buffer starts as NaN with a NaN guard zone behind it, so a forgotten or stray write fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "cuda/attention.h"
#include "attention_doc_util.h"
#include "attention_test_util.h"
#include "gpu_test_util.h"
#include "model/cpu/cpu_ops.h"

namespace qtrain {
namespace {

using test::AllClose;
using test::DeviceBuffer;
using test::random_vector;
using namespace test::attention;

// Layout, fill_rows, checked_layout, positions_of, count_docs, Inputs / random_inputs and non_finite:
// attention_doc_util.h.

struct DocCase {
    const char* name;
    int B, T, Hq, Hkv, D;
    float qk_std;   // std of the random q and k (> 1: sharper softmax)
    Layout docs;    // empty: random lengths (random_layout) from the case's seed
};

// Random document lengths filling B rows of T: a quarter of the documents of length 1, the others
// short (2-40), medium (60-140, around the tiles) or long (150-600), the last one cut at T.
Layout random_layout(int B, int T, uint64_t seed) {
    return fill_rows(B, T, seed, [](Rng& r) {
        const uint64_t kind = r.below(4);
        return kind == 0 ? 1 : kind == 1 ? 2 + static_cast<int>(r.below(39))
                             : kind == 2 ? 60 + static_cast<int>(r.below(81))
                                         : 150 + static_cast<int>(r.below(451));
    });
}

Layout layout_of(const DocCase& c) {
    return checked_layout(c.docs.empty() ? random_layout(c.B, c.T, 7919ull * c.T + 31ull * c.B + c.D) : c.docs, c.name,
                          c.B, c.T);
}

AttentionShape shape_of(const DocCase& c) { return AttentionShape{c.B, c.T, c.Hq, c.Hkv, c.D}; }
// "b=1 t=130 (document at 129..250, position 1) h=3 d=5": where the worst element of a failing
// comparison sits, including its document, since masking bugs show at document and tile edges.
std::string token_where(std::size_t b, std::size_t t, const std::vector<int32_t>& pos, int T) {
    const int32_t p = pos[b * T + t];
    std::size_t end = t + 1;
    while (end < static_cast<std::size_t>(T) && pos[b * T + end] != 0) ++end;
    return cat("b=", b, " t=", t, " (document at ", t - p, "..", end - 1, ", position ", p, ")");
}
std::function<std::string(std::size_t)> where_bthd(const AttentionShape& s, int H, const std::vector<int32_t>& pos) {
    return [=](std::size_t i) {
        const std::size_t d = i % s.D, h = i / s.D % H, t = i / s.D / H % s.T, b = i / s.D / H / s.T;
        return cat(token_where(b, t, pos, s.T), " h=", h, " d=", d);
    };
}
std::function<std::string(std::size_t)> where_bht(const AttentionShape& s, const std::vector<int32_t>& pos) {
    return [=](std::size_t i) {
        const std::size_t t = i % s.T, h = i / s.T % s.Hq, b = i / s.T / s.Hq;
        return cat(token_where(b, t, pos, s.T), " h=", h);
    };
}

Result run_cpu(const std::vector<float>& qkv, const std::vector<float>& dout, const AttentionShape& s,
               const std::vector<int32_t>& pos) {
    return test::attention::run_cpu(qkv, dout, s, pos.data());
}
// Flash (bf16) or the fp32 kernels with positions (null: plain causal), the backward in `chunks` chunks.
Result run_gpu(DType dtype, const std::vector<float>& qkv, const std::vector<float>& dout, const AttentionShape& s,
               const std::vector<int32_t>* pos, int chunks = 1) {
    return test::attention::run_gpu(dtype, AttentionBackend::Flash, qkv, dout, s, pos, chunks);
}

void expect_close(const Result& gpu, const Result& ref, DType dtype, const AttentionShape& s,
                  const std::vector<int32_t>& pos, const std::string& label) {
    const Tolerances tol = tolerances(dtype);
    const auto in_q = where_bthd(s, s.Hq, pos), in_kv = where_bthd(s, s.Hkv, pos);
    const auto in_lse = where_bht(s, pos);
    EXPECT_TRUE(AllClose(label + " out", gpu.out, ref.out, tol.out.rtol, tol.out.atol, tol.out.min_cosine, in_q));
    EXPECT_TRUE(AllClose(label + " lse", gpu.lse, ref.lse, tol.lse.rtol, tol.lse.atol, tol.lse.min_cosine, in_lse));
    EXPECT_TRUE(AllClose(label + " dq", gpu.d.q, ref.d.q, tol.grad.rtol, tol.grad.atol, tol.grad.min_cosine, in_q));
    EXPECT_TRUE(AllClose(label + " dk", gpu.d.k, ref.d.k, tol.grad.rtol, tol.grad.atol, tol.grad.min_cosine, in_kv));
    EXPECT_TRUE(AllClose(label + " dv", gpu.d.v, ref.d.v, tol.grad.rtol, tol.grad.atol, tol.grad.min_cosine, in_kv));
}

// Inputs of a case: bf16-rounded for bf16, so the reference sees exactly the GPU's values.
Inputs inputs_of(const DocCase& c, DType dtype, uint64_t seed) {
    return random_inputs(shape_of(c), c.qk_std, dtype == DType::BF16, seed, layout_of(c));
}

const DocCase kCases[] = {
    // documents ending on the 64-key and 128-query tile edges (64, 128), one of length 1 right after
    // an edge, one crossing the 256 edge; row 2: lengths 1 around a long one
    {"edges_d64", 2, 300, 4, 2, 64, 1.0f, {{1, 63, 64, 1, 100, 71}, {150, 1, 1, 148}}},
    // one document per row (plain causal through the masked kernels), two 128-aligned halves,
    // a row whose documents cross every tile edge; GQA ratio 2, D = 128
    {"edges_d128", 3, 257, 6, 3, 128, 1.0f, {{128, 129}, {5, 200, 52}, {257}}},
    // every token its own document: each query sees only itself (out = its v row)
    {"all_length_1", 1, 70, 2, 1, 64, 1.0f, {std::vector<int>(70, 1)}},
    // Qwen2.5-1.5B heads, T just past 128, documents at 65 and 1/128/1
    {"qwen15b_heads", 2, 130, 12, 2, 128, 1.0f, {{65, 65}, {1, 128, 1}}},
    // random realistic mixes (lengths 1 to 600)
    {"random_0p5b", 2, 1024, 14, 2, 64, 1.0f, {}},
    {"random_gqa7_d128", 2, 1000, 7, 1, 128, 1.0f, {}},
    {"random_sharp", 3, 333, 4, 4, 64, 2.5f, {}},
    {"random_sharp_d128", 1, 777, 8, 2, 128, 2.5f, {}},
};

std::string case_name(const ::testing::TestParamInfo<std::tuple<DType, DocCase>>& info) {
    const auto& [dtype, c] = info.param;
    return cat(dtype_name(dtype), "_", c.name);
}

class AttentionDocMasking : public ::testing::TestWithParam<std::tuple<DType, DocCase>> {};

TEST_P(AttentionDocMasking, ForwardAndBackwardMatchReference) {
    QTRAIN_REQUIRE_GPU();
    const auto& [dtype, c] = GetParam();
    const AttentionShape s = shape_of(c);
    const Inputs in = inputs_of(c, dtype, 1000003ull * c.B + 1009ull * c.T + 11ull * c.Hq + c.D);
    const Result gpu = run_gpu(dtype, in.qkv, in.dout, s, &in.pos);
    const Result ref = run_cpu(in.qkv, in.dout, s, in.pos);
    expect_close(gpu, ref, dtype, s, in.pos, "vs CPU:");
}

// Deterministic: two runs, and the backward in 2 or 3 chunks of sequences (each chunk reads its own
// rows' positions), are bit-identical.
TEST_P(AttentionDocMasking, RepeatedAndChunkedRunsAreBitIdentical) {
    QTRAIN_REQUIRE_GPU();
    const auto& [dtype, c] = GetParam();
    const AttentionShape s = shape_of(c);
    const Inputs in = inputs_of(c, dtype, 77 + c.T);
    const Result a = run_gpu(dtype, in.qkv, in.dout, s, &in.pos);
    auto first_diff = [](const std::vector<uint8_t>& x, const std::vector<uint8_t>& y) -> std::string {
        if (x.size() != y.size()) return cat("sizes differ: ", x.size(), " vs ", y.size());
        std::size_t n = 0, first = 0;
        for (std::size_t i = 0; i < x.size(); ++i)
            if (x[i] != y[i] && n++ == 0) first = i;
        return n == 0 ? std::string() : cat(n, " bytes differ, first at byte ", first);
    };
    const std::size_t row_bytes = qkv_width(s) * dtype_size(dtype);
    for (int chunks : {1, 2, 3}) {
        if (s.B % chunks != 0) continue;
        SCOPED_TRACE(cat(chunks, " chunks"));
        const Result b = run_gpu(dtype, in.qkv, in.dout, s, &in.pos, chunks);
        EXPECT_EQ(first_diff(a.out_bytes, b.out_bytes), "") << "forward out";
        EXPECT_EQ(first_diff(a.lse_bytes, b.lse_bytes), "") << "forward lse";
        const std::string dd = first_diff(a.dqkv_bytes, b.dqkv_bytes);
        EXPECT_EQ(dd, "") << "dqkv (a token's row is " << row_bytes << " bytes)";
    }
    EXPECT_EQ(non_finite(a), 0u) << "outputs left unwritten (NaN fill) or overflowed";
}

// Positions 0..T-1 in every row (one document per row) run the masked kernels with every bound at 0:
// they must give the plain causal kernels' bits exactly (out, lse, dqkv).
TEST_P(AttentionDocMasking, OneDocumentPerRowIsBitIdenticalToPlainCausal) {
    QTRAIN_REQUIRE_GPU();
    const auto& [dtype, c] = GetParam();
    const AttentionShape s = shape_of(c);
    Inputs in = inputs_of(c, dtype, 4242 + c.T);
    in.pos = positions_of(Layout(c.B, std::vector<int>{c.T}));
    const Result masked = run_gpu(dtype, in.qkv, in.dout, s, &in.pos);
    const Result plain = run_gpu(dtype, in.qkv, in.dout, s, nullptr);
    EXPECT_TRUE(masked.out_bytes == plain.out_bytes) << "out differs from plain causal";
    EXPECT_TRUE(masked.lse_bytes == plain.lse_bytes) << "lse differs from plain causal";
    EXPECT_TRUE(masked.dqkv_bytes == plain.dqkv_bytes) << "dqkv differs from plain causal";
}

// A packed micro-batch equals its documents run alone (B = 1, T = the document's length, plain
// causal) through the same GPU kernels: the property document masking exists for, checked without
// the CPU reference. The tolerances are the CPU comparison's (both sides are GPU results, so for
// bf16 they differ by the roundings of two runs whose key blocks start at other offsets).
TEST_P(AttentionDocMasking, PackedRowEqualsEachDocumentAlone) {
    QTRAIN_REQUIRE_GPU();
    const auto& [dtype, c] = GetParam();
    const AttentionShape s = shape_of(c);
    const Inputs in = inputs_of(c, dtype, 999 + c.T);
    const Result packed = run_gpu(dtype, in.qkv, in.dout, s, &in.pos);
    const Layout layout = layout_of(c);
    const std::size_t w = qkv_width(s), wo = static_cast<std::size_t>(s.Hq) * s.D;
    const std::size_t wk = static_cast<std::size_t>(s.Hkv) * s.D;
    int checked = 0;
    for (int b = 0; b < c.B; ++b) {
        int start = 0;
        for (int len : layout[b]) {
            const bool pick = len == 1 || len % 64 <= 1 || checked < 3 || start % 64 == 0;  // edges, and a few more
            if (pick) {
                SCOPED_TRACE(cat("row ", b, ", document at ", start, " of length ", len));
                ++checked;
                const AttentionShape one{1, len, s.Hq, s.Hkv, s.D};
                const std::size_t n0 = static_cast<std::size_t>(b) * s.T + start;
                std::vector<float> qkv1(in.qkv.begin() + n0 * w, in.qkv.begin() + (n0 + len) * w);
                std::vector<float> dout1(in.dout.begin() + n0 * wo, in.dout.begin() + (n0 + len) * wo);
                const Result alone = run_gpu(dtype, qkv1, dout1, one, nullptr);
                // the packed result's rows of this document, in the single-row layouts
                Result cut;
                cut.out.assign(packed.out.begin() + n0 * wo, packed.out.begin() + (n0 + len) * wo);
                cut.d.q.assign(packed.d.q.begin() + n0 * wo, packed.d.q.begin() + (n0 + len) * wo);
                cut.d.k.assign(packed.d.k.begin() + n0 * wk, packed.d.k.begin() + (n0 + len) * wk);
                cut.d.v.assign(packed.d.v.begin() + n0 * wk, packed.d.v.begin() + (n0 + len) * wk);
                for (int h = 0; h < s.Hq; ++h)
                    for (int t = 0; t < len; ++t)
                        cut.lse.push_back(packed.lse[(static_cast<std::size_t>(b) * s.Hq + h) * s.T + start + t]);
                std::vector<int32_t> pos1(len);
                std::iota(pos1.begin(), pos1.end(), 0);
                expect_close(cut, alone, dtype, one, pos1, "packed vs alone:");
            }
            start += len;
        }
    }
    EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, AttentionDocMasking,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16), ::testing::ValuesIn(kCases)),
                         case_name);

// The test layouts are what they claim (a bad layout would make every comparison above vacuous).
TEST(AttentionDocMaskingArgs, LayoutsAreWellFormed) {
    for (const DocCase& c : kCases) {
        SCOPED_TRACE(c.name);
        const Layout l = layout_of(c);
        const auto pos = positions_of(l);
        ASSERT_EQ(pos.size(), static_cast<std::size_t>(c.B) * c.T);
        const DocCounts n = count_docs(l);
        if (c.docs.empty()) {  // the random mixes hold several documents, some of length 1
            EXPECT_GE(n.docs, 2 * c.B);
            EXPECT_GE(n.ones, 1);
        }
    }
}

}  // namespace
}  // namespace qtrain
