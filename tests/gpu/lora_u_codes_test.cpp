// cuda::lora_u_codes (LoRA's u = x A^T and x's FP8 codes in one read of x) against the CPU reference
// for u and against quantize_fp8 for the codes, byte for byte, on fresh random inputs: rows and columns
// off the kernel's 64 x 128 tiles, every padded width, u written into a wider buffer with the columns
// around it untouched, e4m3 and e5m2; the support checks on the CPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/fp8.h"
#include "cuda/kernels.h"
#include "gpu_test_util.h"

namespace qtrain::test {
namespace {

void run_case(int64_t N, int64_t in, int W, int64_t ldu, DType type, uint64_t seed) {
    SCOPED_TRACE(testing::Message() << "N=" << N << " in=" << in << " W=" << W << " " << dtype_name(type));
    const auto x = round_bf16(random_vector(N * in, seed, 2.0f));
    const auto A = round_bf16(random_vector(W * in, seed + 1, 0.05f));
    const auto u0 = round_bf16(random_vector(N * ldu, seed + 2));  // the columns past W stay
    std::vector<float> u_ref = u0;
    for (int64_t n = 0; n < N; ++n)
        for (int j = 0; j < W; ++j) {
            double acc = 0;
            for (int64_t c = 0; c < in; ++c) acc += double(x[n * in + c]) * A[j * in + c];
            u_ref[n * ldu + j] = static_cast<float>(acc);
        }
    DeviceBuffer gx(x, DType::BF16), gA(A, DType::BF16), gu(u0, DType::BF16), amax(16), inv(16), codes(N * in),
        ref_codes(N * in), ref_inv(16);
    cuda::abs_max(amax.f32(), DType::BF16, gx.get(), N * in, nullptr);
    cuda::quantize_fp8(ref_codes.get(), type, gx.get(), DType::BF16, N * in, amax.f32(), ref_inv.f32(), nullptr);
    codes.fill_bytes(0xAB);
    cuda::Fp8CodesOut c;
    c.codes = codes.get(), c.ldc = in, c.type = type, c.amax = amax.f32(), c.inv_out = inv.f32();
    ASSERT_TRUE(cuda::lora_u_codes_supported(DType::BF16, gx.get(), in, gA.get(), W, c));
    cuda::lora_u_codes(gu.get(), ldu, gx.get(), N, in, gA.get(), W, c, nullptr);
    sync_device();
    const auto u = gu.download();
    EXPECT_LT(rel_max_error(cut(u, N, ldu, 0, W), cut(u_ref, N, ldu, 0, W)), 8e-3);
    for (int64_t n = 0; n < N; ++n)
        for (int64_t j = W; j < ldu; ++j) ASSERT_EQ(u[n * ldu + j], u0[n * ldu + j]) << "u row " << n << " column " << j;
    const auto got = to_host<uint8_t>(codes.get(), N * in), want = to_host<uint8_t>(ref_codes.get(), N * in);
    int64_t wrong = 0;
    for (int64_t i = 0; i < N * in; ++i) wrong += got[i] != want[i];
    EXPECT_EQ(wrong, 0) << "codes differing from quantize_fp8's";
    EXPECT_EQ(to_host<float>(inv.get(), 1), to_host<float>(ref_inv.get(), 1));
    // the same call again: the same bytes
    cuda::lora_u_codes(gu.get(), ldu, gx.get(), N, in, gA.get(), W, c, nullptr);
    sync_device();
    EXPECT_EQ(gu.download(), u);
}

TEST(LoraUCodes, MatchesTheReferenceAndQuantizeFp8) {
    QTRAIN_REQUIRE_GPU();
    run_case(150, 776, 48, 48, DType::E4M3, 10);  // q|k|v's three rank-16 A's; 776 = 6 chunks + 8 columns
    run_case(64, 128, 16, 24, DType::E5M2, 20);   // one tile, one chunk; u inside a wider buffer
    run_case(1, 264, 8, 8, DType::E4M3, 30);      // one row; rank 8, padded to 16
    run_case(200, 520, 96, 96, DType::E5M2, 40);  // the widest: three rank-32 A's
    run_case(130, 384, 32, 40, DType::E4M3, 50);  // gate|up's two
    run_case(70, 256, 72, 72, DType::E5M2, 60);   // three rank-24 A's, padded to 96
}

TEST(LoraUCodes, TakesOnlyWhatItSupports) {
    // host-side checks (no GPU needed)
    alignas(16) static uint16_t buf[64];
    float amax = 1.0f;
    cuda::Fp8CodesOut c;
    c.codes = buf, c.ldc = 512, c.type = DType::E4M3, c.amax = &amax;
    const void* a = buf;
    const void* odd = buf + 1;
    EXPECT_TRUE(cuda::lora_u_codes_supported(DType::BF16, a, 512, a, 48, c));
    EXPECT_TRUE(cuda::lora_u_codes_supported(DType::BF16, a, 512, a, 96, c));
    EXPECT_FALSE(cuda::lora_u_codes_supported(DType::F32, a, 512, a, 48, c));    // fp32 model
    EXPECT_FALSE(cuda::lora_u_codes_supported(DType::BF16, a, 512, a, 104, c));  // wider than 96
    EXPECT_FALSE(cuda::lora_u_codes_supported(DType::BF16, a, 512, a, 12, c));   // W % 8
    EXPECT_FALSE(cuda::lora_u_codes_supported(DType::BF16, odd, 512, a, 48, c));
    EXPECT_FALSE(cuda::lora_u_codes_supported(DType::BF16, a, 512, odd, 48, c));
    c.ldc = 520;
    EXPECT_FALSE(cuda::lora_u_codes_supported(DType::BF16, a, 512, a, 48, c));  // the codes' rows are x's
    c.ldc = 500;
    EXPECT_FALSE(cuda::lora_u_codes_supported(DType::BF16, a, 500, a, 48, c));  // in % 8
}

}  // namespace
}  // namespace qtrain::test
