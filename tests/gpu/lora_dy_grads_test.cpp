// cuda::lora_dy_grads (LoRA's g = s dy B and dB += s dy^T u in one read of dy) against the CPU
// reference on fresh random inputs: slices of wider buffers as the model passes them (a target's
// columns of a fused dy, its rank-r columns of a stacked u and g), shapes off the kernel's tiles,
// every padded rank, one token strip and several, dy's FP8 codes in the same read; the plan's grid and workspace on the CPU (no GPU).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/fp8.h"
#include "cuda/kernels.h"
#include "gpu_test_util.h"

namespace qtrain::test {
namespace {

struct Case {
    int64_t N, out, r;
    int64_t ldy, col;  // dy: [N, ldy], the target's columns from `col`
    int64_t ldu, ucol; // u and g: [N, ldu], the target's rank columns from `ucol`
    int sms;           // the SM count the plan assumes (1: one token strip)
};

void run_case(const Case& c, uint64_t seed) {
    SCOPED_TRACE(testing::Message() << "N=" << c.N << " out=" << c.out << " r=" << c.r << " sms=" << c.sms);
    const float scale = 2.0f;  // alpha / r of some adapter: not 1, so a missing scale shows
    const auto dy = round_bf16(random_vector(c.N * c.ldy, seed));
    const auto B = round_bf16(random_vector(c.out * c.r, seed + 1, 0.05f));
    const auto u = round_bf16(random_vector(c.N * c.ldu, seed + 2));
    const auto g0 = round_bf16(random_vector(c.N * c.ldu, seed + 3));  // the columns outside the target's stay
    const auto db0 = random_vector(c.out * c.r, seed + 4);              // dB accumulates

    // the reference, in double from the bf16 values
    std::vector<float> g_ref = g0, db_ref = db0;
    for (int64_t n = 0; n < c.N; ++n)
        for (int64_t j = 0; j < c.r; ++j) {
            double acc = 0;
            for (int64_t o = 0; o < c.out; ++o) acc += double(dy[n * c.ldy + c.col + o]) * B[o * c.r + j];
            g_ref[n * c.ldu + c.ucol + j] = static_cast<float>(scale * acc);
        }
    for (int64_t o = 0; o < c.out; ++o)
        for (int64_t j = 0; j < c.r; ++j) {
            double acc = 0;
            for (int64_t n = 0; n < c.N; ++n) acc += double(dy[n * c.ldy + c.col + o]) * u[n * c.ldu + c.ucol + j];
            db_ref[o * c.r + j] = static_cast<float>(db0[o * c.r + j] + scale * acc);
        }

    DeviceBuffer gdy(dy, DType::BF16), gB(B, DType::BF16), gu(u, DType::BF16), gdb(db0, DType::F32);
    const void* dy_slice = gdy.as<uint16_t>() + c.col;
    const void* u_slice = gu.as<uint16_t>() + c.ucol;
    ASSERT_TRUE(cuda::lora_dy_grads_supported(DType::BF16, dy_slice, c.ldy, u_slice, c.ldu, c.out, c.r));
    const cuda::LoraDyGradsPlan plan = cuda::plan_lora_dy_grads(c.N, c.out, c.r, c.sms);
    DeviceBuffer ws(plan.workspace_bytes);
    ws.fill_bytes(0xFF);  // NaN: a partial the kernel should have written and did not shows in the sums

    std::vector<float> g_got, db_got;
    for (int rep = 0; rep < 2; ++rep) {
        DeviceBuffer gg(g0, DType::BF16);
        gdb.upload(db0);
        cuda::lora_dy_grads(plan, gg.as<uint16_t>() + c.ucol, c.ldu, gdb.f32(), dy_slice, c.ldy, gB.get(), u_slice,
                            c.ldu, scale, ws.get(), nullptr);
        sync_device();
        const auto g = gg.download(), db = gdb.download();
        if (rep == 0) {
            g_got = g, db_got = db;
            continue;
        }
        EXPECT_EQ(g, g_got) << "g differs between two identical calls";
        EXPECT_EQ(db, db_got) << "dB differs between two identical calls";
    }
    // the target's columns: bf16 output (rounded once from fp32 sums); dB: fp32 sums of exact products
    EXPECT_LT(rel_max_error(cut(g_got, c.N, c.ldu, c.ucol, c.r), cut(g_ref, c.N, c.ldu, c.ucol, c.r)), 8e-3);
    EXPECT_LT(rel_max_error(db_got, db_ref), 1e-5);
    // every other column of g is as it was
    for (int64_t n = 0; n < c.N; ++n)
        for (int64_t j = 0; j < c.ldu; ++j)
            if (j < c.ucol || j >= c.ucol + c.r)
                ASSERT_EQ(g_got[n * c.ldu + j], g0[n * c.ldu + j]) << "g row " << n << " column " << j;
}

TEST(LoraDyGrads, MatchesTheReferenceOnTargetSlices) {
    QTRAIN_REQUIRE_GPU();
    // q|k|v-like: k's columns of a fused dy, the second of three stacked rank-16 slices
    run_case({200, 520, 16, 1000, 104, 48, 16, 132}, 10);
    // gate|up-like, tokens and columns a whole number of tiles, several token strips
    run_case({1024, 1024, 16, 2048, 1024, 32, 16, 8}, 20);
    // one token strip walking every tile; columns off the 256-column strip
    run_case({333, 776, 16, 776, 0, 16, 0, 1}, 30);
}

TEST(LoraDyGrads, EveryPaddedRank) {
    QTRAIN_REQUIRE_GPU();
    run_case({130, 264, 8, 264, 0, 8, 0, 4}, 40);      // rank 8: padded to 16 with zeros
    run_case({190, 512, 24, 600, 88, 48, 24, 16}, 50);  // rank 24: padded to 32
    run_case({257, 384, 32, 384, 0, 64, 32, 132}, 60);  // rank 32
}

// With codes: the same g and dB, and dy's FP8 codes byte for byte as quantize_fp8 writes them for the
// target's slice (and its 1/scale), the bytes around the slice untouched; e4m3 and e5m2.
TEST(LoraDyGrads, WritesDysCodesAsQuantizeFp8Does) {
    QTRAIN_REQUIRE_GPU();
    const int64_t N = 150, out = 776, ldy = 1000, col = 104, r = 16;
    const float scale = 2.0f;
    const auto dy = round_bf16(random_vector(N * ldy, 70, 3.0f));
    const auto B = round_bf16(random_vector(out * r, 71, 0.05f));
    const auto u = round_bf16(random_vector(N * r, 72));
    DeviceBuffer gdy(dy, DType::BF16), gB(B, DType::BF16), gu(u, DType::BF16);
    const void* dy_slice = gdy.as<uint16_t>() + col;
    // the reference codes: the slice made contiguous, quantised by quantize_fp8 with the whole dy's amax
    DeviceBuffer slice(cut(dy, N, ldy, col, out), DType::BF16), amax(16), ref_codes(N * out), ref_inv(16);
    cuda::abs_max(amax.f32(), DType::BF16, gdy.get(), N * ldy, nullptr);
    const cuda::LoraDyGradsPlan plan = cuda::plan_lora_dy_grads(N, out, r, 132);
    DeviceBuffer ws(plan.workspace_bytes);
    for (DType type : {DType::E4M3, DType::E5M2}) {
        SCOPED_TRACE(dtype_name(type));
        cuda::quantize_fp8(ref_codes.get(), type, slice.get(), DType::BF16, N * out, amax.f32(), ref_inv.f32(), nullptr);
        DeviceBuffer codes(N * ldy), inv(16), g0(N * r, DType::BF16), g1(N * r, DType::BF16), db0(out * r, DType::F32),
            db1(out * r, DType::F32);
        codes.fill_bytes(0xAB);
        cuda::Fp8CodesOut c;
        c.codes = codes.as<uint8_t>() + col, c.ldc = ldy, c.type = type, c.amax = amax.f32(), c.inv_out = inv.f32();
        ASSERT_TRUE(cuda::fp8_codes_out_supported(c));
        cuda::lora_dy_grads(plan, g0.get(), r, db0.f32(), dy_slice, ldy, gB.get(), gu.get(), r, scale, ws.get(), nullptr);
        cuda::lora_dy_grads(plan, g1.get(), r, db1.f32(), dy_slice, ldy, gB.get(), gu.get(), r, scale, ws.get(), nullptr,
                            &c);
        sync_device();
        EXPECT_EQ(g1.download(), g0.download()) << "the codes changed g";
        EXPECT_EQ(db1.download(), db0.download()) << "the codes changed dB";
        const auto got = to_host<uint8_t>(codes.get(), N * ldy), want = to_host<uint8_t>(ref_codes.get(), N * out);
        int64_t wrong = 0, outside = 0;
        for (int64_t n = 0; n < N; ++n)
            for (int64_t j = 0; j < ldy; ++j) {
                const uint8_t b = got[n * ldy + j];
                if (j >= col && j < col + out) wrong += b != want[n * out + j - col];
                else outside += b != 0xAB;
            }
        EXPECT_EQ(wrong, 0) << "codes differing from quantize_fp8's";
        EXPECT_EQ(outside, 0) << "bytes written outside the slice";
        EXPECT_EQ(to_host<float>(inv.get(), 1), to_host<float>(ref_inv.get(), 1));
    }
}

TEST(LoraDyGrads, TakesOnlyWhatItSupports) {
    // host-side checks (no GPU needed)
    alignas(16) static uint16_t buf[64];
    const void* a = buf;
    const void* odd = buf + 1;  // 2-byte aligned
    EXPECT_TRUE(cuda::lora_dy_grads_supported(DType::BF16, a, 64, a, 16, 512, 16));
    EXPECT_FALSE(cuda::lora_dy_grads_supported(DType::F32, a, 64, a, 16, 512, 16));   // fp32 model
    EXPECT_FALSE(cuda::lora_dy_grads_supported(DType::BF16, a, 64, a, 16, 512, 12));  // r % 8
    EXPECT_FALSE(cuda::lora_dy_grads_supported(DType::BF16, a, 64, a, 64, 512, 64));  // r > 32
    EXPECT_FALSE(cuda::lora_dy_grads_supported(DType::BF16, a, 64, a, 16, 500, 16));  // out % 8
    EXPECT_FALSE(cuda::lora_dy_grads_supported(DType::BF16, a, 60, a, 16, 512, 16));  // ldy % 8
    EXPECT_FALSE(cuda::lora_dy_grads_supported(DType::BF16, a, 64, a, 20, 512, 16));  // ldu % 8
    EXPECT_FALSE(cuda::lora_dy_grads_supported(DType::BF16, odd, 64, a, 16, 512, 16));
    EXPECT_FALSE(cuda::lora_dy_grads_supported(DType::BF16, a, 64, odd, 16, 512, 16));
    float amax = 1.0f;
    cuda::Fp8CodesOut c;
    c.codes = buf, c.ldc = 64, c.type = DType::E4M3, c.amax = &amax;
    EXPECT_TRUE(cuda::fp8_codes_out_supported(c));
    c.type = DType::E5M2;
    EXPECT_TRUE(cuda::fp8_codes_out_supported(c));
    c.type = DType::BF16;
    EXPECT_FALSE(cuda::fp8_codes_out_supported(c));  // not an FP8 type
    c.type = DType::E4M3, c.ldc = 60;
    EXPECT_FALSE(cuda::fp8_codes_out_supported(c));  // row stride
    c.ldc = 64, c.codes = reinterpret_cast<uint8_t*>(buf) + 4;
    EXPECT_FALSE(cuda::fp8_codes_out_supported(c));  // 8-byte alignment
    c.codes = buf, c.amax = nullptr;
    EXPECT_FALSE(cuda::fp8_codes_out_supported(c));  // no amax
}

TEST(LoraDyGrads, PlanFillsOneWaveOfTwoBlocksAnSm) {
    // Qwen2.5-7B's gate at 12 x 2048 tokens on 132 SMs: 74 column strips x 3 token strips (222 of the
    // 264 slots: 4 would make a second wave of 32 blocks)
    const auto gate = cuda::plan_lora_dy_grads(24576, 18944, 16, 132);
    EXPECT_EQ(gate.col_strips, 74);
    EXPECT_EQ(gate.token_strips, 3);
    EXPECT_EQ(gate.n_pad, 24576);
    EXPECT_EQ(gate.out_pad, 18944);
    EXPECT_EQ(gate.workspace_bytes, 4u * 16u * (74u * 24576u + 3u * 18944u));
    // k (512 columns): 2 column strips, 132 token strips of the 384 tiles
    const auto k = cuda::plan_lora_dy_grads(24576, 512, 16, 132);
    EXPECT_EQ(k.col_strips, 2);
    EXPECT_EQ(k.token_strips, 132);
    // fewer tiles than the strips asked for: one strip a tile; rank 8 pads to 16, 24 to 32
    const auto small = cuda::plan_lora_dy_grads(100, 300, 8, 132);
    EXPECT_EQ(small.token_strips, 2);
    EXPECT_EQ(small.n_pad, 128);
    EXPECT_EQ(small.out_pad, 512);
    EXPECT_EQ(small.workspace_bytes, 4u * 16u * (2u * 128u + 2u * 512u));
    EXPECT_EQ(cuda::plan_lora_dy_grads(100, 300, 24, 132).workspace_bytes, 4u * 32u * (2u * 128u + 2u * 512u));
    // the bound a plan without the device uses: at least any SM count's workspace
    for (int sms : {1, 78, 132, 148, 160, 1000})
        for (int64_t out : {512, 3584, 18944})
            EXPECT_LE(cuda::plan_lora_dy_grads(24576, out, 16, sms).workspace_bytes,
                      cuda::lora_dy_grads_workspace_bound(24576, out, 16))
                << "sms " << sms << " out " << out;
    // (2 column strips share the 2 x 160 slots of the largest SM count planned for)
    EXPECT_EQ(cuda::plan_lora_dy_grads(24576, 512, 16, 1000).token_strips, cuda::kLoraDyGradsMaxSms);
}

}  // namespace
}  // namespace qtrain::test
