// pad_token_id as transformers uses it (nn.Embedding's padding_idx): the lookup's backward gives the
// pad token's embedding row no gradient; everything else, the forward included, is unchanged.
#include <gtest/gtest.h>

#include <vector>

#include "model/cpu/cpu_model.h"
#include "model/cpu_test_util.h"

using namespace qtrain;

TEST(CpuModelPadding, ThePadTokensEmbeddingRowGetsNoGradientFromTheLookup) {
    const int B = 2, T = 12;
    ModelConfig cfg = test::tiny_config(false);  // untied: the row's only gradient is the lookup's
    test::TokenBatch tb = test::random_batch(B, T, cfg.vocab_size, 9);
    const int pad = tb.inputs[3];  // a token that occurs in the inputs
    auto embedding_grad = [&](int pad_token_id, float* loss) {
        ModelConfig c = cfg;
        c.pad_token_id = pad_token_id;
        CpuModel model(c, CpuModel::fp32_options(B, T));
        model.init_random(5);
        *loss = model.evaluate(tb.view());
        model.forward_backward(tb.view(), 1.0f);
        const float* g = model.grad("model.embed_tokens.weight");
        return std::vector<float>(g, g + static_cast<size_t>(c.vocab_size) * c.hidden_size);
    };
    float loss_plain = 0, loss_pad = 0;
    const auto plain = embedding_grad(-1, &loss_plain), padded = embedding_grad(pad, &loss_pad);
    EXPECT_EQ(loss_plain, loss_pad) << "the forward does not depend on pad_token_id";
    const int C = cfg.hidden_size;
    bool row_had_gradient = false;
    for (int t = 0; t < cfg.vocab_size; ++t)
        for (int c = 0; c < C; ++c) {
            const size_t i = static_cast<size_t>(t) * C + c;
            if (t == pad) {
                row_had_gradient |= plain[i] != 0.0f;
                EXPECT_EQ(padded[i], 0.0f) << "pad row, column " << c;
            } else {
                EXPECT_EQ(padded[i], plain[i]) << "token " << t << ", column " << c;
            }
        }
    EXPECT_TRUE(row_had_gradient) << "the test needs the pad token among the inputs";
}

TEST(CpuModelPadding, APadTokenOutsideTheVocabularyIsRefused) {
    ModelConfig cfg = test::tiny_config(false);
    cfg.pad_token_id = cfg.vocab_size;
    EXPECT_THROW(cfg.validate("config.json"), Error);
}
