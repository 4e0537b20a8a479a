// qtrain_dump: loads a HF Qwen2 directory into the GPU model, runs one forward+backward on a
// batch read from a BIN.TOK file, and writes loss, logits and every parameter gradient (HF names,
// fp32) into one safetensors file — the qtrain side of tests/reference/compare_hf.py.
//
// usage: qtrain_dump --model DIR --tokens FILE.bin --batch B --seq-len T --dtype fp32|bf16|e4m3 --out OUT
//        [--steps K --lr LR]   (K optimizer steps on the same batch first, then the dump)
//        [--recompute-block|-ffn|-att|-norm] [--use-cuda-graphs] [--emulate-out FILE]
//        [--offload-master|-opt-m|-opt-v|-gradients|-residual] [--shard-weights] [--shard-gradients]
//        [--write-combined] [--attn-bwd-chunks N] [--master-dtype fp32|bf16] [--param-grad-dtype fp32|bf16]
//        [--doc-lengths L1,L2,...]
// --doc-lengths: document masking (issue 31). Each row is packed with documents of these lengths in
// turn (the last one of a row takes what is left): positions restart at each document, and the
// target of a document's last token is -1 (it would be the next document's first token), as
// compare_hf_packed.py runs every document alone in transformers.
// --emulate-out (with --dtype e4m3): also run the CPU reference model, emulating the same FP8
// rounding (core/fp8_reference.h), on the GPU's bf16 weights, and write its loss and gradients to
// FILE in the same layout (no logits).
// --dtype e4m3 is FP8 training: bf16 model, e4m3 matmuls, e5m2 activation gradients.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/token_file.h"
#include "model/cpu/cpu_model.h"
#include "model/cuda/cuda_model.h"
#include "model/model_config.h"
#include "model/parameters.h"
#include "train/option_table.h"

using namespace qtrain;

int main(int argc, char** argv) {
    (void)qtrain::train_option_table();  // the flag names the models' messages print (model/flag_names.h)
    std::string model_dir, tokens_path, out_path, dtype = "fp32";
    int B = 2, T = 64, steps = 0;
    float lr = 1e-3f;
    CLI::App app{"qtrain_dump"};
    app.add_option("--model", model_dir)->required();
    app.add_option("--tokens", tokens_path)->required();
    app.add_option("--out", out_path)->required();
    app.add_option("--batch", B);
    app.add_option("--seq-len", T);
    app.add_option("--dtype", dtype)->check(CLI::IsMember({"fp32", "bf16", "e4m3"}));
    // the memory and speed flags of issue 5, so compare_hf.py can run the GPU model with them
    ModelOptions opt;
    const std::pair<const char*, bool*> flags[] = {
        {"--recompute-block", &opt.recompute_block},   {"--recompute-ffn", &opt.recompute_ffn},
        {"--recompute-att", &opt.recompute_att},       {"--recompute-norm", &opt.recompute_norm},
        {"--use-cuda-graphs", &opt.use_cuda_graphs},   {"--offload-master", &opt.offload_master},
        {"--offload-opt-m", &opt.offload_opt_m},       {"--offload-opt-v", &opt.offload_opt_v},
        {"--offload-gradients", &opt.offload_gradients}, {"--offload-residual", &opt.offload_residual},
        {"--shard-weights", &opt.shard_weights},       {"--shard-gradients", &opt.shard_gradients},
        {"--write-combined", &opt.write_combined}};
    for (const auto& [name, field] : flags) app.add_flag(name, *field);
    app.add_option("--attn-bwd-chunks", opt.attn_bwd_chunks);
    std::string master_dtype = "fp32", param_grad_dtype = "fp32";
    app.add_option("--master-dtype", master_dtype)->check(CLI::IsMember({"fp32", "bf16"}));
    app.add_option("--param-grad-dtype", param_grad_dtype)->check(CLI::IsMember({"fp32", "bf16"}));
    std::string emulate_out;
    app.add_option("--emulate-out", emulate_out);
    app.add_option("--steps", steps);
    app.add_option("--lr", lr);
    std::vector<int> doc_lengths;
    app.add_option("--doc-lengths", doc_lengths)->delimiter(',')->check(CLI::PositiveNumber);
    CLI11_PARSE(app, argc, argv);
    try {
        ModelConfig cfg = load_model_config(model_dir + "/config.json");
        opt.batch_size = B;
        opt.seq_len = T;
        if (dtype == "e4m3") {
            opt.model_dtype = DType::BF16;
            opt.matmul_dtype = DType::E4M3;
            opt.gradient_dtype = DType::E5M2;
        } else {
            opt.model_dtype = opt.matmul_dtype = opt.gradient_dtype = parse_dtype(dtype, "--dtype", "fp32|bf16");
        }
        // implications as in train (train_options.cpp)
        opt.recompute_ffn |= opt.recompute_block;
        opt.recompute_att |= opt.recompute_block;
        opt.recompute_norm |= opt.recompute_block;
        opt.recompute_swiglu |= opt.recompute_ffn;
        opt.recompute_qkv |= opt.recompute_att;
        opt.master_dtype = parse_dtype(master_dtype, "--master-dtype", "fp32|bf16");
        opt.param_grad_dtype = parse_dtype(param_grad_dtype, "--param-grad-dtype", "fp32|bf16");
        opt.lmhead_chunks = 2;
        opt.document_masking = !doc_lengths.empty();
        CudaModel model(cfg, opt);
        model.load_hf(model_dir);

        TokenFile tf(tokens_path);
        QT_CHECK(tf.size() >= static_cast<int64_t>(B) * T + 1, tokens_path, ": too few tokens");
        std::vector<int32_t> in(B * T), tgt(B * T);
        for (int b = 0; b < B; ++b)
            for (int t = 0; t < T; ++t) {
                // row b is tokens [b*(T+1), b*(T+1)+T], as the Python side builds it
                in[b * T + t] = tf.tokens()[b * (T + 1) + t];
                tgt[b * T + t] = tf.tokens()[b * (T + 1) + t + 1];
            }
        std::vector<int32_t> positions;
        if (!doc_lengths.empty()) {
            positions.resize(static_cast<std::size_t>(B) * T);
            for (int b = 0; b < B; ++b) {
                int t = 0;
                for (std::size_t d = 0; t < T; ++d) {
                    const int len = std::min(doc_lengths[d % doc_lengths.size()], T - t);
                    for (int p = 0; p < len; ++p) positions[b * T + t + p] = p;
                    t += len;
                    tgt[b * T + t - 1] = -1;  // the next document's first token: not this one's to predict
                }
            }
        }
        Batch batch{in.data(), tgt.data(), B, T};
        batch.positions = positions.empty() ? nullptr : positions.data();
        for (int s = 1; s <= steps; ++s) {
            model.forward_backward(batch, 1.0f);
            StepStats st = model.optimizer_step({lr, 0.9f, 0.95f, 1e-8f, 0.0f, 0.0f, s});
            std::printf("step %d loss %.6f norm %.6f\n", s, st.loss, st.grad_norm);
        }
        std::vector<float> logits = model.logits(batch);
        model.forward_backward(batch, 1.0f);
        std::vector<std::vector<float>> grads;
        SafeTensorsWriter w;
        const auto specs = model_parameters(cfg);
        grads.reserve(specs.size());
        for (const ParamSpec& p : specs) {
            grads.push_back(model.download(p.name, CudaModel::Which::Grad));
            w.add_f32("grad." + p.name, p.shape, grads.back().data());
        }
        w.add_f32("logits", {static_cast<int64_t>(B) * T, cfg.vocab_size}, logits.data());
        StepStats st = model.optimizer_step({0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 0.0f, steps + 1});
        std::vector<float> loss = {st.loss, st.grad_norm};
        w.add_f32("loss_and_norm", {2}, loss.data());
        w.write(out_path);
        std::printf("loss %.6f grad_norm %.6f -> %s\n", st.loss, st.grad_norm, out_path.c_str());

        if (!emulate_out.empty()) {
            QT_CHECK(dtype == "e4m3", "--emulate-out needs --dtype e4m3");
            ModelOptions eo = CpuModel::fp32_options(B, T);
            eo.matmul_dtype = opt.matmul_dtype;
            eo.gradient_dtype = opt.gradient_dtype;
            eo.lmhead_chunks = opt.lmhead_chunks;
            CpuModel cpu(cfg, eo);
            for (const ParamSpec& p : cpu.params()) {  // the bf16 weights the GPU computed with
                auto wv = model.download(p.name, CudaModel::Which::Weights);
                std::copy(wv.begin(), wv.end(), cpu.param(p.name));
            }
            cpu.forward_backward(batch, 1.0f);
            SafeTensorsWriter ew;
            std::vector<std::vector<float>> egrads;
            egrads.reserve(specs.size());
            for (const ParamSpec& p : specs) {
                egrads.emplace_back(cpu.grad(p.name), cpu.grad(p.name) + p.numel());
                ew.add_f32("grad." + p.name, p.shape, egrads.back().data());
            }
            const StepStats es = cpu.optimizer_step({0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 0.0f, 1});
            std::vector<float> eloss = {es.loss, es.grad_norm};
            ew.add_f32("loss_and_norm", {2}, eloss.data());
            ew.write(emulate_out);
            std::printf("CPU FP8 emulation: loss %.6f grad_norm %.6f -> %s\n", es.loss, es.grad_norm,
                        emulate_out.c_str());
        }
        return 0;
    } catch (const Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
