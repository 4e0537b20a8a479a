#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "core/error.h"
#include "io/token_file.h"
#include "test_util.h"
#include "train/data_loader.h"

using namespace qtrain;
using qtrain::test::Contains;
using qtrain::test::TempDir;

namespace {
// tokens 0..n-1 (mod vocab) so every token says where it came from
std::string make_file(const TempDir& dir, const std::string& name, int n, int vocab, bool masks = false,
                      int first = 0) {
    std::vector<int32_t> tok(n);
    for (int i = 0; i < n; ++i) tok[i] = (first + i) % vocab;
    std::string path = dir / name;
    if (masks) {
        std::vector<uint8_t> m(n);
        for (int i = 0; i < n; ++i) m[i] = (i % 3) != 0;  // every third token masked out
        write_token_file(path, tok, vocab, &m);
    } else {
        write_token_file(path, tok, vocab);
    }
    return path;
}
}  // namespace

TEST(DataLoader, TargetsAreInputsShiftedByOne) {
    TempDir d;
    auto f = make_file(d, "a.bin", 1000, 100000);
    DataLoader dl({f}, 2, 16, 1, false, 100000, "--train-file");
    std::vector<int32_t> in, tgt;
    dl.next_batch(in, tgt);
    ASSERT_EQ(in.size(), 32u);
    for (int r = 0; r < 2; ++r)
        for (int t = 0; t < 16; ++t) {
            EXPECT_EQ(in[r * 16 + t], r * 16 + t);  // unshuffled: chunk r starts at r*T
            EXPECT_EQ(tgt[r * 16 + t], in[r * 16 + t] + 1);
        }
}

TEST(DataLoader, MaskedTargetsBecomeMinusOne) {
    TempDir d;
    auto f = make_file(d, "m.bin", 200, 1000, true);
    DataLoader dl({f}, 1, 10, 1, false, 1000, "--train-file");
    std::vector<int32_t> in, tgt;
    dl.next_batch(in, tgt);
    for (int t = 0; t < 10; ++t) {
        int target_pos = t + 1;
        EXPECT_EQ(tgt[t], target_pos % 3 ? target_pos : -1) << t;
    }
}

TEST(DataLoader, EveryChunkOncePerEpochAndShuffledBySeed) {
    TempDir d;
    auto f1 = make_file(d, "a.bin", 101, 100000);  // 100/10 = 10 chunks
    auto f2 = make_file(d, "b.bin", 51, 100000, false, 50000);  // 5 chunks, distinct tokens
    DataLoader dl({f1, f2}, 1, 10, 123, true, 100000, "--train-file");
    EXPECT_EQ(dl.num_chunks(), 15);
    std::vector<int32_t> in, tgt, first_order;
    std::multiset<std::pair<int, int>> seen;
    for (int i = 0; i < 15; ++i) {
        dl.next_batch(in, tgt);
        seen.insert({in[0], in[9]});
        first_order.push_back(in[0]);
    }
    EXPECT_EQ(seen.size(), 15u);
    const std::set<std::pair<int, int>> distinct(seen.begin(), seen.end());
    EXPECT_EQ(distinct.size(), 15u);  // no repeats
    EXPECT_NEAR(dl.epoch_progress(), 1.0, 1e-12);
    // next epoch has a different order
    std::vector<int32_t> second_order;
    for (int i = 0; i < 15; ++i) {
        dl.next_batch(in, tgt);
        second_order.push_back(in[0]);
    }
    EXPECT_NE(first_order, second_order);
    // same seed -> same order; different seed -> different order
    DataLoader same({f1, f2}, 1, 10, 123, true, 100000, "--train-file");
    DataLoader other({f1, f2}, 1, 10, 124, true, 100000, "--train-file");
    std::vector<int32_t> a, b;
    for (int i = 0; i < 15; ++i) {
        same.next_batch(in, tgt);
        a.push_back(in[0]);
        other.next_batch(in, tgt);
        b.push_back(in[0]);
    }
    EXPECT_EQ(a, first_order);
    EXPECT_NE(b, first_order);
}

TEST(DataLoader, SetStateResumesExactly) {
    TempDir d;
    auto f = make_file(d, "a.bin", 2001, 100000);
    DataLoader a({f}, 3, 20, 9, true, 100000, "--train-file");
    std::vector<int32_t> in, tgt, in2, tgt2;
    for (int i = 0; i < 50; ++i) a.next_batch(in, tgt);  // crosses an epoch boundary (100 chunks / 3)
    DataLoaderState st = a.state();
    DataLoader b({f}, 3, 20, 9, true, 100000, "--train-file");
    b.set_state(st);
    for (int i = 0; i < 40; ++i) {
        a.next_batch(in, tgt);
        b.next_batch(in2, tgt2);
        ASSERT_EQ(in, in2);
        ASSERT_EQ(tgt, tgt2);
    }
}

TEST(DataLoader, NoWrapPadsTheLastBatch) {
    TempDir d;
    auto f = make_file(d, "a.bin", 51, 100000);  // 5 chunks of 10
    DataLoader dl({f}, 2, 10, 0, false, 100000, "--eval-file");
    std::vector<int32_t> in, tgt;
    int batches = 0;
    while (dl.next_batch_no_wrap(in, tgt)) ++batches;
    EXPECT_EQ(batches, 3);
    for (int t = 10; t < 20; ++t) EXPECT_EQ(tgt[t], -1);  // padded second row of the last batch
}

TEST(DataLoader, TooFewTokensNamesTheFlag) {
    TempDir d;
    auto f = make_file(d, "tiny.bin", 8, 100);
    try {
        DataLoader dl({f}, 1, 16, 0, true, 100, "--train-file");
        FAIL();
    } catch (const Error& e) {
        EXPECT_TRUE(Contains(e.what(), "--train-file"));
        EXPECT_TRUE(Contains(e.what(), "--seq-len=16"));
    }
}

TEST(DataLoader, TokenBeyondModelVocabIsAnError) {
    TempDir d;
    auto f = make_file(d, "v.bin", 500, 1000);  // tokens up to 499
    try {
        DataLoader dl({f}, 1, 16, 0, true, 300, "--train-file");
        FAIL();
    } catch (const Error& e) {
        EXPECT_TRUE(Contains(e.what(), "v.bin"));
    }
}

// One global order (issue 18): micro-batch j of rank r of W ranks is micro-batch j * W + r of one rank
// with W x the accumulation, across epoch boundaries, and every rank ends each step in the state of
// that one rank. 37 chunks of 8 tokens, batch 2, accumulation 3: a step is 6 W chunks, so epochs end
// inside micro-batches and inside a rank's block.
TEST(DataLoader, RanksShareOneGlobalOrder) {
    TempDir d;
    const int T = 8, B = 2, A = 3;
    auto f = make_file(d, "a.bin", 37 * T + 1, 100000);
    for (int W : {2, 3, 4}) {
        SCOPED_TRACE("world " + std::to_string(W));
        DataLoader one({f}, B, T, 7, true, 100000, "--train-file");
        std::vector<std::unique_ptr<DataLoader>> ranks;
        for (int r = 0; r < W; ++r) {
            ranks.push_back(std::make_unique<DataLoader>(std::vector<std::string>{f}, B, T, 7, true, 100000, "--train-file"));
            ranks.back()->set_rank(r, W);
        }
        std::vector<int32_t> in, tgt, rin, rtgt;
        for (int step = 0; step < 9; ++step) {
            std::vector<std::vector<int32_t>> single(A * W);
            for (auto& m : single) one.next_batch(m, tgt);
            for (int r = 0; r < W; ++r)
                for (int j = 0; j < A; ++j) {
                    ranks[r]->next_batch(rin, rtgt);
                    ASSERT_EQ(rin, single[j * W + r]) << "step " << step << ", rank " << r << ", micro-batch " << j;
                }
            for (int r = 0; r < W; ++r) {
                EXPECT_EQ(ranks[r]->state().epoch, one.state().epoch) << "rank " << r;
                EXPECT_EQ(ranks[r]->state().position, one.state().position) << "rank " << r;
            }
        }
        EXPECT_GE(one.state().epoch, 1) << "the test must cross an epoch boundary";
    }
    DataLoader dl({f}, B, T, 7, true, 100000, "--train-file");
    EXPECT_THROW(dl.set_rank(2, 2), Error);
    EXPECT_THROW(dl.set_rank(0, 0), Error);
}
