// The FP8 base as a memory saving (issue 33; --lora-rank with --matmul-dtype=e4m3 and
// --gradient-dtype=e4m3|e5m2, fp8_base_only in gpu_buffers.h): the GPU keeps the base's layer matrices
// only as their e4m3 copies, the model-dtype weights buffer holds the norms, biases, embedding and
// LM head (GpuParamLayout::compact_index), and their transposes only one at a time, in a scratch matrix
// (fp8_base_transposes_in_backward). The plan (no GPU needed) drops exactly the matrices' bf16 bytes
// and the transposed copies; on the GPU the load's codes and scales are byte for byte what quantising
// the resident bf16 base gives (the full FP8 model's, and the bf16-gradient FP8 base's, which keeps
// it); the base's matrices read back and the merged export come from where the base was loaded
// (--model's files or the seed); and the measured device memory falls by what the plan says.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "cuda_lora_fixture.h"
#include "gpu_model_fixture.h"
#include "measured_device_bytes.h"
#include "model/cuda/gpu_buffers.h"
#include "model/cuda/gpu_layout.h"
#include "model/cuda/layer_matrices.h"
#include "model/lora.h"

using namespace qtrain;
using namespace qtrain::test;

namespace {

// lora_options, fp8_base_options (here `options`), kLoraFamilies, start_lora_models and
// expect_fp8_merge_is_bf16_merge: cuda_lora_fixture.h.

// A bf16 model on `matmul` matmuls with `grad` gradients, LoRA on when lora.rank > 0.
ModelOptions options(DType matmul, DType grad, int B, int T, const LoraOptions& lora) {
    return fp8_base_options(matmul, grad, B, T, lora);
}

int64_t category_bytes(const MemoryPlan& p, const std::string& category) {
    for (const auto& e : p.entries)
        if (e.category == category) return static_cast<int64_t>(e.device_bytes);
    return -1;
}

// The bytes of a layer's matrices in the layout (padding included): what the FP8 base drops per layer.
int64_t matrix_elements_per_layer(const GpuParamLayout& ly) {
    int64_t n = 0;
    for (const auto& r : ly.matrix_runs0) n += r.end - r.begin;
    return n;
}

// Mid-sized configs of each family: large enough that the matrices' bf16 bytes (~120 MB) stand out of
// cudaMalloc's granularity when measured.
ModelConfig mid_qwen2() { return small_config({"qwen2_mid", 1024, 1024, 4096, 4, 16, 4, false}); }
ModelConfig mid_qwen3() {
    ModelConfig c = small_config({"qwen3_mid", 1024, 1024, 4096, 4, 8, 4, true});
    c.architecture = "Qwen3ForCausalLM";
    c.model_type = "qwen3";
    c.qkv_bias = false;
    c.qk_norm = true;
    c.validate("test");
    return c;
}
ModelConfig mid_llama() {
    ModelConfig c = small_config({"llama_mid", 1024, 1024, 4096, 4, 16, 4, false});
    c.architecture = "LlamaForCausalLM";
    c.model_type = "llama";
    c.qkv_bias = false;
    c.rms_norm_eps = 1e-5;
    c.validate("test");
    return c;
}

}  // namespace

// The compact index of the FP8 base's weights buffer: every element outside the layers' matrices
// exactly once, in flat order, inside compact_total(); each tensor contiguous and 64-element aligned
// (the norm kernels' vector loads); a matrix element refused.
TEST(GpuLayoutCompact, IndexesEveryNonMatrixElementOnceInOrder) {
    for (const ModelConfig& cfg : {qwen2_case(), qwen3_case(), llama_case(), preset_config("Qwen2.5-0.5B"),
                                   preset_config("Qwen3-0.6B")}) {
        const GpuParamLayout ly = make_gpu_layout(cfg);
        SCOPED_TRACE(cfg.model_type);
        EXPECT_EQ(ly.compact_total(),
                  ly.total - static_cast<int64_t>(ly.layers.size()) * matrix_elements_per_layer(ly));
        EXPECT_EQ(ly.small_span + matrix_elements_per_layer(ly), ly.layer_span);
        int64_t next = 0;  // (element by element on the tiny cases; the presets' tensors below)
        for (int64_t off = 0; off < (ly.total < (int64_t{1} << 24) ? ly.total : 0); ++off) {
            if (ly.layer_of(off) >= 0 && ly.in_matrix(off)) continue;
            ASSERT_EQ(ly.compact_index(off), next) << "element " << off;
            ++next;
        }
        if (ly.total < (int64_t{1} << 24)) EXPECT_EQ(next, ly.compact_total());
        for (std::size_t i = 0; i < ly.specs.size(); ++i) {
            const int64_t off = ly.offsets[i];
            if (ly.specs[i].kind == ParamKind::Matrix && ly.layer_of(off) >= 0) {
                EXPECT_ERROR(ly.compact_index(off), "in a matrix");
                continue;
            }
            EXPECT_EQ(ly.compact_index(off) % 64, 0) << ly.specs[i].name;
            EXPECT_EQ(ly.compact_index(off + ly.specs[i].numel() - 1) - ly.compact_index(off), ly.specs[i].numel() - 1)
                << ly.specs[i].name;
        }
    }
}

// Qwen2.5-7B, LoRA rank 16 on every target, seq 2048: the FP8 base with FP8 gradients keeps no bf16
// matrix, so its "Weights" are the bf16 base's less exactly the 28 layers' q,k,v,o,gate,up,down in bf16
// (233,046,016 elements a layer, no padding at these widths: 13,050,576,896 bytes); with bf16
// gradients (whose input-gradient GEMMs read the bf16 matrices) the bf16 base stays. Nothing else
// moves but the e4m3 codes: one copy of the layers only (the full FP8 run's two span the embedding and
// head too, one byte an element each), and the transposes the input gradient reads made one matrix at
// a time in "Transpose scratch" (gate|up's [2I, h] = 135,790,592 bytes, the largest); the activations
// and adapters are the bf16 base's.
TEST(LoraFp8BasePlan, Qwen25_7BRank16DropsTheMatricesBf16Bytes) {
    const ModelConfig cfg = preset_config("Qwen2.5-7B");
    LoraOptions lora = lora_options(0.0f);
    lora.rank = 16;
    lora.alpha = 32.0f;
    const int B = 1, T = 2048;
    const MemoryPlan bf16 = gpu_memory_plan(cfg, options(DType::BF16, DType::BF16, B, T, lora), "cuda");
    const MemoryPlan kept = gpu_memory_plan(cfg, options(DType::E4M3, DType::BF16, B, T, lora), "cuda");
    for (DType grad : {DType::E4M3, DType::E5M2}) {
        SCOPED_TRACE(dtype_name(grad));
        const ModelOptions o = options(DType::E4M3, grad, B, T, lora);
        ASSERT_TRUE(fp8_base_only(o));
        ASSERT_TRUE(fp8_base_transposes_in_backward(o));
        const MemoryPlan fp8 = gpu_memory_plan(cfg, o, "cuda");
        const MemoryPlan full = gpu_memory_plan(cfg, options(DType::E4M3, grad, B, T, LoraOptions{}), "cuda");
        const GpuParamLayout ly = make_gpu_layout(cfg);
        EXPECT_EQ(matrix_elements_per_layer(ly), 233046016);
        EXPECT_EQ(category_bytes(bf16, "Weights") - category_bytes(fp8, "Weights"), int64_t{13050576896});
        EXPECT_EQ(category_bytes(fp8, "Weights"), ly.compact_total() * 2);
        EXPECT_EQ(category_bytes(kept, "Weights"), category_bytes(bf16, "Weights"));
        // one e4m3 copy (row-major), of the layers only, not the embedding and head; one scratch matrix
        const int64_t layers_n = ly.layers_end() - ly.layer_begin(0);
        const int64_t scratch = 2 * int64_t{18944} * 3584;
        EXPECT_EQ(category_bytes(fp8, "Quants"), layers_n);
        EXPECT_EQ(category_bytes(fp8, "Transpose scratch"), scratch);
        EXPECT_EQ(category_bytes(full, "Quants") - category_bytes(fp8, "Quants"),
                  (ly.total + 255) / 256 * 256 + ly.total - layers_n);
        for (const MemoryPlan* p : {&bf16, &kept, &full}) EXPECT_EQ(category_bytes(*p, "Transpose scratch"), -1);
        for (const char* same : {"Activations", "LoRA adapters", "LoRA activations"})
            EXPECT_EQ(category_bytes(fp8, same), category_bytes(bf16, same)) << same;
        for (const char* none : {"Master", "Gradients", "Adam M", "Adam V"}) EXPECT_EQ(category_bytes(fp8, none), 0);
        // the whole plan: the bf16-gradient FP8 base's (whose one e4m3 copy spans every element) less the
        // matrices' bf16 bytes, with the copy of the layers only and the scratch, plus dy quantised once
        // (Workspace: the widest, gate|up's [N, 2I], row-major only: no dW GEMM reads a transpose)
        const int64_t workspace = category_bytes(fp8, "Workspace") - category_bytes(kept, "Workspace");
        EXPECT_EQ(workspace, int64_t{B} * T * 2 * 18944);
        EXPECT_EQ(category_bytes(kept, "Quants"), ly.total);
        EXPECT_EQ(static_cast<int64_t>(kept.total_device()) - static_cast<int64_t>(fp8.total_device()),
                  int64_t{13050576896} + ly.total - layers_n - scratch - workspace);
        // the layout before the just-in-time transposes (the test-only fp8_base_keep_transposed): a
        // second, transposed, copy of the layers in "Quants" and no scratch; all else the same
        ModelOptions keep_t = o;
        keep_t.fp8_base_keep_transposed = true;
        ASSERT_FALSE(fp8_base_transposes_in_backward(keep_t));
        const MemoryPlan old = gpu_memory_plan(cfg, keep_t, "cuda");
        EXPECT_EQ(category_bytes(old, "Quants"), (layers_n + 255) / 256 * 256 + layers_n);
        EXPECT_EQ(category_bytes(old, "Transpose scratch"), -1);
        EXPECT_EQ(static_cast<int64_t>(old.total_device()) - static_cast<int64_t>(fp8.total_device()),
                  (layers_n + 255) / 256 * 256 - scratch);
        EXPECT_GT(layers_n, 6 * (int64_t{1} << 30));  // (6.1 GiB saved)
    }
    EXPECT_FALSE(fp8_base_only(options(DType::E4M3, DType::BF16, B, T, lora)));
    EXPECT_FALSE(fp8_base_transposes_in_backward(options(DType::E4M3, DType::BF16, B, T, lora)));
    EXPECT_FALSE(fp8_base_only(options(DType::E4M3, DType::E5M2, B, T, LoraOptions{})));
    EXPECT_FALSE(fp8_base_transposes_in_backward(options(DType::E4M3, DType::E5M2, B, T, LoraOptions{})));
}

// The transpose scratch is exactly the largest of a layer's four matrices ([out, in]: q|k|v, o, gate|up,
// down) for every family and size, so each matrix's transpose fits; "Quants" is the layers' e4m3 copy
// alone. Qwen2.5-14B (rank 16, seq 2048): gate|up's 2 x 13824 x 5120 bytes, and 14B's plan is the
// kept-transpose layout's less the layers' second copy (12.3 GiB) plus the scratch.
TEST(LoraFp8BasePlan, TransposeScratchIsTheLargestMatrix) {
    LoraOptions lora = lora_options(0.0f);
    lora.rank = 16;
    for (const ModelConfig& cfg : {qwen2_case(), qwen3_case(), llama_case(), mid_qwen3(), preset_config("Qwen2.5-0.5B"),
                                   preset_config("Qwen3-0.6B"), preset_config("Qwen2.5-14B")}) {
        SCOPED_TRACE(cfg.model_type + " " + std::to_string(cfg.hidden_size));
        const GpuParamLayout ly = make_gpu_layout(cfg);
        const ModelOptions o = options(DType::E4M3, DType::E5M2, 1, 2048, lora);
        const MemoryPlan p = gpu_memory_plan(cfg, o, "cuda");
        const int64_t h = cfg.hidden_size, I = cfg.intermediate_size, qkvd = cfg.q_dim() + 2 * cfg.kv_dim();
        const int64_t sizes[4] = {qkvd * h, h * cfg.q_dim(), 2 * I * h, h * I};
        int64_t largest = 0;
        for (int m = 0; m < 4; ++m) {
            const MatrixShape g = layer_matrix(ly, cfg, 0, static_cast<Matrix>(m));
            EXPECT_EQ(g.rows * g.cols, sizes[m]) << "matrix " << m;
            largest = std::max(largest, sizes[m]);
        }
        EXPECT_EQ(category_bytes(p, "Transpose scratch"), largest);
        const int64_t layers_n = ly.layers_end() - ly.layer_begin(0);
        EXPECT_EQ(category_bytes(p, "Quants"), layers_n);
        ModelOptions keep_t = o;
        keep_t.fp8_base_keep_transposed = true;
        const MemoryPlan old = gpu_memory_plan(cfg, keep_t, "cuda");
        EXPECT_EQ(static_cast<int64_t>(old.total_device()) - static_cast<int64_t>(p.total_device()),
                  (layers_n + 255) / 256 * 256 - largest);
        if (cfg.hidden_size == 5120) EXPECT_EQ(largest, 2 * int64_t{13824} * 5120);  // 14B
    }
}

namespace {

// Every layer matrix's e4m3 codes (and, with FP8 gradients, the transposed codes) and scales equal.
void expect_same_fp8_copies(const CudaModel& a, const CudaModel& b, const ModelConfig& cfg, bool transposed) {
    for (int l = 0; l < cfg.num_hidden_layers; ++l)
        for (int mi = 0; mi < 4; ++mi) {
            const Matrix m = static_cast<Matrix>(mi);
            SCOPED_TRACE(testing::Message() << "layer " << l << " matrix " << mi);
            EXPECT_EQ(a.download_fp8_matrix(l, m, false), b.download_fp8_matrix(l, m, false));
            if (transposed) EXPECT_EQ(a.download_fp8_matrix(l, m, true), b.download_fp8_matrix(l, m, true));
            EXPECT_EQ(a.fp8_matrix_scale(l, m), b.fp8_matrix_scale(l, m));
        }
}

}  // namespace

// The load quantises each matrix from a staging buffer: the codes, transposed codes and per-tensor
// scales are those quantize() makes from the resident bf16 base (the full FP8 model's, with the same
// gradients; the row-major codes also the bf16-gradient FP8 base's, which keeps its bf16 base), so the
// FP8 base's GEMMs read the same bytes as before; from the seed and from --model's files.
TEST(CudaLoraFp8Base, LoadGivesTheCodesAndScalesOfTheBf16Base) {
    QTRAIN_REQUIRE_GPU();
    for (const FamilyCase& fc : kLoraFamilies) {  // (tiny: each with its own biases / q-k norm / tying)
        SCOPED_TRACE(fc.name);
        const ModelConfig cfg = fc.make();
        const int B = 2, T = 48;
        for (DType grad : {DType::E4M3, DType::E5M2}) {
            SCOPED_TRACE(dtype_name(grad));
            CudaModel fp8(cfg, options(DType::E4M3, grad, B, T, lora_options(0.0f)));
            CudaModel full(cfg, options(DType::E4M3, grad, B, T, LoraOptions{}));
            CudaModel kept(cfg, options(DType::E4M3, DType::BF16, B, T, lora_options(0.0f)));
            for (CudaModel* m : {&fp8, &full, &kept}) m->init_random(31);
            expect_same_fp8_copies(fp8, full, cfg, true);
            expect_same_fp8_copies(fp8, kept, cfg, false);
            // from --model's files: the full model's export, loaded
            TempDir dir;
            full.save_hf(dir.file("base"));
            CudaModel loaded(cfg, options(DType::E4M3, grad, B, T, lora_options(0.0f)));
            loaded.load_hf(dir.file("base"));
            expect_same_fp8_copies(loaded, full, cfg, true);
        }
    }
}

// What reads the base's matrices gets the original bf16 values from where the base was loaded
// (download / read_tensor, the Python view, qtrain_lora_dump): the same as the bf16-gradient FP8
// base, which keeps them on the GPU; norms and biases read from the device as before. Setting a
// matrix afterwards is refused naming the flags (the e4m3 copy is made once, by the load).
TEST(CudaLoraFp8Base, BaseMatricesReadBackFromTheirSource) {
    QTRAIN_REQUIRE_GPU();
    const ModelConfig cfg = qwen2_case();
    const int B = 2, T = 48;
    CudaModel fp8(cfg, options(DType::E4M3, DType::E5M2, B, T, lora_options(0.0f)));
    CudaModel kept(cfg, options(DType::E4M3, DType::BF16, B, T, lora_options(0.0f)));
    const std::string q = "model.layers.1.self_attn.q_proj.weight";
    EXPECT_ERROR(fp8.download(q, CudaModel::Which::Weights), "nothing has been loaded yet");
    fp8.init_random(5);
    kept.init_random(5);
    Rng rng(8);
    const CpuModel names(cfg, CpuModel::fp32_options(B, T));
    for (const auto& p : names.params()) {
        std::vector<float> v(p.numel());
        if (p.kind == ParamKind::Norm || p.kind == ParamKind::Bias) {  // off their init, on both
            for (float& x : v) x = 0.3f * rng.normal();
            fp8.upload_master(p.name, v.data());
            kept.upload_master(p.name, v.data());
        }
    }
    for (const auto& p : names.params())
        for (auto w : {CudaModel::Which::Weights, CudaModel::Which::Master})
            EXPECT_EQ(fp8.download(p.name, w), kept.download(p.name, w)) << p.name;
    std::vector<float> v(cfg.q_dim() * cfg.hidden_size, 0.01f);
    EXPECT_ERROR(fp8.upload_master(q, v.data()), q, "--matmul-dtype=e4m3", "--gradient-dtype=e5m2",
                 "cannot be set afterwards");
    EXPECT_ERROR(fp8.download(q, CudaModel::Which::Grad), "frozen under LoRA");
    // from --model's files
    TempDir dir;  // (a LoRA model's save_hf writes the adapter: the base goes out through a full model)
    CudaModel full(cfg, options(DType::BF16, DType::BF16, B, T, LoraOptions{}));
    for (const auto& p : names.params()) full.upload_master(p.name, kept.download(p.name, CudaModel::Which::Weights).data());
    full.save_hf(dir.file("full"));
    CudaModel loaded(cfg, options(DType::E4M3, DType::E4M3, B, T, lora_options(0.0f)));
    loaded.load_hf(dir.file("full"));
    for (const auto& p : names.params())
        EXPECT_EQ(loaded.download(p.name, CudaModel::Which::Weights), kept.download(p.name, CudaModel::Which::Weights))
            << p.name;
}

// Three AdamW steps of two micro-batches with dropout on the FP8 base without its bf16 matrices: eager,
// CUDA graphs, --recompute-block and both give the same losses, norms, adapters and moments bit for
// bit, for every family. (Its steps read the e4m3 copies, which LoadGivesTheCodesAndScalesOfTheBf16Base
// shows are the kept-bf16 base's bytes, through the same code as before.) And its forward is the
// bf16-gradient FP8 base's (which keeps the bf16 matrices; the forward does not depend on the
// gradient dtype) to the bit: evaluation loss and logits.
TEST(CudaLoraFp8Base, StepsAreBitIdenticalAcrossGraphsAndRecompute) {
    QTRAIN_REQUIRE_GPU();
    for (const FamilyCase& fc : kLoraFamilies) {  // (tiny: each with its own biases / q-k norm / tying)
        SCOPED_TRACE(fc.name);
        const ModelConfig cfg = fc.make();
        const int B = 2, T = 48;
        const ModelOptions eager = options(DType::E4M3, DType::E5M2, B, T, lora_options(0.2f));
        ModelOptions graphs = eager, block = eager, both = eager;
        graphs.use_cuda_graphs = both.use_cuda_graphs = true;
        block.recompute_block = both.recompute_block = true;
        std::vector<std::vector<float>> losses;
        std::vector<std::vector<float>> masters;
        for (const ModelOptions& o : {eager, graphs, block, both}) {
            CudaModel m(cfg, o);
            start_lora_models({&m}, 9, 3);
            std::vector<float> ls, ms;
            for (int step = 1; step <= 3; ++step) {
                for (int micro = 0; micro < 2; ++micro) {
                    const Tokens d = random_tokens(B, T, cfg.vocab_size, 100 * step + micro, Masked::Every11thFrom3);
                    m.forward_backward(d.batch(B, T), 0.5f);
                }
                const StepStats st = m.optimizer_step({1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step});
                ls.push_back(st.loss);
                ls.push_back(st.grad_norm);
            }
            for (const ParamSpec& s : m.lora()->host().specs())
                for (auto w : {CudaModel::Which::Master, CudaModel::Which::AdamM, CudaModel::Which::AdamV}) {
                    const std::vector<float> v = m.download(s.name, w);
                    ms.insert(ms.end(), v.begin(), v.end());
                }
            losses.push_back(ls);
            masters.push_back(ms);
        }
        for (std::size_t i = 1; i < losses.size(); ++i) {
            EXPECT_EQ(losses[i], losses[0]) << "run " << i;
            EXPECT_EQ(masters[i], masters[0]) << "run " << i;
        }
        // the forward: the same bits as the FP8 base that keeps its bf16 matrices
        CudaModel saving(cfg, eager), kept(cfg, options(DType::E4M3, DType::BF16, B, T, lora_options(0.2f)));
        saving.init_random(9);
        kept.init_random(9);
        const Tokens e = random_tokens(B, T, cfg.vocab_size, 999, Masked::Every11thFrom3);
        EXPECT_EQ(saving.evaluate(e.batch(B, T)), kept.evaluate(e.batch(B, T)));
        EXPECT_EQ(saving.logits(e.batch(B, T)), kept.logits(e.batch(B, T)));
    }
}

// --merge-lora of the FP8 base without its bf16 matrices: the merged model is the original bf16 base
// (read again from --model's files) + s B A, byte for byte the bf16 base's run holding the same
// adapters (the seed's base is MergedExportIsTheBf16BasePlusTheAdapters in cuda_lora_fp8_test.cpp).
TEST(CudaLoraFp8Base, MergedExportFromModelFilesIsTheBf16BasePlusTheAdapters) {
    QTRAIN_REQUIRE_GPU();
    for (const FamilyCase& fc : kLoraFamilies) {  // (tiny: each with its own biases / q-k norm / tying)
        SCOPED_TRACE(fc.name);
        const ModelConfig cfg = fc.make();
        TempDir dir;
        {  // a base off its init (norms and biases too), as --model's files
            CudaModel base(cfg, options(DType::BF16, DType::BF16, 2, 48, LoraOptions{}));
            base.init_random(17);
            Rng rng(2);
            const CpuModel names(cfg, CpuModel::fp32_options(2, 48));
            for (const auto& p : names.params()) {
                std::vector<float> v = base.download(p.name, CudaModel::Which::Weights);
                for (float& x : v) x += 0.01f * rng.normal();
                base.upload_master(p.name, v.data());
            }
            base.save_hf(dir.file("base"));
        }
        LoraOptions lora = lora_options(0.0f);
        lora.merge = true;
        CudaModel fp8(cfg, options(DType::E4M3, DType::E5M2, 2, 48, lora));
        CudaModel bf16(cfg, options(DType::BF16, DType::BF16, 2, 48, lora));
        fp8.load_hf(dir.file("base"));
        bf16.load_hf(dir.file("base"));
        expect_fp8_merge_is_bf16_merge(fp8, bf16, cfg);
    }
}

// Measured: the FP8 base without its bf16 matrices takes less device memory than the FP8 base that
// keeps them (bf16 gradients) and than the bf16 base, by what the plans say (within 16 MiB:
// cudaMalloc's 2 MiB granularity over the arenas), and the saving is at least the matrices' bf16
// bytes less the FP8 gradients' own buffers; and less than the layout that kept every transposed e4m3
// copy, by the layers' e4m3 bytes less the transpose scratch. Mid-sized configs of each family (~120
// MB of matrices).
TEST(CudaLoraFp8Base, MeasuredDeviceMemoryFallsByThePlannedAmount) {
    QTRAIN_REQUIRE_GPU();
    const int B = 2, T = 64;
    const int64_t slack = int64_t{16} << 20;
    for (ModelConfig (*make)() : {mid_qwen2, mid_qwen3, mid_llama}) {
        const ModelConfig cfg = make();
        SCOPED_TRACE(cfg.model_type);
        const ModelOptions saving = options(DType::E4M3, DType::E5M2, B, T, lora_options(0.0f));
        const ModelOptions kept = options(DType::E4M3, DType::BF16, B, T, lora_options(0.0f));
        const ModelOptions bf16 = options(DType::BF16, DType::BF16, B, T, lora_options(0.0f));
        // the process's one-off allocations for these shapes (handles, module loads, attention plans)
        // before any measurement
        for (const ModelOptions* o : {&saving, &kept, &bf16}) measured_device_bytes(cfg, *o);
        const int64_t m_saving = measured_device_bytes(cfg, saving), m_kept = measured_device_bytes(cfg, kept),
                      m_bf16 = measured_device_bytes(cfg, bf16);
        auto planned = [&](const ModelOptions& o) { return static_cast<int64_t>(gpu_memory_plan(cfg, o, "cuda").total_device()); };
        std::printf("[fp8 base memory %s] measured: FP8 base %lld, kept bf16 %lld, bf16 base %lld bytes; planned %lld, "
                    "%lld, %lld\n",
                    cfg.model_type.c_str(), static_cast<long long>(m_saving), static_cast<long long>(m_kept),
                    static_cast<long long>(m_bf16), static_cast<long long>(planned(saving)),
                    static_cast<long long>(planned(kept)), static_cast<long long>(planned(bf16)));
        EXPECT_NEAR(static_cast<double>(m_kept - m_saving), static_cast<double>(planned(kept) - planned(saving)),
                    static_cast<double>(slack));
        EXPECT_NEAR(static_cast<double>(m_bf16 - m_saving), static_cast<double>(planned(bf16) - planned(saving)),
                    static_cast<double>(slack));
        const GpuParamLayout ly = make_gpu_layout(cfg);
        const int64_t matrices_bf16 = 2 * cfg.num_hidden_layers * matrix_elements_per_layer(ly);
        EXPECT_GT(matrices_bf16, int64_t{100} << 20);
        // FP8 gradients' own buffers: the transpose scratch (the largest matrix, gate|up) and dy
        // quantised (within the slack here)
        const int64_t scratch = 2 * cfg.intermediate_size * cfg.hidden_size;
        EXPECT_GT(m_kept - m_saving, matrices_bf16 - scratch - slack);
        EXPECT_LT(m_saving, m_bf16);
        // the layout that kept every transposed copy takes the layers' e4m3 bytes more, less the scratch
        ModelOptions keep_t = saving;
        keep_t.fp8_base_keep_transposed = true;
        measured_device_bytes(cfg, keep_t);
        const int64_t m_keep_t = measured_device_bytes(cfg, keep_t);
        const int64_t layers_n = ly.layers_end() - ly.layer_begin(0);
        EXPECT_NEAR(static_cast<double>(m_keep_t - m_saving), static_cast<double>(planned(keep_t) - planned(saving)),
                    static_cast<double>(slack));
        EXPECT_GT(m_keep_t - m_saving, layers_n - scratch - slack);
        EXPECT_GT(layers_n - scratch, 2 * slack);  // (the difference stands out of the slack)
    }
}

// --train-also=norms,embeddings on the FP8 base without bf16 matrices: the trained tensors live in the
// compact weights buffer (LoraAdapters::bind_base gets their places there), so what the forward reads
// after two steps is what they were trained to: a model that trains only the adapters, given those
// values (norms, embedding, head) and the same adapters, evaluates to the same bits; and reading a
// trained tensor back gives its master rounded to bf16. Untied Qwen2 and tied Qwen3.
TEST(CudaLoraFp8Base, TrainedNormsAndEmbeddingsReachTheForward) {
    QTRAIN_REQUIRE_GPU();
    for (ModelConfig (*make)() : {qwen2_case, qwen3_case}) {
        const ModelConfig cfg = make();
        SCOPED_TRACE(cfg.model_type);
        const int B = 2, T = 48;
        LoraOptions also = lora_options(0.0f);
        also.train_also = kTrainNorms | kTrainEmbeddings;
        CudaModel trained(cfg, options(DType::E4M3, DType::E5M2, B, T, also));
        CudaModel plain(cfg, options(DType::E4M3, DType::E5M2, B, T, lora_options(0.0f)));
        trained.init_random(13);
        plain.init_random(13);
        for (int step = 1; step <= 2; ++step) {
            const Tokens d = random_tokens(B, T, cfg.vocab_size, 40 + step, Masked::Every11thFrom3);
            trained.forward_backward(d.batch(B, T), 1.0f);
            trained.optimizer_step({1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step});
        }
        const CpuModel names(cfg, CpuModel::fp32_options(B, T));
        int moved = 0;
        for (const auto& p : names.params()) {
            // (the frozen layer matrices and biases: the same seed's on both)
            if (p.kind == ParamKind::Bias || (p.kind == ParamKind::Matrix && p.layer >= 0)) continue;
            const std::vector<float> w = trained.download(p.name, CudaModel::Which::Weights);
            std::vector<float> m = trained.download(p.name, CudaModel::Which::Master);
            for (float& x : m) x = bf16_to_float(float_to_bf16(x));
            EXPECT_EQ(w, m) << p.name;
            if (w != plain.download(p.name, CudaModel::Which::Weights)) ++moved;
            plain.upload_master(p.name, w.data());
        }
        EXPECT_GT(moved, 0) << "no trained tensor moved";
        for (const ParamSpec& s : plain.lora()->host().specs())
            plain.upload_master(s.name, trained.download(s.name, CudaModel::Which::Master).data());
        const Tokens e = random_tokens(B, T, cfg.vocab_size, 77, Masked::Every11thFrom3);
        EXPECT_EQ(trained.evaluate(e.batch(B, T)), plain.evaluate(e.batch(B, T)));
    }
}
