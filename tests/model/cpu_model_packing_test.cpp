// Packing with document masking on the CPU reference model (issue 31): a packed micro-batch (several
// documents per row, masked targets, padding) gives the loss and every parameter gradient of its
// documents run one by one, under the step's token normalisation (Batch::loss_denominator); several
// micro-batches normalised by the step's count equal one big batch; positions need the option.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/cpu/cpu_model.h"
#include "model/cpu_test_util.h"

using namespace qtrain;

namespace {

// A document: its tokens and targets (the next token of the document under a random mask, -1 at its
// last token), as the packing loader makes them.
struct Document {
    std::vector<int32_t> inputs, targets;
};

Document random_document(int length, int vocab, Rng& rng) {
    Document d;
    for (int j = 0; j < length; ++j) d.inputs.push_back(static_cast<int32_t>(rng.below(vocab)));
    for (int j = 0; j < length; ++j)
        d.targets.push_back(j + 1 < length && rng.below(4) != 0 ? d.inputs[j + 1] : -1);
    return d;
}

// Rows of T slots holding the documents in order, the rest padding (random inputs, no loss, positions
// 0, 1, ... as a document of its own).
struct Packed {
    std::vector<int32_t> inputs, targets, positions;
};

Packed pack(const std::vector<std::vector<Document>>& rows, int T, int vocab, Rng& rng) {
    Packed p;
    for (const auto& row : rows) {
        int used = 0;
        for (const Document& d : row) {
            for (std::size_t j = 0; j < d.inputs.size(); ++j) {
                p.inputs.push_back(d.inputs[j]);
                p.targets.push_back(d.targets[j]);
                p.positions.push_back(static_cast<int32_t>(j));
            }
            used += static_cast<int>(d.inputs.size());
        }
        for (int j = 0; used < T; ++used, ++j) {
            p.inputs.push_back(static_cast<int32_t>(rng.below(vocab)));
            p.targets.push_back(-1);
            p.positions.push_back(j);
        }
    }
    return p;
}

int64_t valid_targets(const std::vector<int32_t>& targets) {
    return std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t >= 0; });
}

ModelOptions masking_options(int B, int T) {
    ModelOptions o = CpuModel::fp32_options(B, T);
    o.document_masking = true;
    return o;
}

// Every gradient of `a` against `b`, relative to each tensor's largest magnitude.
void expect_same_gradients(CpuModel& a, CpuModel& b, double rtol) {
    for (const ParamSpec& spec : b.params()) {
        const float *ga = a.grad(spec.name), *gb = b.grad(spec.name);
        double scale = 0.0;
        for (int64_t i = 0; i < spec.numel(); ++i) scale = std::max(scale, std::abs(static_cast<double>(gb[i])));
        ASSERT_GT(scale, 0.0) << spec.name << ": the test needs a gradient in every tensor";
        double worst = 0.0;
        for (int64_t i = 0; i < spec.numel(); ++i) worst = std::max(worst, std::abs(static_cast<double>(ga[i]) - gb[i]));
        EXPECT_LE(worst, rtol * scale) << spec.name << ": largest difference " << worst << " of " << scale;
    }
}

}  // namespace

class CpuModelPacking : public ::testing::TestWithParam<std::string> {
protected:
    ModelConfig config() const {
        if (GetParam() == "qwen3") return test::tiny_qwen3_config(false);
        if (GetParam() == "llama") return test::tiny_llama_config(true);
        return test::tiny_config(false);
    }
};

TEST_P(CpuModelPacking, PackedRowsEqualTheirDocumentsOneByOne) {
    const ModelConfig cfg = config();
    const int T = 16;
    Rng rng(0x9ac4 + GetParam().size());
    // row 0: three documents filling it; row 1: two documents and 4 slots of padding
    const std::vector<std::vector<int>> lengths = {{5, 7, 4}, {9, 3}};
    std::vector<std::vector<Document>> rows;
    for (const auto& row : lengths) {
        rows.emplace_back();
        for (int L : row) rows.back().push_back(random_document(L, cfg.vocab_size, rng));
    }
    const Packed p = pack(rows, T, cfg.vocab_size, rng);
    const int64_t count = valid_targets(p.targets);
    ASSERT_GT(count, 4);

    CpuModel packed(cfg, masking_options(2, T));
    packed.init_random(17);
    Batch batch{p.inputs.data(), p.targets.data(), 2, T};
    batch.positions = p.positions.data();
    batch.loss_denominator = static_cast<float>(count);
    packed.forward_backward(batch, 1.0f);

    // each document alone, a batch of one row of its own length, plain causal at positions 0..L-1
    CpuModel single(cfg, CpuModel::fp32_options(1, T));
    single.init_random(17);
    double loss_sum = 0.0;
    for (const auto& row : rows)
        for (const Document& d : row) {
            Batch one{d.inputs.data(), d.targets.data(), 1, static_cast<int>(d.inputs.size())};
            one.loss_denominator = static_cast<float>(count);
            single.forward_backward(one, 1.0f);
            loss_sum += single.evaluate_f64(one);
        }
    EXPECT_TRUE(test::Near(packed.step_loss(), single.step_loss(), 1e-6, 0.0));
    EXPECT_TRUE(test::Near(packed.step_loss(), loss_sum, 1e-6, 0.0));
    // the packed evaluation, normalised the same way
    EXPECT_TRUE(test::Near(packed.evaluate_f64(batch), loss_sum, 1e-6, 0.0));
    expect_same_gradients(packed, single, 1e-6);

    // without document masking the same row is another computation (attention crosses documents)
    CpuModel causal(cfg, CpuModel::fp32_options(2, T));
    causal.init_random(17);
    Batch plain = batch;
    plain.positions = nullptr;
    EXPECT_FALSE(test::Near(causal.evaluate_f64(plain), loss_sum, 1e-4, 0.0));
}

INSTANTIATE_TEST_SUITE_P(Blocks, CpuModelPacking, ::testing::Values("qwen2", "qwen3", "llama"));

// --loss-normalization=tokens: micro-batches each divided by the step's count, accumulated, equal one
// batch of all their rows (whose own count is that count), loss and gradients; rows with few trained
// tokens weigh what their tokens weigh (unlike the mean of the micro-batch means).
TEST(CpuModelTokenNormalization, AccumulatedMicroBatchesEqualOneBigBatch) {
    const ModelConfig cfg = test::tiny_config(false);
    const int T = 12, rows = 4;
    test::TokenBatch all = test::random_batch(rows, T, cfg.vocab_size, 31);
    // row 0 keeps 2 trained targets, the others more: the micro-batch means would weigh them apart
    for (int t = 2; t < T; ++t) all.targets[t] = -1;
    for (int i = T; i < rows * T; i += 5) all.targets[i] = -1;
    const int64_t count = valid_targets(all.targets);

    CpuModel big(cfg, CpuModel::fp32_options(rows, T));
    big.init_random(3);
    big.forward_backward(all.view(), 1.0f);  // the batch's own mean: sum / count

    CpuModel accumulated(cfg, CpuModel::fp32_options(1, T));
    accumulated.init_random(3);
    for (int r = 0; r < rows; ++r) {
        Batch micro{all.inputs.data() + r * T, all.targets.data() + r * T, 1, T};
        micro.loss_denominator = static_cast<float>(count);
        accumulated.forward_backward(micro, 1.0f);
    }
    EXPECT_TRUE(test::Near(accumulated.step_loss(), big.step_loss(), 1e-6, 0.0));
    expect_same_gradients(accumulated, big, 1e-6);

    // the mean of the micro-batch means (today's micro-batch normalisation) is another loss here
    CpuModel means(cfg, CpuModel::fp32_options(1, T));
    means.init_random(3);
    for (int r = 0; r < rows; ++r)
        means.forward_backward(Batch{all.inputs.data() + r * T, all.targets.data() + r * T, 1, T}, 1.0f / rows);
    EXPECT_FALSE(test::Near(means.step_loss(), big.step_loss(), 1e-3, 0.0));
}

TEST(CpuModelPackingChecks, PositionsNeedDocumentMasking) {
    const ModelConfig cfg = test::tiny_config(true);
    const int T = 8;
    test::TokenBatch tb = test::random_batch(1, T, cfg.vocab_size, 4);
    std::vector<int32_t> positions = {0, 1, 2, 0, 1, 2, 3, 4};
    Batch b = tb.view();
    b.positions = positions.data();
    CpuModel plain(cfg, CpuModel::fp32_options(1, T));
    plain.init_random(1);
    try {
        plain.forward_backward(b, 1.0f);
        FAIL() << "positions on a model without document masking";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("document masking"), std::string::npos) << e.what();
    }
    // a position that would start its document before the row is refused too
    CpuModel masked(cfg, masking_options(1, T));
    masked.init_random(1);
    positions[2] = 3;
    EXPECT_THROW(masked.evaluate(b), Error);
    // and null positions on a masking model are the plain causal rows
    positions[2] = 2;
    b.positions = nullptr;
    EXPECT_EQ(masked.evaluate(b), plain.evaluate(b));
}
