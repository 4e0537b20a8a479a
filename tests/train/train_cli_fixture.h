// The fixture of the `train` end-to-end tests: a tiny Qwen2 config, a learnable token stream
// and the command line that trains on it; shared by the CPU tests (tests/train) and the GPU ones
// (tests/gpu), which run the same program with --device=cuda.
#pragma once

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "io/token_file.h"
#include "test_util.h"

namespace qtrain::test::train_cli {

constexpr int kVocab = 64;

// A learnable stream: mostly a fixed permutation walk, 10% random tokens.
inline std::vector<int32_t> make_tokens(int n, uint64_t seed) {
    Rng rng(seed);
    std::vector<int32_t> t(n);
    t[0] = 1;
    for (int i = 1; i < n; ++i)
        t[i] = rng.uniform() < 0.1f ? static_cast<int32_t>(rng.below(kVocab)) : (t[i - 1] * 7 + 3) % kVocab;
    return t;
}

// Head dim 8 (the CPU reference's tiny shape); the GPU attention needs 64 or 128.
constexpr const char* kCpuShape = R"("hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4)";
constexpr const char* kGpuShape = R"("hidden_size": 128, "intermediate_size": 96, "num_attention_heads": 2)";

struct Fixture {
    TempDir dir;
    std::string model_dir, train_file, eval_file;
    explicit Fixture(const std::string& shape = kCpuShape) {
        model_dir = dir / "tiny-qwen";
        std::filesystem::create_directories(model_dir);
        write_file(model_dir + "/config.json", R"({
  "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
  "vocab_size": 64, "num_hidden_layers": 2, )" + shape + R"(,
  "num_key_value_heads": 2, "max_position_embeddings": 512,
  "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
  "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu"
})");
        train_file = dir / "train.bin";
        eval_file = dir / "eval.bin";
        write_token_file(train_file, make_tokens(40000, 1), kVocab);
        write_token_file(eval_file, make_tokens(4000, 2), kVocab);
    }
    // `train` (the executable) on `device` for a run named `run` (its out and checkpoint folders).
    std::string base_cmd(const std::string& run, const std::string& device = "cpu") const {
        return std::string(QTRAIN_TRAIN_EXE) + " --device=" + device + " --model=" + model_dir + " --from-scratch --train-file=" +
               train_file + " --eval-file=" + eval_file + " --out-dir=" + (dir / run) + " --checkpoint-dir=" +
               (dir / (run + "-ckpt")) + " --batch-size=4 --seq-len=64 --grad-accumulation=2 --learning-rate=1e-3";
    }
};

inline std::vector<double> step_losses(const std::string& log_path, int* first_step = nullptr) {
    std::vector<double> losses;
    std::istringstream in(read_file(log_path));
    std::string line;
    bool first = true;
    while (std::getline(in, line)) {
        auto j = nlohmann::json::parse(line);
        if (j["log"] != "step") continue;
        if (first && first_step) *first_step = j["step"].get<int>();
        first = false;
        losses.push_back(j["loss"].get<double>());
    }
    return losses;
}

}  // namespace qtrain::test::train_cli
