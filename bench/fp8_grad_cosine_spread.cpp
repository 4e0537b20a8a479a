// Seed-to-seed spread of the statistic that CudaModelFp8.LossAndGradientsTrackTheFp32Reference bounds
// (tests/gpu/cuda_model_test.cpp): the median over parameter tensors of the cosine between FP8 and
// fp32 gradients, on the same three shapes, batch 2 x 64. This runs on the CPU reference model, which
// emulates FP8 rounding with the GPU's per-tensor scales (the GPU's gradients are measurably nearer
// to it than to fp32), so what it shows is FP8's own error, over many inits and batches instead of
// the test's one.
//
//   fp8_grad_cosine_spread [seeds]     (default 30; 100 seeds take ~1 min on 2 cores)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>
#include <string>
#include "core/dtype.h"
#include "core/rng.h"
#include "model/cpu/cpu_model.h"
#include "train/option_table.h"
using namespace qtrain;
static double cosine(const float* a, const float* b, size_t n) {
    double d = 0, na = 0, nb = 0;
    for (size_t i = 0; i < n; ++i) d += double(a[i]) * b[i], na += double(a[i]) * a[i], nb += double(b[i]) * b[i];
    return (na > 0 && nb > 0) ? d / std::sqrt(na * nb) : 1.0;
}
int main(int argc, char** argv) {
    (void)qtrain::train_option_table();  // the flag names the models' messages print (model/flag_names.h)
    const int nseeds = argc > 1 ? atoi(argv[1]) : 30;
    struct S { const char* name; int vocab, hidden, inter, layers, heads, kv; bool tied; };
    S shapes[] = {{"d64_gqa2_untied", 97, 128, 96, 2, 2, 1, false}, {"d64_gqa2_tied", 97, 256, 160, 2, 4, 2, true},
                  {"d128_mha_untied", 131, 256, 192, 2, 2, 2, false}};
    for (const S& s : shapes) {
        ModelConfig c;
        c.vocab_size = s.vocab; c.hidden_size = s.hidden; c.intermediate_size = s.inter; c.num_hidden_layers = s.layers;
        c.num_attention_heads = s.heads; c.num_key_value_heads = s.kv; c.head_dim = s.hidden / s.heads;
        c.tie_word_embeddings = s.tied; c.rope_theta = 10000.0; c.rms_norm_eps = 1e-6; c.initializer_range = 0.05;
        c.validate("x");
        for (DType g : {DType::E4M3, DType::E5M2}) {
            std::vector<double> medians;
            for (int seed = 0; seed < nseeds; ++seed) {
                const int B = 2, T = 64;
                ModelOptions eo = CpuModel::fp32_options(B, T);
                eo.matmul_dtype = DType::E4M3; eo.gradient_dtype = g;
                CpuModel fp32(c, CpuModel::fp32_options(B, T)), emu(c, eo);
                fp32.init_random(99 + seed); emu.init_random(99 + seed);
                for (const auto& p : fp32.params()) {  // bf16-rounded weights, as the GPU starts from
                    float* w = fp32.param(p.name);
                    for (int64_t i = 0; i < p.numel(); ++i) w[i] = bf16_to_float(float_to_bf16(w[i]));
                    std::copy(w, w + p.numel(), emu.param(p.name));
                }
                Rng r(8 + 1000 * seed);
                std::vector<int32_t> in, tgt;
                for (int i = 0; i < B * T; ++i) {
                    in.push_back(int32_t(r.below(c.vocab_size)));
                    tgt.push_back(i % 11 == 3 ? -1 : int32_t(r.below(c.vocab_size)));
                }
                Batch b{in.data(), tgt.data(), B, T};
                fp32.forward_backward(b, 1.0f); emu.forward_backward(b, 1.0f);
                std::vector<double> cs;
                for (const auto& p : fp32.params()) {
                    if (std::string(p.name).find("k_proj.bias") != std::string::npos) continue;
                    cs.push_back(cosine(emu.grad(p.name), fp32.grad(p.name), p.numel()));
                }
                std::sort(cs.begin(), cs.end());
                medians.push_back(cs[cs.size() / 2]);
            }
            std::sort(medians.begin(), medians.end());
            double mean = 0, sd = 0;
            for (double m : medians) mean += m;
            mean /= medians.size();
            for (double m : medians) sd += (m - mean) * (m - mean);
            sd = medians.size() > 1 ? std::sqrt(sd / (medians.size() - 1)) : 0.0;
            int below = 0;
            for (double m : medians) below += m < 0.99;
            std::printf("%-16s grads %s: median-cosine over %d seeds: min %.5f  mean %.5f  sd %.5f  max %.5f  below 0.99: %d\n",
                        s.name, std::string(dtype_name(g)).c_str(), nseeds, medians.front(), mean, sd, medians.back(), below);
            std::fflush(stdout);
        }
    }
}
