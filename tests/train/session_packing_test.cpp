// The Python session's own tokens under --document-masking=on (RankSession::step with StepTokens):
// documents end after each EOS input, and the step's token normalisation counts every row given. Rows
// whose documents each end with EOS, fed by the caller, train exactly as the packing loader's rows of
// the same file do (the two differ only in how padding slots are split, which carry no loss).
#include <gtest/gtest.h>

#include <filesystem>

#include "core/rng.h"
#include "io/token_file.h"
#include "test_util.h"
#include "train/data_loader.h"
#include "train/run_context.h"
#include "train/session.h"

using namespace qtrain;
using qtrain::test::TempDir;

TEST(SessionPacking, CallerTokensWithEosEqualTheLoadersPackedRows) {
    TempDir d;
    const int vocab = 48, eos = 0, B = 2, T = 32, A = 2;
    const std::string model = d / "model";
    std::filesystem::create_directories(model);
    test::write_file(model + "/config.json", R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
  "vocab_size": 48, "num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
  "num_key_value_heads": 2, "max_position_embeddings": 256, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
  "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu"})");
    // documents of 3..30 tokens, each ending with EOS and recorded as a document start, half masked
    Rng rng(77);
    std::vector<int32_t> tokens;
    std::vector<uint8_t> mask;
    std::vector<int64_t> starts;
    for (int doc = 0; doc < 120; ++doc) {
        const int L = 3 + static_cast<int>(rng.below(28));
        starts.push_back(static_cast<int64_t>(tokens.size()));
        for (int j = 0; j < L; ++j) {
            tokens.push_back(j + 1 == L ? eos : 1 + static_cast<int32_t>(rng.below(vocab - 1)));
            mask.push_back(j > L / 2);
        }
    }
    const std::string data = d / "chat.bin";
    write_token_file(data, tokens, vocab, &mask, &starts);

    auto options = [&](const std::string& run, bool with_file) {
        TrainOptions o;
        o.model = model;
        o.from_scratch = true;
        o.device = "cpu";
        if (with_file) o.train_file = data;
        o.batch_size = B;
        o.seq_len = T;
        o.grad_accumulation = A;
        o.steps = 3;
        o.learning_rate = 1e-3f;
        o.document_masking = "on";
        o.out_dir = d / run;
        o.checkpoint_dir = d / (run + "-ckpt");
        return o;
    };
    std::vector<float> from_loader, from_caller;
    {
        TrainingSession s(make_run_context(options("loader", true), "test"));
        for (int i = 0; i < 3; ++i) from_loader.push_back(s.step().loss);
    }
    {
        TrainingSession s(make_run_context(options("caller", false), "test", nullptr, nullptr, {}, false));
        Packing packing;
        packing.enabled = true;
        packing.eos_token_id = eos;
        DataLoader rows({data}, B, T, TrainOptions().seed, true, vocab, "--train-file", packing);
        for (int i = 0; i < 3; ++i) {
            std::vector<int32_t> in, tgt, all_in, all_tgt;
            for (int m = 0; m < A; ++m) {
                rows.next_batch(in, tgt);
                all_in.insert(all_in.end(), in.begin(), in.end());
                all_tgt.insert(all_tgt.end(), tgt.begin(), tgt.end());
            }
            StepTokens st{all_in.data(), all_tgt.data(), static_cast<int64_t>(A) * B};
            from_caller.push_back(s.step(&st).loss);
        }
    }
    EXPECT_EQ(from_caller, from_loader);
    EXPECT_NE(from_loader[0], from_loader[2]);  // it trains
}
