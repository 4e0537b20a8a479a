// Evaluation of a packed eval file (--document-masking) on the CPU model: the loader packs it, the
// batches carry their positions, and the eval loss — on one rank or split over several — is the
// summed token loss of every document run alone over the trained tokens of the whole pass.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "comm/run_ranks.h"
#include "io/token_file.h"
#include "model/cpu/cpu_model.h"
#include "model/cpu_test_util.h"
#include "test_util.h"
#include "train/evaluation.h"

using namespace qtrain;

TEST(EvaluationPacking, PackedEvalLossIsTheDocumentsTokenLossOverTheirTrainedTokens) {
    test::TempDir d;
    const ModelConfig cfg = test::tiny_config(false);
    const int B = 2, T = 16;
    Rng rng(123);
    std::vector<int32_t> tokens;
    std::vector<uint8_t> mask;
    std::vector<int64_t> starts;
    std::vector<std::pair<int64_t, int>> pieces;  // (begin, length) of every document piece <= T
    for (int doc = 0; doc < 23; ++doc) {
        const int L = 1 + static_cast<int>(rng.below(22));  // some longer than T: split
        const int64_t begin = static_cast<int64_t>(tokens.size());
        starts.push_back(begin);
        for (int j = 0; j < L; ++j) {
            tokens.push_back(static_cast<int32_t>(rng.below(cfg.vocab_size)));
            mask.push_back(rng.below(3) != 0);
        }
        for (int at = 0; at < L; at += T) pieces.push_back({begin + at, std::min(T, L - at)});
    }
    const std::string file = d / "eval.bin";
    write_token_file(file, tokens, cfg.vocab_size, &mask, &starts);

    // every piece alone: its summed token loss and trained targets
    CpuModel alone(cfg, CpuModel::fp32_options(1, T));
    alone.init_random(5);
    double loss_sum = 0.0;
    int64_t trained = 0;
    for (const auto& [begin, L] : pieces) {
        std::vector<int32_t> in(tokens.begin() + begin, tokens.begin() + begin + L), tgt(L, -1);
        int valid = 0;
        for (int j = 0; j + 1 < L; ++j)
            if (mask[begin + j + 1]) {
                tgt[j] = tokens[begin + j + 1];
                ++valid;
            }
        if (valid == 0) continue;
        loss_sum += alone.evaluate_f64(Batch{in.data(), tgt.data(), 1, L}) * valid;
        trained += valid;
    }
    ASSERT_GT(trained, 50);
    const double expected = loss_sum / static_cast<double>(trained);

    Packing packing;
    packing.enabled = true;
    for (int world : {1, 2, 3}) {
        SCOPED_TRACE("world " + std::to_string(world));
        std::vector<EvalResult> results(world);
        comm::run_ranks(world, [&](comm::Communicator& c) {
            ModelOptions o = CpuModel::fp32_options(B, T);
            o.document_masking = true;
            CpuModel model(cfg, o);
            model.init_random(5);
            DataLoader loader({file}, B, T, 1, false, cfg.vocab_size, "--eval-file", packing);
            results[c.rank()] = evaluate_over_ranks(model, loader, 0, B, T, c);
        });
        EXPECT_TRUE(test::Near(results[0].loss, expected, 2e-6, 0.0));
    }
}
