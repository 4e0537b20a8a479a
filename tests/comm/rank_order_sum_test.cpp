// The summation all backends share, against the plain loops of comm_reference.h.
#include <gtest/gtest.h>

#include <vector>

#include "comm/even_split.h"
#include "comm/rank_order_sum.h"
#include "comm_reference.h"
#include "test_util.h"

namespace qtrain::test {
namespace {

TEST(CommRankOrderSum, F32AndBf16EqualTheReferenceAcrossTiles) {
    for (int n : {1, 2, 3, 5}) {
        const std::size_t count = 5000;  // more than two 2048-element tiles, not a multiple of one
        const auto data = world_data(7, n, count);
        std::vector<const void*> f32(n), b16(n);
        std::vector<std::vector<uint16_t>> halves;
        for (int q = 0; q < n; ++q) halves.push_back(as_bf16(data[q]));
        for (int q = 0; q < n; ++q) f32[q] = data[q].data(), b16[q] = halves[q].data();

        std::vector<float> out(count);
        comm::sum_in_rank_order(f32.data(), n, count, DType::F32, out.data());
        const auto want = reference_sum_f32(data, 0, count);
        EXPECT_EQ(first_difference(out.data(), want.data(), count, 4), "") << n << " sources";

        std::vector<uint16_t> out16(count);
        comm::sum_in_rank_order(b16.data(), n, count, DType::BF16, out16.data());
        const auto want16 = reference_sum_bf16(data, 0, count);
        EXPECT_EQ(first_difference(out16.data(), want16.data(), count, 2), "") << n << " sources";

        // In place: the output is the last source.
        std::vector<float> last = data[n - 1];
        f32[n - 1] = last.data();
        comm::sum_in_rank_order(f32.data(), n, count, DType::F32, last.data());
        EXPECT_EQ(first_difference(last.data(), want.data(), count, 4), "") << n << " sources, in place";
    }
}

// bf16 is summed in fp32 and rounded once: 256 + 1 + 1 is 258 (exact in bf16), where rounding after
// each addition would give 256 twice over (256 + 1 rounds back to 256 at bf16's 8 bits).
TEST(CommRankOrderSum, Bf16RoundsOnce) {
    const uint16_t a = float_to_bf16(256.0f), b = float_to_bf16(1.0f);
    const uint16_t* sources[3] = {&a, &b, &b};
    uint16_t out = 0;
    comm::sum_in_rank_order(reinterpret_cast<const void* const*>(sources), 3, 1, DType::BF16, &out);
    EXPECT_EQ(bf16_to_float(out), 258.0f);
}

TEST(CommRankOrderSum, RejectsOtherDtypes) {
    float x = 0;
    const void* s[1] = {&x};
    EXPECT_ERROR(comm::sum_in_rank_order(s, 1, 1, DType::F16, &x), "fp32 and bf16, got fp16");
    EXPECT_ERROR(comm::sum_in_rank_order(s, 0, 1, DType::F32, &x), "at least one source");
}

TEST(CommEvenSplit, CoversEveryElementOnceInOrder) {
    for (std::size_t count : {0, 1, 2, 7, 10, 1237})
        for (int world : {1, 2, 3, 4, 7}) {
            std::size_t next = 0;
            for (int r = 0; r < world; ++r) {
                const auto s = comm::even_split(count, world, r);
                EXPECT_EQ(s.offset, next) << count << " / " << world << " rank " << r;
                EXPECT_LE(s.count, count / world + 1);
                next += s.count;
            }
            EXPECT_EQ(next, count);
        }
}

}  // namespace
}  // namespace qtrain::test
