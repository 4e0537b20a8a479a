// Evaluation split over ranks (src/train/evaluation.h): each rank evaluates its own batches (r, r + W,
// ...), and the combined mean equals one rank's up to the fp32 rounding of the double sums. With
// sharded weights (ZeRO-3) every rank makes the same number of calls, the same loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "comm/run_ranks.h"
#include "io/token_file.h"
#include "model/imodel.h"
#include "test_util.h"
#include "train/stub_model.h"
#include "train/evaluation.h"

using namespace qtrain;
using namespace qtrain::test;

namespace {

constexpr int kBatch = 3, kSeq = 16, kVocab = 50;

// Its "loss" is a function of the batch's tokens (so batches differ), and it records which batches
// (by their first token's position in the file) it was asked to evaluate. As a model with sharded
// weights it also counts the calls without a valid target, and returns NaN for them (their result
// must be discarded).
class RecordingModel : public StubModel {
public:
    std::vector<int32_t> first_tokens;
    bool sharded = false;
    int ignored_calls = 0;
    bool weights_sharded() const override { return sharded; }
    float evaluate(const Batch& b) override {
        if (std::all_of(b.targets, b.targets + b.batch_size * b.seq_len, [](int32_t t) { return t < 0; })) {
            ++ignored_calls;
            return NAN;
        }
        first_tokens.push_back(b.inputs[0]);
        double s = 0;
        for (int i = 0; i < b.batch_size * b.seq_len; ++i) s += std::sin(0.37 * b.inputs[i] + i);
        return static_cast<float>(3.0 + s / (b.batch_size * b.seq_len));
    }
};

struct Split {
    EvalResult result;
    std::vector<std::vector<int32_t>> batches_of_rank;
    std::vector<int> ignored_calls;  // of each rank
};

Split evaluate_on(int world, const std::string& file, int max_batches, bool sharded = false) {
    Split out;
    out.batches_of_rank.resize(world);
    out.ignored_calls.resize(world);
    std::vector<EvalResult> results(world);
    comm::run_ranks(world, [&](comm::Communicator& c) {
        RecordingModel m;
        m.sharded = sharded;
        DataLoader loader({file}, kBatch, kSeq, 1, false, kVocab, "--eval-file");
        results[c.rank()] = evaluate_over_ranks(m, loader, max_batches, kBatch, kSeq, c);
        out.batches_of_rank[c.rank()] = m.first_tokens;
        out.ignored_calls[c.rank()] = m.ignored_calls;
    });
    for (const EvalResult& r : results) {  // every rank gets the combined result
        EXPECT_EQ(r.tokens, results[0].tokens);
        EXPECT_EQ(std::memcmp(&r.loss, &results[0].loss, sizeof r.loss), 0);
    }
    out.result = results[0];
    return out;
}

}  // namespace

TEST(Evaluation, RanksSplitTheBatchesAndCombineToOneRanksLoss) {
    TempDir d;
    // Chunks of kSeq + 1 tokens step by kSeq (a chunk's last target is the next one's first input),
    // and every token is its chunk's index, so a batch's first input names the batch. The targets of
    // every 5th chunk are masked after the first few, so batches weigh differently, and the last
    // batch is a partial one (padded rows carry no target).
    const int chunks = 3 * 12 + 1;
    std::vector<int32_t> tokens(static_cast<size_t>(chunks) * kSeq + 1);
    std::vector<uint8_t> mask(tokens.size(), 1);
    for (size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = static_cast<int32_t>((i / kSeq) % kVocab);
        if ((i / kSeq) % 5 == 0 && i % kSeq > 4) mask[i] = 0;
    }
    const std::string file = d / "eval.bin";
    write_token_file(file, tokens, kVocab, &mask);

    for (int max_batches : {0, 7}) {
        const Split one = evaluate_on(1, file, max_batches);
        const size_t n = one.batches_of_rank[0].size();
        ASSERT_EQ(n, max_batches ? 7u : 13u);  // 12 full batches and the partial one
        for (size_t b = 0; b < n; ++b) ASSERT_EQ(one.batches_of_rank[0][b], 3 * static_cast<int>(b));
        ASSERT_TRUE(std::isfinite(one.result.loss));
        for (int world : {2, 3, 4}) {
            SCOPED_TRACE("max_batches " + std::to_string(max_batches) + ", world " + std::to_string(world));
            const Split many = evaluate_on(world, file, max_batches);
            for (int r = 0; r < world; ++r) {  // rank r evaluated batches r, r + W, ...
                std::vector<int32_t> want;
                for (size_t b = r; b < n; b += world) want.push_back(one.batches_of_rank[0][b]);
                EXPECT_EQ(many.batches_of_rank[r], want) << "rank " << r;
            }
            EXPECT_EQ(many.result.tokens, one.result.tokens);
            const float a = one.result.loss, b = many.result.loss;
            EXPECT_LE(std::abs(b - a), std::nextafter(a, INFINITY) - a) << b << " vs " << a;
        }
    }
}

TEST(Evaluation, NoValidTargetIsNaNOnEveryRank) {
    TempDir d;
    // the first two batches (6 chunks) have every target masked; the later ones (which the data
    // loader needs, as it refuses a file with nothing to evaluate) are not evaluated
    std::vector<int32_t> tokens(static_cast<size_t>(12) * kSeq + 1, 1);
    std::vector<uint8_t> mask(tokens.size(), 0);
    for (size_t i = 6 * kSeq + 1; i < tokens.size(); ++i) mask[i] = 1;
    write_token_file(d / "eval.bin", tokens, kVocab, &mask);
    const Split s = evaluate_on(2, d / "eval.bin", 2);
    EXPECT_TRUE(std::isnan(s.result.loss));
    EXPECT_EQ(s.result.tokens, 0);
}

// ZeRO-3 (weights_sharded): every rank makes a call in every round of W batches where any rank has a
// batch with a target — its own batch, or one with every target ignored (whose NaN here must not
// count) — and the result is the unsharded one's bits. Batches 2, 3 and 7 have no target at all, so
// at 2 ranks round (2, 3) has nothing to evaluate and (6, 7) leaves rank 1 without a batch; at 3 and
// 4 ranks other ranks go without; the partial last batch ends a partial round.
TEST(Evaluation, WithShardedWeightsEveryRankEvaluatesInEveryRoundAndTheLossIsTheSame) {
    TempDir d;
    const std::set<int> no_target = {2, 3, 7};
    const int chunks = 3 * 12 + 1;
    std::vector<int32_t> tokens(static_cast<size_t>(chunks) * kSeq + 1);
    std::vector<uint8_t> mask(tokens.size(), 1);
    for (size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = static_cast<int32_t>((i / kSeq) % kVocab);
        // target i belongs to chunk (i - 1) / kSeq, of batch chunk / kBatch
        if (i > 0 && no_target.count(static_cast<int>((i - 1) / kSeq / kBatch))) mask[i] = 0;
    }
    const std::string file = d / "eval.bin";
    write_token_file(file, tokens, kVocab, &mask);
    for (int max_batches : {0, 7}) {
        const int n = max_batches ? 7 : 13;
        for (int world : {2, 3, 4}) {
            SCOPED_TRACE("max_batches " + std::to_string(max_batches) + ", world " + std::to_string(world));
            const Split plain = evaluate_on(world, file, max_batches), sharded = evaluate_on(world, file, max_batches, true);
            int rounds_with_work = 0;
            for (int b0 = 0; b0 < n; b0 += world) {
                bool work = false;
                for (int b = b0; b < std::min(n, b0 + world); ++b) work = work || !no_target.count(b);
                rounds_with_work += work;
            }
            for (int r = 0; r < world; ++r) {
                EXPECT_EQ(sharded.batches_of_rank[r], plain.batches_of_rank[r]) << "rank " << r;
                EXPECT_EQ(plain.ignored_calls[r], 0) << "rank " << r;
                EXPECT_EQ(sharded.batches_of_rank[r].size() + sharded.ignored_calls[r], static_cast<size_t>(rounds_with_work))
                    << "rank " << r;
            }
            EXPECT_GT(*std::max_element(sharded.ignored_calls.begin(), sharded.ignored_calls.end()), 0);
            EXPECT_EQ(sharded.result.tokens, plain.result.tokens);
            EXPECT_TRUE(std::isfinite(sharded.result.loss));
            EXPECT_EQ(std::memcmp(&sharded.result.loss, &plain.result.loss, sizeof(float)), 0)
                << sharded.result.loss << " vs " << plain.result.loss;
        }
    }
}
