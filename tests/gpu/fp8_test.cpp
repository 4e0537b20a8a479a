// The FP8 building blocks on the GPU against the host emulation (core/fp8_reference.h):
//  - abs_max, quantize_fp8 and quantize_fp8_transpose: bit for bit (amax, every fp8 code, the inverse
//    scale), on fresh random inputs of ordinary, huge, tiny, mixed and subnormal magnitudes, an
//    all-zero tensor and one holding +-inf; fp32 and bf16 inputs; e4m3 and e5m2; vector and scalar
//    (misaligned) paths.
//  - the three FP8 GEMM helpers against the reference product of the SAME quantised operands (so only
//    the accumulation differs): max error relative to the output's max within 1e-2 for bf16 outputs
//    and kFp32Tol for fp32 ones. Hopper's FP8 tensor cores add products with fewer mantissa bits than
//    fp32 between promotions to fp32 registers (DeepSeek-V3 report: ~14 bits), so the fp32 figure is
//    looser than an fp32 GEMM's; the printed figures say what it really is (tighten kFp32Tol then).
//    Layout, scale or bias mistakes give errors of order 1, far above either bound.
//  - the whole chain (abs_max -> quantize -> GEMM) against the unquantised product (cosine only).
// Every comparison prints its error figures, pass or fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <random>
#include <utility>

#include "core/fp8_reference.h"
#include "core/rng.h"
#include "cuda/fp8.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "gpu_test_util.h"

using namespace qtrain;
using namespace qtrain::test;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// A device buffer of fp32 scale slots, each in its own 16-byte slot.
class ScaleSlots {
public:
    explicit ScaleSlots(int n) : buf_(static_cast<std::size_t>(n) * cuda::kFp8ScaleSlotBytes) { buf_.fill_bytes(0); }
    float* operator[](int i) const {
        return reinterpret_cast<float*>(static_cast<char*>(buf_.get()) + i * cuda::kFp8ScaleSlotBytes);
    }
    float get(int i) const {
        float v;
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(&v, (*this)[i], sizeof v, cudaMemcpyDeviceToHost));
        return v;
    }
    void set(int i, float v) const { CUDA_CHECK(cudaMemcpy((*this)[i], &v, sizeof v, cudaMemcpyHostToDevice)); }

private:
    DeviceBuffer buf_;
};

uint32_t bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
}

std::string hex8(uint8_t b) {
    char s[8];
    std::snprintf(s, sizeof s, "0x%02x", b);
    return s;
}
std::string hex32(float x) {
    char s[16];
    std::snprintf(s, sizeof s, "0x%08x", bits(x));
    return s;
}

// Bit-exact comparison of fp8 codes; on failure lists the first mismatches with their inputs.
::testing::AssertionResult CodesEqual(const std::string& what, const std::vector<uint8_t>& got,
                                      const std::vector<uint8_t>& want, DType t,
                                      const std::function<float(std::size_t)>& input_of) {
    if (got.size() != want.size())
        return ::testing::AssertionFailure() << what << ": " << got.size() << " codes, expected " << want.size();
    std::size_t bad = 0;
    std::ostringstream msg;
    msg.precision(9);
    for (std::size_t i = 0; i < got.size(); ++i) {
        if (got[i] == want[i]) continue;
        if (bad++ < 8)
            msg << "\n  [" << i << "] input " << input_of(i) << ": got " << hex8(got[i]) << " ("
                << fp8_decode(got[i], t) << ") expected " << hex8(want[i]) << " (" << fp8_decode(want[i], t) << ")";
    }
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << what << ": " << bad << " of " << got.size() << " codes differ"
                                         << msg.str();
}

// AllClose, with the figures printed either way.
::testing::AssertionResult Close(const std::string& what, const std::vector<float>& got,
                                 const std::vector<float>& want, double rtol, int64_t cols) {
    auto r = AllClose(what, got, want, rtol, 0.0, 0.0, [cols](std::size_t i) {
        return cat("row ", i / cols, " col ", i % cols);
    });
    std::cout << "[fp8] " << r.message() << std::endl;
    return r;
}

struct Case {
    std::string name;
    std::vector<float> x;
};

// Inputs for the quantisation kernels (n values each).
std::vector<Case> quantisation_cases(std::size_t n, uint64_t seed) {
    std::vector<Case> cases;
    cases.push_back({"normal", random_vector(n, seed)});
    cases.push_back({"huge", random_vector(n, seed + 1, 1e30f)});
    cases.push_back({"tiny", random_vector(n, seed + 2, 1e-25f)});
    cases.push_back({"tinier than the scale clamp", random_vector(n, seed + 6, 1e-33f)});
    std::vector<float> mixed = random_vector(n, seed + 3);
    for (std::size_t i = 0; i < n; ++i) mixed[i] *= std::pow(10.0f, static_cast<float>((i * 7) % 41) - 20.0f);
    cases.push_back({"mixed 1e-20..1e20", mixed});
    cases.push_back({"subnormal", random_vector(n, seed + 4, 1e-39f)});  // fp32 (and bf16) subnormals only
    cases.push_back({"zeros", std::vector<float>(n, 0.0f)});
    std::vector<float> with_inf = random_vector(n, seed + 5, 100.0f);
    with_inf[n / 3] = kInf;
    with_inf[n / 2] = -kInf;
    cases.push_back({"with inf", with_inf});
    return cases;
}

// The values the GPU sees for an input of dtype `t`.
std::vector<float> as_input(const std::vector<float>& x, DType t) { return t == DType::BF16 ? round_bf16(x) : x; }

const DType kInTypes[] = {DType::F32, DType::BF16};
const DType kFp8Types[] = {DType::E4M3, DType::E5M2};

}  // namespace

TEST(Fp8Kernels, AbsMaxAndQuantizeBitExact) {
    QTRAIN_REQUIRE_GPU();
    const std::size_t n = 4099;  // 16-byte vectors plus a scalar tail
    ScaleSlots slots(4);
    for (DType in_t : kInTypes)
        for (const Case& c : quantisation_cases(n, 100)) {
            const std::vector<float> x = as_input(c.x, in_t);
            DeviceBuffer gx(c.x, in_t);
            // aligned (vector path) and offset by one element (scalar path)
            for (int offset : {0, 1}) {
                SCOPED_TRACE(cat(c.name, ", input ", dtype_name(in_t), ", offset ", offset));
                const std::size_t m = n - offset;
                const void* in = static_cast<const char*>(gx.get()) + offset * dtype_size(in_t);
                const float amax_sub_ref = fp8_abs_max(x.data() + offset, static_cast<int64_t>(m));
                cuda::abs_max(slots[0], in_t, in, static_cast<int64_t>(m), nullptr);
                const float amax = slots.get(0);
                EXPECT_EQ(bits(amax), bits(amax_sub_ref)) << "amax " << amax << " (" << hex32(amax) << "), expected "
                                                          << amax_sub_ref << " (" << hex32(amax_sub_ref) << ")";
                for (DType q_t : kFp8Types) {
                    SCOPED_TRACE(std::string(dtype_name(q_t)));
                    const Fp8Scale s = fp8_scale_from_amax(amax_sub_ref, q_t);
                    std::vector<uint8_t> want(m);
                    fp8_quantize(want.data(), q_t, x.data() + offset, static_cast<int64_t>(m), s.scale);
                    DeviceBuffer gq(m + 16);
                    gq.fill_bytes(0xAB);
                    void* out = static_cast<char*>(gq.get()) + offset;
                    slots.set(1, -1.0f);
                    cuda::quantize_fp8(out, q_t, in, in_t, static_cast<int64_t>(m), slots[0], slots[1], nullptr);
                    sync_device();
                    EXPECT_TRUE(CodesEqual(c.name, to_host<uint8_t>(out, m), want, q_t,
                                           [&](std::size_t i) { return x[offset + i]; }));
                    const float inv = slots.get(1);
                    EXPECT_EQ(bits(inv), bits(s.inv)) << "inv scale " << inv << " expected " << s.inv;
                    EXPECT_TRUE(std::isfinite(inv));
                }
            }
        }
}

TEST(Fp8Kernels, AbsMaxLargeTensorAndAccumulate) {
    QTRAIN_REQUIRE_GPU();
    // many blocks, so many atomics; the max sits at a random place
    const std::size_t n = (1u << 22) + 5;
    std::vector<float> x = random_vector(n, 200);
    x[n - 2] = -123.5f;  // in the tail of the scalar remainder
    ScaleSlots slots(1);
    for (DType in_t : kInTypes) {
        SCOPED_TRACE(std::string(dtype_name(in_t)));
        DeviceBuffer gx(x, in_t);
        const std::vector<float> xr = as_input(x, in_t);
        for (int rep = 0; rep < 3; ++rep) {  // same answer every time
            cuda::abs_max(slots[0], in_t, gx.get(), static_cast<int64_t>(n), nullptr);
            EXPECT_EQ(slots.get(0), fp8_abs_max(xr.data(), static_cast<int64_t>(n)));
        }
        // accumulate: max over two pieces equals max over the whole
        cuda::abs_max(slots[0], in_t, gx.get(), static_cast<int64_t>(n / 2), nullptr);
        cuda::abs_max(slots[0], in_t, static_cast<const char*>(gx.get()) + (n / 2) * dtype_size(in_t),
                      static_cast<int64_t>(n - n / 2), nullptr, /*accumulate=*/true);
        EXPECT_EQ(slots.get(0), 123.5f);
        // n = 0: zeroed
        cuda::abs_max(slots[0], in_t, gx.get(), 0, nullptr);
        EXPECT_EQ(slots.get(0), 0.0f);
    }
}

// ZeRO-3's FP8 weights: every rank's abs-max over its part of each tensor, combined into the amax
// and inverse-scale slots (the model's interleaved layout: 4 tensors per layer, amax slots 4 per
// layer, inverse scales 16 per layer) equal abs_max over the whole tensor and quantize_fp8's inverse
// scale, bit for bit, with parts that are empty (0), tiny or all-zero.
TEST(Fp8Kernels, MaxOverRanksGivesTheWholeTensorsScales) {
    QTRAIN_REQUIRE_GPU();
    constexpr int kLayers = 3, kTensors = 4 * kLayers, kRanks = 3;
    Rng rng(99);
    std::vector<float> rank_amax(static_cast<std::size_t>(kRanks) * kTensors);
    for (int r = 0; r < kRanks; ++r)
        for (int i = 0; i < kTensors; ++i) {
            const float u = rng.uniform();
            rank_amax[r * kTensors + i] = u < 0.2f ? 0.0f : u < 0.3f ? 1e-30f : 3.0f * rng.uniform() + 0.01f * r;
        }
    for (int r = 0; r < kRanks; ++r) rank_amax[r * kTensors + 5] = 0.0f;  // an all-zero tensor: scale 1
    DeviceBuffer partials(rank_amax, DType::F32);
    for (DType q_t : kFp8Types) {
        SCOPED_TRACE(std::string(dtype_name(q_t)));
        ScaleSlots amax(4 * kLayers), inv(16 * kLayers);
        cuda::max_over_ranks_fp8_scales(amax[0], inv[4], static_cast<const float*>(partials.get()), kTensors, kRanks,
                                        {4, 4, 16}, q_t, nullptr);
        for (int i = 0; i < kTensors; ++i) {
            float want = 0.0f;
            for (int r = 0; r < kRanks; ++r) want = std::max(want, rank_amax[r * kTensors + i]);
            const int l = i / 4, m = i % 4;
            EXPECT_EQ(bits(amax.get(4 * l + m)), bits(want)) << "tensor " << i;
            EXPECT_EQ(bits(inv.get(16 * l + 4 + m)), bits(fp8_scale_from_amax(want, q_t).inv)) << "tensor " << i;
        }
        EXPECT_EQ(inv.get(16 + 4 + 1), 1.0f);  // tensor 5 (layer 1, matrix 1) is all zero: scale 1
    }
}

TEST(Fp8Kernels, QuantizeTransposeBitExact) {
    QTRAIN_REQUIRE_GPU();
    struct Shape {
        int64_t rows, cols;
    };
    ScaleSlots slots(2);
    for (const Shape sh : {Shape{256, 896}, Shape{48, 80}, Shape{16, 16}, Shape{80, 1152}, Shape{1040, 64}})
        for (DType in_t : kInTypes)
            for (const Case& c : quantisation_cases(static_cast<std::size_t>(sh.rows * sh.cols), 300)) {
                const int64_t n = sh.rows * sh.cols;
                const std::vector<float> x = as_input(c.x, in_t);
                DeviceBuffer gx(c.x, in_t);
                cuda::abs_max(slots[0], in_t, gx.get(), n, nullptr);
                const float amax_ref = fp8_abs_max(x.data(), n);
                EXPECT_EQ(bits(slots.get(0)), bits(amax_ref));
                for (DType q_t : kFp8Types) {
                    SCOPED_TRACE(cat(c.name, ", ", sh.rows, "x", sh.cols, ", ", dtype_name(in_t), " -> ",
                                     dtype_name(q_t)));
                    const Fp8Scale s = fp8_scale_from_amax(amax_ref, q_t);
                    std::vector<uint8_t> want_t(n), want(n);
                    fp8_quantize_transpose(want_t.data(), q_t, x.data(), sh.rows, sh.cols, s.scale);
                    fp8_quantize(want.data(), q_t, x.data(), n, s.scale);
                    DeviceBuffer gt(n), gq(n);
                    gt.fill_bytes(0xAB);
                    gq.fill_bytes(0xAB);
                    slots.set(1, -1.0f);
                    cuda::quantize_fp8_transpose(gt.get(), q_t, gx.get(), in_t, sh.rows, sh.cols, slots[0], slots[1],
                                                 nullptr, gq.get());
                    sync_device();
                    EXPECT_TRUE(CodesEqual("transposed", to_host<uint8_t>(gt.get(), n), want_t, q_t, [&](std::size_t i) {
                        const int64_t col = static_cast<int64_t>(i) / sh.rows, row = static_cast<int64_t>(i) % sh.rows;
                        return x[row * sh.cols + col];
                    }));
                    EXPECT_TRUE(CodesEqual("row-major copy", to_host<uint8_t>(gq.get(), n), want, q_t,
                                           [&](std::size_t i) { return x[i]; }));
                    EXPECT_EQ(bits(slots.get(1)), bits(s.inv));
                    // transposing the quantised bytes gives the same as quantising transposed
                    DeviceBuffer gt2(n);
                    gt2.fill_bytes(0xAB);
                    cuda::transpose_fp8(gt2.get(), gq.get(), sh.rows, sh.cols, nullptr);
                    sync_device();
                    EXPECT_EQ(to_host<uint8_t>(gt2.get(), n), want_t) << "transpose_fp8 of the row-major copy";
                }
            }
    // the shape rules are checked
    DeviceBuffer gx(std::vector<float>(24 * 16, 1.0f), DType::F32), gt(24 * 16);
    EXPECT_ERROR(cuda::quantize_fp8_transpose(gt.get(), DType::E4M3, gx.get(), DType::F32, 24, 16, slots[0], slots[1],
                                              nullptr),
                 "multiples of 16");
    EXPECT_ERROR(cuda::quantize_fp8(gt.get(), DType::E4M3, gx.get(), DType::F32, 16, slots[0],
                                    slots[0] + 1, nullptr),
                 "16-byte aligned");
    EXPECT_ERROR(cuda::quantize_fp8(gt.get(), DType::BF16, gx.get(), DType::F32, 16, slots[0], slots[1], nullptr),
                 "e4m3 or e5m2");
}

// transpose_fp8 moves bytes as they are: every byte value (NaN codes included), random
// matrices of several shapes, against a host transpose.
TEST(Fp8Kernels, TransposeBytesExact) {
    QTRAIN_REQUIRE_GPU();
    Rng rng(31);
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{16, 16}, {64, 64}, {48, 80}, {896, 1152}, {4864, 896},
                              {1040, 64}}) {
        SCOPED_TRACE(cat(rows, "x", cols));
        std::vector<uint8_t> x(rows * cols), want(rows * cols);
        for (auto& b : x) b = static_cast<uint8_t>(rng.below(256));
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c) want[c * rows + r] = x[r * cols + c];
        DeviceBuffer gx(rows * cols), gt(rows * cols);
        CUDA_CHECK(cudaMemcpy(gx.get(), x.data(), x.size(), cudaMemcpyHostToDevice));
        gt.fill_bytes(0xAB);
        cuda::transpose_fp8(gt.get(), gx.get(), rows, cols, nullptr);
        sync_device();
        EXPECT_EQ(to_host<uint8_t>(gt.get(), rows * cols), want);
    }
    DeviceBuffer g(24 * 16);
    EXPECT_ERROR(cuda::transpose_fp8(g.get(), g.get(), 24, 12, nullptr), "multiples of 16");
}

// transpose_fp8 as LoRA's FP8 base uses it (Weights::transposed): one matrix at a time into one scratch
// buffer sized for the largest, from a row-major copy at a 64-byte (not 256-byte) offset. Fresh random
// bytes (seed printed) on shapes that are odd multiples of 16 (so never of the 64-byte tile) and a few
// drawn at random: the matrix's bytes are the host transpose, the scratch beyond them untouched, and
// transposing back gives the input.
TEST(Fp8Kernels, TransposeIntoScratchOnOddMultiplesOf16) {
    QTRAIN_REQUIRE_GPU();
    const uint64_t seed = std::random_device{}();
    SCOPED_TRACE(cat("seed ", seed));
    Rng rng(seed);
    std::vector<std::pair<int64_t, int64_t>> shapes = {{16, 16}, {16, 1040}, {1040, 16}, {48, 80}, {208, 336},
                                                       {336, 208}, {4112, 48}, {80, 2832}};
    for (int i = 0; i < 6; ++i)
        shapes.push_back({16 * (2 * static_cast<int64_t>(rng.below(60)) + 1), 16 * (2 * static_cast<int64_t>(rng.below(60)) + 1)});
    int64_t cap = 0;
    for (auto [r, c] : shapes) cap = std::max(cap, r * c);
    const int64_t lead = 64;  // (a tensor offset of the layout: 64-byte aligned, not 256)
    DeviceBuffer gx(lead + cap), scratch(cap), back(cap);
    constexpr uint8_t kGuard = 0x5A;
    for (auto [rows, cols] : shapes) {
        SCOPED_TRACE(cat(rows, "x", cols));
        const int64_t n = rows * cols;
        std::vector<uint8_t> x(n), want(n);
        for (auto& b : x) b = static_cast<uint8_t>(rng.below(256));
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c) want[c * rows + r] = x[r * cols + c];
        char* in = static_cast<char*>(gx.get()) + lead;
        CUDA_CHECK(cudaMemcpy(in, x.data(), n, cudaMemcpyHostToDevice));
        scratch.fill_bytes(kGuard);
        cuda::transpose_fp8(scratch.get(), in, rows, cols, nullptr);
        sync_device();
        const std::vector<uint8_t> got = to_host<uint8_t>(scratch.get(), cap);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin())) << "the transposed bytes";
        EXPECT_EQ(std::count(got.begin() + n, got.end(), kGuard), cap - n) << "bytes past the matrix were written";
        cuda::transpose_fp8(back.get(), scratch.get(), cols, rows, nullptr);
        sync_device();
        EXPECT_EQ(to_host<uint8_t>(back.get(), n), x) << "transposed back";
    }
}

// The FP8 path of the SwiGLU backward (swiglu_backward for the amax only, then the fused
// recompute-and-quantise kernel) against the two passes it replaces (swiglu_backward writing
// d(gate|up), then quantize_fp8_transpose of it): the same amax, inverse scale and every byte of both
// layouts. Shapes with partial 64 x 64 tiles in both directions, bf16 and fp32, e4m3 and e5m2.
TEST(Fp8Kernels, SwigluBackwardQuantizeTransposeEqualsTheTwoPassPath) {
    QTRAIN_REQUIRE_GPU();
    for (DType act : {DType::BF16, DType::F32})
        for (DType out : {DType::E5M2, DType::E4M3})
            for (auto [N, I] : {std::pair<int64_t, int64_t>{80, 336}, {256, 128}, {1040, 4864 / 4}}) {
                SCOPED_TRACE(cat(dtype_name(act), " -> ", dtype_name(out), " N ", N, " I ", I));
                const std::vector<float> gate_up = random_vector(N * 2 * I, 40, 3.0f);
                const std::vector<float> dout = random_vector(N * I, 41, 1e-3f);
                DeviceBuffer ggu(gate_up, act), gd(dout, act), dgu(N * 2 * I, act);
                ScaleSlots slots(4);  // 0: amax (two-pass), 1: its inverse scale, 2: amax (fused), 3: inverse
                DeviceBuffer ref_t(N * 2 * I), ref(N * 2 * I), got_t(N * 2 * I), got(N * 2 * I);
                got_t.fill_bytes(0xAB);
                got.fill_bytes(0xAB);
                cuda::swiglu_backward(act, dgu.get(), gd.get(), ggu.get(), static_cast<int>(N), static_cast<int>(I),
                                      nullptr, slots[0]);
                cuda::quantize_fp8_transpose(ref_t.get(), out, dgu.get(), act, N, 2 * I, slots[0], slots[1], nullptr,
                                             ref.get());
                cuda::swiglu_backward(act, nullptr, gd.get(), ggu.get(), static_cast<int>(N), static_cast<int>(I),
                                      nullptr, slots[2]);
                cuda::swiglu_backward_quantize_transpose(got_t.get(), got.get(), out, gd.get(), ggu.get(), act, N, I,
                                                         slots[2], slots[3], nullptr);
                sync_device();
                EXPECT_EQ(bits(slots.get(2)), bits(slots.get(0))) << "amax";
                EXPECT_EQ(bits(slots.get(3)), bits(slots.get(1))) << "inverse scale";
                EXPECT_EQ(to_host<uint8_t>(got.get(), N * 2 * I), to_host<uint8_t>(ref.get(), N * 2 * I)) << "row-major";
                EXPECT_EQ(to_host<uint8_t>(got_t.get(), N * 2 * I), to_host<uint8_t>(ref_t.get(), N * 2 * I))
                    << "transposed";
            }
    DeviceBuffer g(64 * 64 * 2);
    ScaleSlots slots(2);
    EXPECT_ERROR(cuda::swiglu_backward_quantize_transpose(g.get(), g.get(), DType::E5M2, g.get(), g.get(), DType::BF16,
                                                          24, 32, slots[0], slots[1], nullptr),
                 "multiples of 16");
}

// ---- GEMMs: operands quantised on the host (the kernels are tested above), uploaded as bytes ----

namespace {

struct QuantOperand {
    DeviceBuffer q;
    std::vector<uint8_t> host;
    DType type;
    float inv;
};

// Quantises x (row-major [rows, cols]) as the GEMM needs it: as is, or transposed ([cols, rows]).
QuantOperand quantise(const std::vector<float>& x, int64_t rows, int64_t cols, DType t, bool transpose,
                      const ScaleSlots& slots, int slot) {
    QuantOperand op;
    op.type = t;
    const Fp8Scale s = fp8_scale_from_amax(fp8_abs_max(x.data(), rows * cols), t);
    op.inv = s.inv;
    op.host.resize(static_cast<std::size_t>(rows * cols));
    if (transpose) fp8_quantize_transpose(op.host.data(), t, x.data(), rows, cols, s.scale);
    else fp8_quantize(op.host.data(), t, x.data(), rows * cols, s.scale);
    op.q = to_device(op.host);
    slots.set(slot, s.inv);
    return op;
}

constexpr int64_t kN = 256, kIn = 896, kOut = 1152;

// Calls after which every candidate of a shape has been timed enough times to decide, plus one
// made with the choice.
constexpr int calls_to_decide() { return GemmRunner::kAutotuneCandidates * (GemmRunner::kAutotuneSamples + 1) + 1; }

constexpr double kFp32Tol = 1e-3;
double tol_for(DType out) { return out == DType::BF16 ? 1e-2 : kFp32Tol; }

}  // namespace

TEST(Fp8Gemm, LinearForward) {
    QTRAIN_REQUIRE_GPU();
    GemmRunner gemm;
    ScaleSlots slots(2);
    const std::vector<float> x = random_vector(kN * kIn, 400), w = random_vector(kOut * kIn, 401, 0.02f);
    const std::vector<float> bias = round_bf16(random_vector(kOut, 402, 0.5f));
    DeviceBuffer gbias(bias, DType::BF16);
    struct Types {
        DType x, w;
    };
    // e4m3 x e4m3 (the forward), and e5m2 weights (cuBLASLt's e5m2 x e4m3: A = W)
    for (const Types ty : {Types{DType::E4M3, DType::E4M3}, Types{DType::E4M3, DType::E5M2}})
        for (DType y_t : {DType::BF16, DType::F32})
            for (bool with_bias : {false, true}) {
                const std::string what = cat("forward x ", dtype_name(ty.x), " W ", dtype_name(ty.w), " -> ",
                                             dtype_name(y_t), with_bias ? " + bias" : "");
                SCOPED_TRACE(what);
                QuantOperand xq = quantise(x, kN, kIn, ty.x, false, slots, 0);
                QuantOperand wq = quantise(w, kOut, kIn, ty.w, false, slots, 1);
                DeviceBuffer gy(kN * kOut, y_t);
                gy.fill_bytes(0xFF);
                gemm.linear_forward_fp8(gy.get(), y_t, xq.q.get(), xq.type, slots[0], wq.q.get(), wq.type, slots[1],
                                        with_bias ? gbias.get() : nullptr, kN, kIn, kOut, nullptr);
                sync_device();
                std::vector<float> ref(kN * kOut);
                fp8_gemm_reference(ref.data(), xq.host.data(), xq.type, xq.inv, wq.host.data(), wq.type, wq.inv,
                                   with_bias ? bias.data() : nullptr, kN, kOut, kIn);
                EXPECT_TRUE(Close(what, gy.download(), ref, tol_for(y_t), kOut));
            }
}

TEST(Fp8Gemm, LinearBackwardInput) {
    QTRAIN_REQUIRE_GPU();
    GemmRunner gemm;
    ScaleSlots slots(2);
    const std::vector<float> dy = random_vector(kN * kOut, 500, 1e-3f), w = random_vector(kOut * kIn, 501, 0.02f);
    for (DType dy_t : {DType::E5M2, DType::E4M3})
        for (DType dx_t : {DType::BF16, DType::F32}) {
            const std::string what = cat("backward input dy ", dtype_name(dy_t), " -> dx ", dtype_name(dx_t));
            SCOPED_TRACE(what);
            QuantOperand dyq = quantise(dy, kN, kOut, dy_t, false, slots, 0);
            QuantOperand wtq = quantise(w, kOut, kIn, DType::E4M3, true, slots, 1);  // W^T: [in, out]
            DeviceBuffer gdx(kN * kIn, dx_t);
            gdx.fill_bytes(0xFF);
            gemm.linear_backward_input_fp8(gdx.get(), dx_t, dyq.q.get(), dyq.type, slots[0], wtq.q.get(), wtq.type,
                                           slots[1], kN, kIn, kOut, nullptr);
            sync_device();
            std::vector<float> ref(kN * kIn);
            fp8_gemm_reference(ref.data(), dyq.host.data(), dyq.type, dyq.inv, wtq.host.data(), wtq.type, wtq.inv,
                               nullptr, kN, kIn, kOut);
            EXPECT_TRUE(Close(what, gdx.download(), ref, tol_for(dx_t), kIn));
        }
}

TEST(Fp8Gemm, LinearBackwardWeightAccumulates) {
    QTRAIN_REQUIRE_GPU();
    GemmRunner gemm;
    ScaleSlots slots(2);
    const std::vector<float> dy = random_vector(kN * kOut, 600, 1e-3f), x = random_vector(kN * kIn, 601);
    const std::vector<float> dw0 = random_vector(kOut * kIn, 602, 0.05f);
    for (bool accumulate : {true, false})
        for (DType dy_t : {DType::E5M2, DType::E4M3}) {
            const std::string what =
                cat("backward weight dy ", dtype_name(dy_t), accumulate ? ", fp32 dW += (beta 1)" : ", fp32 dW =");
            SCOPED_TRACE(what);
            QuantOperand dytq = quantise(dy, kN, kOut, dy_t, true, slots, 0);       // [out, N]
            QuantOperand xtq = quantise(x, kN, kIn, DType::E4M3, true, slots, 1);  // [in, N]
            DeviceBuffer gdw(dw0, DType::F32);
            gemm.linear_backward_weight_fp8(gdw.f32(), DType::F32, dytq.q.get(), dytq.type, slots[0], xtq.q.get(),
                                            xtq.type, slots[1], kN, kIn, kOut, accumulate, nullptr);
            sync_device();
            std::vector<float> ref = dw0;
            fp8_gemm_reference(ref.data(), dytq.host.data(), dytq.type, dytq.inv, xtq.host.data(), xtq.type, xtq.inv,
                               nullptr, kOut, kIn, kN, accumulate ? 1.0f : 0.0f);
            const std::vector<float> got = gdw.download();
            EXPECT_TRUE(Close(what, got, ref, kFp32Tol, kIn));
            if (accumulate) {
                // the product part alone, so the accumulated dW0 cannot hide a wrong product
                std::vector<float> prod(kOut * kIn), got_prod(kOut * kIn);
                fp8_gemm_reference(prod.data(), dytq.host.data(), dytq.type, dytq.inv, xtq.host.data(), xtq.type,
                                   xtq.inv, nullptr, kOut, kIn, kN);
                for (std::size_t i = 0; i < got.size(); ++i) got_prod[i] = got[i] - dw0[i];
                EXPECT_TRUE(Close(what + " (product part)", got_prod, prod, kFp32Tol, kIn));
            }
        }
}

// LoRA's adapters written first (lora_adapters.h, writes_whole): the frozen base's forward and
// input-gradient GEMMs add their product onto the bf16 y / dx the adapters wrote (beta = 1, C = D bf16),
// with a bias in the forward, with and without fast accumulation.
TEST(Fp8Gemm, ForwardAndInputGradientAccumulateOntoABf16Output) {
    QTRAIN_REQUIRE_GPU();
    GemmRunner gemm;
    ScaleSlots slots(2);
    const std::vector<float> x = random_vector(kN * kIn, 650), w = random_vector(kOut * kIn, 651, 0.02f);
    const std::vector<float> dy = random_vector(kN * kOut, 652, 1e-3f);
    const std::vector<float> bias = round_bf16(random_vector(kOut, 653, 0.5f));
    const std::vector<float> y0 = round_bf16(random_vector(kN * kOut, 654, 0.5f));
    const std::vector<float> dx0 = round_bf16(random_vector(kN * kIn, 655, 1e-3f));
    DeviceBuffer gbias(bias, DType::BF16);
    for (bool fast : {false, true}) {
        const std::string fwd = cat("forward y bf16 += x W^T + bias", fast ? ", fast accumulation" : "");
        SCOPED_TRACE(fwd);
        QuantOperand xq = quantise(x, kN, kIn, DType::E4M3, false, slots, 0);
        QuantOperand wq = quantise(w, kOut, kIn, DType::E4M3, false, slots, 1);
        DeviceBuffer gy(y0, DType::BF16);
        gemm.linear_forward_fp8(gy.get(), DType::BF16, xq.q.get(), xq.type, slots[0], wq.q.get(), wq.type, slots[1],
                                gbias.get(), kN, kIn, kOut, nullptr, 1.0f, fast);
        sync_device();
        std::vector<float> ref = y0;
        fp8_gemm_reference(ref.data(), xq.host.data(), xq.type, xq.inv, wq.host.data(), wq.type, wq.inv, bias.data(),
                           kN, kOut, kIn, 1.0f);
        EXPECT_TRUE(Close(fwd, gy.download(), ref, 1e-2, kOut));

        const std::string bwd = cat("input gradient dx bf16 += dy W", fast ? ", fast accumulation" : "");
        SCOPED_TRACE(bwd);
        QuantOperand dyq = quantise(dy, kN, kOut, DType::E5M2, false, slots, 0);
        QuantOperand wtq = quantise(w, kOut, kIn, DType::E4M3, true, slots, 1);  // W^T: [in, out]
        DeviceBuffer gdx(dx0, DType::BF16);
        gemm.linear_backward_input_fp8(gdx.get(), DType::BF16, dyq.q.get(), dyq.type, slots[0], wtq.q.get(),
                                       wtq.type, slots[1], kN, kIn, kOut, nullptr, 1.0f, fast);
        sync_device();
        std::vector<float> dref = dx0;
        fp8_gemm_reference(dref.data(), dyq.host.data(), dyq.type, dyq.inv, wtq.host.data(), wtq.type, wtq.inv,
                           nullptr, kN, kIn, kOut, 1.0f);
        EXPECT_TRUE(Close(bwd, gdx.download(), dref, 1e-2, kIn));
    }
}

TEST(Fp8Gemm, FastAccumulation) {
    QTRAIN_REQUIRE_GPU();
    GemmRunner gemm;
    ScaleSlots slots(2);
    const std::vector<float> x = random_vector(kN * kIn, 700), w = random_vector(kOut * kIn, 701, 0.02f);
    QuantOperand xq = quantise(x, kN, kIn, DType::E4M3, false, slots, 0);
    QuantOperand wq = quantise(w, kOut, kIn, DType::E4M3, false, slots, 1);
    DeviceBuffer gy(kN * kOut, DType::F32);
    gemm.linear_forward_fp8(gy.get(), DType::F32, xq.q.get(), xq.type, slots[0], wq.q.get(), wq.type, slots[1],
                            nullptr, kN, kIn, kOut, nullptr, 0.0f, /*fast_accum=*/true);
    sync_device();
    std::vector<float> ref(kN * kOut);
    fp8_gemm_reference(ref.data(), xq.host.data(), xq.type, xq.inv, wq.host.data(), wq.type, wq.inv, nullptr, kN,
                       kOut, kIn);
    EXPECT_TRUE(Close("forward fp32, fast accumulation", gy.download(), ref, 1e-2, kOut));
}

// --gemm-autotune: a shape's first calls try cuBLASLt's candidates in turn, timed in place. Every one
// of those calls must still be the right product (an accumulating one, beta = 1 as for the weight
// gradients, adds its product exactly once per call), the shape must be decided after enough calls,
// and a second runner in the process must reuse the first one's choices (so models compared in one
// process use the same algorithms) and then give the same bits. Shapes unique to this test.
TEST(GemmAutotune, EveryTrialCallIsRightAndChoicesAreSharedInTheProcess) {
    QTRAIN_REQUIRE_GPU();
    constexpr int64_t N = 320, In = 640, Out = 768;
    constexpr int kCalls = calls_to_decide();
    ScaleSlots slots(2);
    const std::vector<float> x = random_vector(N * In, 900), w = random_vector(Out * In, 901, 0.02f);
    const std::vector<float> dy = random_vector(N * Out, 902, 1e-3f), dw0 = random_vector(Out * In, 903, 0.05f);
    QuantOperand xq = quantise(x, N, In, DType::E4M3, false, slots, 0);
    QuantOperand wq = quantise(w, Out, In, DType::E4M3, false, slots, 1);
    std::vector<float> y_ref(N * Out);
    fp8_gemm_reference(y_ref.data(), xq.host.data(), xq.type, xq.inv, wq.host.data(), wq.type, wq.inv, nullptr, N,
                       Out, In);
    // bf16 weight gradient accumulated into fp32 (the LM head's path): dW += dy^T x, kCalls times
    const std::vector<float> xb = round_bf16(x), dyb = round_bf16(dy);
    DeviceBuffer gx(xb, DType::BF16), gdy(dyb, DType::BF16);
    std::vector<float> prod_ref(Out * In, 0.0f);
    for (int64_t o = 0; o < Out; ++o)
        for (int64_t n = 0; n < N; ++n) {
            const float g = dyb[n * Out + o];
            for (int64_t i = 0; i < In; ++i) prod_ref[o * In + i] += g * xb[n * In + i];
        }

    struct Result {
        std::vector<float> y_first, y_last, dw;
        GemmTuningStats stats;
    };
    auto run = [&] {
        GemmRunner gemm(16 << 20, /*autotune=*/true);
        DeviceBuffer gy(N * Out, DType::F32), gdw(dw0, DType::F32);
        Result r;
        for (int call = 0; call < kCalls; ++call) {
            gemm.linear_forward_fp8(gy.get(), DType::F32, xq.q.get(), xq.type, slots[0], wq.q.get(), wq.type,
                                    slots[1], nullptr, N, In, Out, nullptr);
            gemm.linear_backward_weight(gdw.f32(), DType::F32, gdy.get(), gx.get(), DType::BF16, N, In, Out, true,
                                        nullptr);
            sync_device();  // so the trial timings are ready at the next call
            if (call == 0) r.y_first = gy.download();
        }
        r.y_last = gy.download();
        r.dw = gdw.download();
        r.stats = gemm.tuning_stats();
        return r;
    };
    const Result first = run();
    EXPECT_TRUE(Close("autotuned FP8 forward, first trial call", first.y_first, y_ref, kFp32Tol, Out));
    EXPECT_TRUE(Close("autotuned FP8 forward, after the decision", first.y_last, y_ref, kFp32Tol, Out));
    std::vector<float> prod(Out * In);
    for (std::size_t i = 0; i < prod.size(); ++i) prod[i] = (first.dw[i] - dw0[i]) / kCalls;
    EXPECT_TRUE(Close("accumulating dW over the trial calls (product part / calls)", prod, prod_ref, 1e-4, In));
    std::printf("[autotune] first runner: %d shapes decided, %d still trying, %lld timed calls; "
                "heuristic %.4f ms -> kept %.4f ms\n",
                first.stats.shapes_tuned, first.stats.shapes_exploring,
                static_cast<long long>(first.stats.calls_timed), first.stats.heuristic_ms, first.stats.chosen_ms);
    EXPECT_EQ(first.stats.shapes_exploring, 0);
    EXPECT_GE(first.stats.shapes_tuned, 1) << "cuBLASLt offered one algorithm for both shapes: nothing was tuned";
    EXPECT_EQ(first.stats.shapes_from_cache, 0);

    const Result second = run();
    EXPECT_EQ(second.stats.shapes_tuned, 0);
    EXPECT_EQ(second.stats.calls_timed, 0);
    EXPECT_EQ(second.stats.shapes_from_cache, first.stats.shapes_tuned);
    EXPECT_EQ(second.y_first, first.y_last);  // the same algorithm from the second runner's first call
}

TEST(Fp8Gemm, RejectsWhatCublasLtCannotDo) {
    QTRAIN_REQUIRE_GPU();
    GemmRunner gemm;
    ScaleSlots slots(2);
    DeviceBuffer a(64 * 64), b(64 * 64), y(64 * 64, DType::F32);
    EXPECT_ERROR(gemm.linear_forward_fp8(y.get(), DType::F32, a.get(), DType::E5M2, slots[0], b.get(), DType::E5M2,
                                         slots[1], nullptr, 64, 64, 64, nullptr),
                 "e5m2 x e5m2");
    EXPECT_ERROR(gemm.linear_forward_fp8(y.get(), DType::F32, a.get(), DType::E4M3, slots[0] + 1, b.get(),
                                         DType::E4M3, slots[1], nullptr, 64, 64, 64, nullptr),
                 "16-byte aligned");
    EXPECT_ERROR(gemm.linear_forward_fp8(y.get(), DType::F32, a.get(), DType::E4M3, slots[0], b.get(), DType::E4M3,
                                         slots[1], nullptr, 64, 40, 64, nullptr),
                 "multiples of 16");
    EXPECT_ERROR(gemm.linear_forward_fp8(y.get(), DType::F32, a.get(), DType::E4M3, slots[0], b.get(), DType::BF16,
                                         slots[1], nullptr, 64, 64, 64, nullptr),
                 "both operands must be fp8");
    GemmOp nn;  // the NN layout of the bf16 input-gradient path is not available in FP8
    nn.trans_a = false;
    nn.m = nn.n = nn.k = nn.lda = nn.ldb = nn.ldc = 64;
    nn.a = a.get(), nn.b = b.get(), nn.c = y.get();
    nn.a_type = nn.b_type = DType::E4M3;
    nn.c_type = DType::F32;
    nn.a_scale = slots[0], nn.b_scale = slots[1];
    EXPECT_ERROR(gemm.run(nn, nullptr), "TN layout");
}

// The whole chain on the GPU (abs_max -> quantize / quantize_transpose -> FP8 GEMM) against the
// emulated chain, and, as a sanity figure, against the unquantised bf16 product.
TEST(Fp8Gemm, QuantizedForwardChain) {
    QTRAIN_REQUIRE_GPU();
    GemmRunner gemm;
    ScaleSlots slots(4);
    const std::vector<float> x = round_bf16(random_vector(kN * kIn, 800)),
                             w = round_bf16(random_vector(kOut * kIn, 801, 0.02f));
    DeviceBuffer gx(x, DType::BF16), gw(w, DType::BF16), xq(kN * kIn), wq(kOut * kIn), wtq(kOut * kIn),
        gy(kN * kOut, DType::F32);
    cuda::abs_max(slots[0], DType::BF16, gx.get(), kN * kIn, nullptr);
    cuda::quantize_fp8(xq.get(), DType::E4M3, gx.get(), DType::BF16, kN * kIn, slots[0], slots[1], nullptr);
    cuda::abs_max(slots[2], DType::BF16, gw.get(), kOut * kIn, nullptr);
    cuda::quantize_fp8_transpose(wtq.get(), DType::E4M3, gw.get(), DType::BF16, kOut, kIn, slots[2], slots[3],
                                 nullptr, wq.get());
    gemm.linear_forward_fp8(gy.get(), DType::F32, xq.get(), DType::E4M3, slots[1], wq.get(), DType::E4M3, slots[3],
                            nullptr, kN, kIn, kOut, nullptr);
    sync_device();
    const Fp8Tensor xr = fp8_quantize_tensor(x, DType::E4M3), wr = fp8_quantize_tensor(w, DType::E4M3);
    std::vector<float> ref(kN * kOut), exact(kN * kOut);
    fp8_gemm_reference(ref.data(), xr.q.data(), DType::E4M3, xr.scale.inv, wr.q.data(), DType::E4M3, wr.scale.inv,
                       nullptr, kN, kOut, kIn);
    const std::vector<float> got = gy.download();
    EXPECT_TRUE(Close("quantised chain vs emulated chain", got, ref, kFp32Tol, kOut));
    for (int64_t i = 0; i < kN; ++i)
        for (int64_t o = 0; o < kOut; ++o) {
            double acc = 0;
            for (int64_t k = 0; k < kIn; ++k) acc += static_cast<double>(x[i * kIn + k]) * w[o * kIn + k];
            exact[i * kOut + o] = static_cast<float>(acc);
        }
    const Comparison c = compare(got, exact);
    std::cout << "[fp8] e4m3 forward vs unquantised product: rel max err " << c.rel_err << ", cosine " << c.cosine
              << std::endl;
    EXPECT_GT(c.cosine, 0.995);
}
