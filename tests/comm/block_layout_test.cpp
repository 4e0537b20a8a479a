// The block arithmetic of the GPU backends (comm/block_layout.h): the staging slots of the peers'
// blocks, and the NCCL all-reduce's padded blocks, which must cover every element exactly once.
#include <gtest/gtest.h>

#include <set>

#include "comm/block_layout.h"

namespace qtrain::comm {
namespace {

TEST(CommBlockLayout, StagingSlotsAreThePeersInRankOrder) {
    // rank 2 of 4 keeps its own block in place: peers 0, 1, 3 take slots 0, 1, 2
    EXPECT_EQ(staging_slot(0, 2), 0u);
    EXPECT_EQ(staging_slot(1, 2), 1u);
    EXPECT_EQ(staging_slot(3, 2), 2u);
    for (int world = 2; world <= 5; ++world)
        for (int rank = 0; rank < world; ++rank) {
            std::set<std::size_t> slots;
            for (int peer = 0; peer < world; ++peer)
                if (peer != rank) slots.insert(staging_slot(peer, rank));
            EXPECT_EQ(slots.size(), static_cast<std::size_t>(world - 1));
            EXPECT_EQ(*slots.rbegin(), static_cast<std::size_t>(world - 2));
        }
}

TEST(CommBlockLayout, StagingStrideKeepsSlotsSixteenByteAligned) {
    EXPECT_EQ(staging_layout(1, 3, DType::F32).stride, 4u);
    EXPECT_EQ(staging_layout(1, 3, DType::F32).bytes, 2u * 16);
    EXPECT_EQ(staging_layout(7, 2, DType::BF16).stride, 8u);
    EXPECT_EQ(staging_layout(8, 2, DType::BF16).stride, 8u);
    EXPECT_EQ(staging_layout(9, 2, DType::BF16).stride, 16u);
    EXPECT_EQ(staging_layout(1000003, 3, DType::F32).stride, 1000004u);
    EXPECT_EQ(staging_layout(1000003, 3, DType::F32).bytes, 2u * 1000004 * 4);
    EXPECT_EQ(staging_layout(0, 3, DType::F32).bytes, 0u);
    EXPECT_EQ(staging_layout(100, 1, DType::F32).bytes, 0u);  // world 1: no peers
    for (DType dtype : {DType::F32, DType::BF16, DType::U8})
        for (std::size_t count : {1, 2, 3, 15, 16, 17, 1001})
            EXPECT_EQ(staging_layout(count, 2, dtype).stride * dtype_size(dtype) % 16, 0u);
}

TEST(CommBlockLayout, PaddedBlocksCoverEveryElementOnce) {
    const PaddedBlocks b = padded_blocks(7, 3);
    EXPECT_EQ(b.block, 3u);
    EXPECT_EQ(b.length(0), 3u);
    EXPECT_EQ(b.length(1), 3u);
    EXPECT_EQ(b.length(2), 1u);
    EXPECT_TRUE(b.padded(3));
    const PaddedBlocks one = padded_blocks(1, 3);
    EXPECT_EQ(one.block, 1u);
    EXPECT_EQ(one.length(0), 1u);
    EXPECT_EQ(one.length(1), 0u);
    EXPECT_EQ(one.length(2), 0u);
    EXPECT_FALSE(padded_blocks(12, 4).padded(4));
    EXPECT_EQ(padded_blocks(0, 4).block, 0u);
    EXPECT_FALSE(padded_blocks(0, 4).padded(4));
    for (int world = 1; world <= 8; ++world)
        for (std::size_t count : {0, 1, 2, 5, 7, 8, 9, 1000, 1000003}) {
            const PaddedBlocks p = padded_blocks(count, world);
            std::size_t next = 0;  // blocks are contiguous, in rank order, and end at count
            for (int r = 0; r < world; ++r) {
                if (p.length(r) > 0) EXPECT_EQ(p.offset(r), next);
                EXPECT_LE(p.length(r), p.block);
                next += p.length(r);
            }
            EXPECT_EQ(next, count) << "count " << count << " world " << world;
            EXPECT_GE(p.block * static_cast<std::size_t>(world), count);
            EXPECT_LT(p.block * static_cast<std::size_t>(world), count + static_cast<std::size_t>(world));
        }
}

}  // namespace
}  // namespace qtrain::comm
