// The CPU reference model as a whole: AdamW against a hand computation, a tiny run that learns,
// determinism, checkpoint and HF round trips, options it refuses.
#include <algorithm>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/files.h"
#include "cpu_test_util.h"
#include "io/safetensors.h"
#include "model/cpu/cpu_model.h"
#include "test_util.h"

namespace qtrain {
namespace {

using test::Near;

std::vector<float> copy_of(CpuModel& m, const std::string& name, float* (CpuModel::*which)(const std::string&)) {
    const auto& specs = m.params();
    for (const auto& s : specs)
        if (s.name == name) {
            float* p = (m.*which)(name);
            return std::vector<float>(p, p + s.numel());
        }
    ADD_FAILURE() << "no tensor " << name;
    return {};
}

std::vector<float> all_params(CpuModel& m) {
    std::vector<float> out;
    for (const auto& s : m.params()) {
        const float* p = m.param(s.name);
        out.insert(out.end(), p, p + s.numel());
    }
    return out;
}

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

// ---------------------------------------------------------------------------------------------------
// AdamW
// ---------------------------------------------------------------------------------------------------

struct AdamRef {  // one tensor's optimizer state, tracked in double
    std::vector<double> p, m, v;
};

void adam_reference(AdamRef& r, const std::vector<float>& grad, double clip_scale, const OptimizerParams& o,
                    bool decay) {
    const double bc1 = 1 - std::pow(static_cast<double>(o.beta1), o.step);
    const double bc2 = 1 - std::pow(static_cast<double>(o.beta2), o.step);
    for (size_t i = 0; i < grad.size(); ++i) {
        const double g = grad[i] * clip_scale;
        r.m[i] = o.beta1 * r.m[i] + (1 - static_cast<double>(o.beta1)) * g;
        r.v[i] = o.beta2 * r.v[i] + (1 - static_cast<double>(o.beta2)) * g * g;
        const double update = (r.m[i] / bc1) / (std::sqrt(r.v[i] / bc2) + o.epsilon);
        r.p[i] -= o.learning_rate * (update + (decay ? o.weight_decay * r.p[i] : 0.0));
    }
}

TEST(CpuModelOptimizer, AdamWStepMatchesHandComputation) {
    const ModelConfig cfg = test::tiny_config(false);
    CpuModel model(cfg, CpuModel::fp32_options(2, 5));
    model.init_random(5);
    // Norm weights start at exactly 1: move them so that missing decay would show.
    for (int l = 0; l < cfg.num_hidden_layers; ++l) {
        float* w = model.param("model.layers." + std::to_string(l) + ".input_layernorm.weight");
        for (int i = 0; i < cfg.hidden_size; ++i) w[i] = 1.0f + 0.01f * i;
    }
    const std::vector<std::string> names = {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                                            "model.layers.0.self_attn.q_proj.bias",
                                            "model.layers.0.input_layernorm.weight", "lm_head.weight"};
    std::vector<AdamRef> ref(names.size());
    for (size_t k = 0; k < names.size(); ++k) {
        auto p = copy_of(model, names[k], &CpuModel::param);
        ref[k].p.assign(p.begin(), p.end());
        ref[k].m.assign(p.size(), 0.0);
        ref[k].v.assign(p.size(), 0.0);
    }

    for (int step = 1; step <= 2; ++step) {
        const test::TokenBatch tb = test::random_batch(2, 5, cfg.vocab_size, 100 + step, 4);
        model.forward_backward(tb.view(), 0.5f);
        model.forward_backward(tb.view(), 0.5f);
        double ss = 0.0;
        for (const auto& s : model.params())
            for (int64_t i = 0; i < s.numel(); ++i)
                ss += static_cast<double>(model.grad(s.name)[i]) * model.grad(s.name)[i];
        const double norm = std::sqrt(ss);
        std::vector<std::vector<float>> grads;
        for (const auto& n : names) grads.push_back(copy_of(model, n, &CpuModel::grad));
        const double expected_loss = model.step_loss();

        OptimizerParams o;
        o.learning_rate = 1e-2f;
        o.weight_decay = 0.1f;
        o.step = step;
        // Step 1 clips (threshold a quarter of the norm); step 2 has a threshold above the norm.
        o.grad_clip = static_cast<float>(step == 1 ? norm / 4 : norm * 2);
        const double clip_scale = step == 1 ? o.grad_clip / norm : 1.0;
        const StepStats stats = model.optimizer_step(o);
        EXPECT_TRUE(Near(stats.grad_norm, norm, 1e-6, 0)) << "step " << step;
        EXPECT_EQ(stats.loss, static_cast<float>(expected_loss));
        EXPECT_EQ(model.step_loss(), 0.0);

        for (size_t k = 0; k < names.size(); ++k) {
            const bool decay = names[k].find("norm") == std::string::npos && names[k].find("bias") == std::string::npos;
            adam_reference(ref[k], grads[k], clip_scale, o, decay);
            const float* p = model.param(names[k]);
            const float* m = model.adam_m(names[k]);
            const float* v = model.adam_v(names[k]);
            for (size_t i = 0; i < ref[k].p.size(); ++i) {
                ASSERT_TRUE(Near(p[i], ref[k].p[i], 1e-6, 1e-8)) << names[k] << "[" << i << "] step " << step;
                ASSERT_TRUE(Near(m[i], ref[k].m[i], 1e-5, 1e-12)) << names[k] << "[" << i << "] step " << step;
                ASSERT_TRUE(Near(v[i], ref[k].v[i], 1e-5, 1e-15)) << names[k] << "[" << i << "] step " << step;
                ASSERT_EQ(model.grad(names[k])[i], 0.0f) << "gradients are zeroed after the step";
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Training
// ---------------------------------------------------------------------------------------------------

// Rows of a repeating 7-token cycle, each row starting at a different phase: the next token is a
// function of the current one, so a model that learns anything drives the loss towards zero.
test::TokenBatch cyclic_batch(int B, int T, int vocab) {
    test::TokenBatch b{B, T, std::vector<int32_t>(B * T), std::vector<int32_t>(B * T)};
    const int cycle[7] = {3, 17, 5, 29, 11, 36, 0};
    for (int r = 0; r < B; ++r)
        for (int t = 0; t < T; ++t) {
            b.inputs[r * T + t] = cycle[(r + t) % 7] % vocab;
            b.targets[r * T + t] = cycle[(r + t + 1) % 7] % vocab;
        }
    return b;
}

TEST(CpuModelTraining, LossFallsOnARepetitiveSequence) {
    const ModelConfig cfg = test::tiny_config(true);
    CpuModel model(cfg, CpuModel::fp32_options(4, 16));
    model.init_random(11);
    const test::TokenBatch tb = cyclic_batch(4, 16, cfg.vocab_size);
    const float initial = model.evaluate(tb.view());
    EXPECT_NEAR(initial, std::log(37.0f), 0.1f) << "a fresh model predicts ~uniformly";
    OptimizerParams o;
    o.learning_rate = 1e-2f;
    o.weight_decay = 0.01f;
    o.grad_clip = 1.0f;
    float last = 0.0f;
    for (int step = 1; step <= 60; ++step) {
        model.forward_backward(tb.view(), 1.0f);
        o.step = step;
        const StepStats s = model.optimizer_step(o);
        ASSERT_TRUE(std::isfinite(s.loss) && std::isfinite(s.grad_norm)) << "step " << step;
        last = s.loss;
    }
    const float final_eval = model.evaluate(tb.view());
    EXPECT_LT(final_eval, 0.1f * initial) << "initial " << initial << ", last train loss " << last;
}

// Two runs from the same seed on the same data agree bit for bit: losses, norms and every weight.
// The shapes are large enough for the sgemm and OpenMP paths to run multi-threaded.
TEST(CpuModelTraining, RunsAreBitIdentical) {
    ModelConfig cfg = test::tiny_config(false);
    cfg.vocab_size = 1001;
    cfg.hidden_size = 64;
    cfg.head_dim = 16;
    cfg.intermediate_size = 128;
    auto run = [&](std::vector<float>& losses, std::vector<float>& norms) {
        ModelOptions opt = CpuModel::fp32_options(4, 32);
        opt.lmhead_chunks = 3;
        CpuModel model(cfg, opt);
        model.init_random(21);
        OptimizerParams o;
        o.learning_rate = 3e-3f;
        o.weight_decay = 0.1f;
        o.grad_clip = 0.5f;
        for (int step = 1; step <= 3; ++step) {
            for (int micro = 0; micro < 2; ++micro) {
                const test::TokenBatch tb = test::random_batch(4, 32, cfg.vocab_size, step * 10 + micro, 5);
                model.forward_backward(tb.view(), 0.5f);
            }
            o.step = step;
            const StepStats s = model.optimizer_step(o);
            losses.push_back(s.loss);
            norms.push_back(s.grad_norm);
        }
        return all_params(model);
    };
    std::vector<float> la, na, lb, nb;
    const auto pa = run(la, na);
    const auto pb = run(lb, nb);
    EXPECT_TRUE(bit_identical(la, lb));
    EXPECT_TRUE(bit_identical(na, nb));
    EXPECT_TRUE(bit_identical(pa, pb));
}

// ---------------------------------------------------------------------------------------------------
// Checkpoints and HF files
// ---------------------------------------------------------------------------------------------------

void train_steps(CpuModel& model, int first_step, int n, std::vector<float>* losses) {
    OptimizerParams o;
    o.learning_rate = 1e-2f;
    o.weight_decay = 0.1f;
    o.grad_clip = 1.0f;
    for (int step = first_step; step < first_step + n; ++step) {
        const test::TokenBatch tb = test::random_batch(2, 8, model.config().vocab_size, 500 + step, 3);
        model.forward_backward(tb.view(), 1.0f);
        o.step = step;
        losses->push_back(model.optimizer_step(o).loss);
    }
}

TEST(CpuModelCheckpoint, ResumeContinuesBitIdentically) {
    test::TempDir dir;
    const ModelConfig cfg = test::tiny_config(false);
    CpuModel a(cfg, CpuModel::fp32_options(2, 8));
    a.init_random(31);
    std::vector<float> la, lb;
    train_steps(a, 1, 2, &la);
    a.save_checkpoint(dir / "ckpt");
    EXPECT_TRUE(std::filesystem::exists(dir / "ckpt/model.safetensors"));
    EXPECT_TRUE(std::filesystem::exists(dir / "ckpt/optimizer.safetensors"));
    train_steps(a, 3, 3, &la);

    CpuModel b(cfg, CpuModel::fp32_options(2, 8));
    b.init_random(77);  // different weights: the checkpoint must replace all of them
    b.load_checkpoint(dir / "ckpt");
    train_steps(b, 3, 3, &lb);
    EXPECT_TRUE(bit_identical(std::vector<float>(la.begin() + 2, la.end()), lb));
    EXPECT_TRUE(bit_identical(all_params(a), all_params(b)));
    for (const auto& s : a.params()) {
        EXPECT_EQ(0, std::memcmp(a.adam_m(s.name), b.adam_m(s.name), sizeof(float) * s.numel())) << s.name;
        EXPECT_EQ(0, std::memcmp(a.adam_v(s.name), b.adam_v(s.name), sizeof(float) * s.numel())) << s.name;
    }
}

TEST(CpuModelCheckpoint, MissingTensorIsAClearErrorAndChangesNothing) {
    test::TempDir dir;
    const ModelConfig cfg = test::tiny_config(true);
    CpuModel a(cfg, CpuModel::fp32_options(1, 4));
    a.init_random(1);
    a.save_checkpoint(dir.str());
    // Rewrite the optimizer file without one tensor.
    {
        SafeTensorsReader full({dir / "optimizer.safetensors"});
        std::vector<std::vector<float>> keep;
        SafeTensorsWriter w;
        for (const auto& s : a.params())
            for (const char* suffix : {".exp_avg", ".exp_avg_sq"}) {
                const std::string name = s.name + suffix;
                if (name == "model.norm.weight.exp_avg_sq") continue;
                keep.emplace_back(s.numel());
                full.read_f32(name, s.shape, keep.back().data());
            }
        size_t k = 0;
        for (const auto& s : a.params())
            for (const char* suffix : {".exp_avg", ".exp_avg_sq"}) {
                const std::string name = s.name + suffix;
                if (name == "model.norm.weight.exp_avg_sq") continue;
                w.add_f32(name, s.shape, keep[k++].data());
            }
        w.write(dir / "optimizer.safetensors");
    }
    CpuModel b(cfg, CpuModel::fp32_options(1, 4));
    b.init_random(2);
    const auto before = all_params(b);
    try {
        b.load_checkpoint(dir.str());
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_TRUE(test::Contains(e.what(), "model.norm.weight.exp_avg_sq"));
    }
    EXPECT_TRUE(bit_identical(before, all_params(b))) << "a failed load must leave the model as it was";
    EXPECT_THROW(b.load_checkpoint(dir / "does-not-exist"), Error);
}

// Long per-tensor work reports its progress in parameters: monotonic, ending at the model's size
// (tied and untied), and a model without a callback runs as before.
TEST(CpuModelProgress, InitialisationReportsEveryParameterOnce) {
    for (bool tied : {false, true}) {
        SCOPED_TRACE(tied ? "tied" : "untied");
        const ModelConfig cfg = test::tiny_config(tied);
        CpuModel model(cfg, CpuModel::fp32_options(1, 4));
        std::vector<int64_t> seen;
        model.set_progress([&](const char* what, int64_t done, int64_t total) {
            EXPECT_STREQ(what, "initialising");
            EXPECT_EQ(total, cfg.num_parameters());
            seen.push_back(done);
        });
        model.init_random(3);
        ASSERT_FALSE(seen.empty());
        EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
        EXPECT_GT(seen.front(), 0);
        EXPECT_EQ(seen.back(), cfg.num_parameters());
        model.set_progress({});
        model.init_random(3);  // no callback: nothing to call
    }
}

TEST(CpuModelHf, SaveThenLoadGivesIdenticalWeights) {
    for (bool tied : {true, false}) {
        test::TempDir dir;
        const ModelConfig cfg = test::tiny_config(tied);
        CpuModel a(cfg, CpuModel::fp32_options(1, 4));
        a.init_random(3);
        std::vector<float> losses;
        train_steps(a, 1, 1, &losses);  // norms and biases away from their init values
        a.save_hf(dir.str());

        SafeTensorsReader r = SafeTensorsReader::open_dir(dir.str());
        EXPECT_EQ(r.has("lm_head.weight"), !tied) << "tied embeddings are written once";
        EXPECT_EQ(r.names().size(), a.params().size());
        EXPECT_EQ(r.info("model.embed_tokens.weight").dtype, DType::F32);
        const ModelConfig back = load_model_config(dir / "config.json");
        EXPECT_EQ(back.torch_dtype, "float32");
        EXPECT_EQ(back.tie_word_embeddings, tied);
        EXPECT_EQ(back.num_parameters(), cfg.num_parameters());

        CpuModel b(back, CpuModel::fp32_options(1, 4));
        b.load_hf(dir.str());
        EXPECT_TRUE(bit_identical(all_params(a), all_params(b))) << "tied=" << tied;
    }
}

TEST(CpuModelHf, LmHeadRules) {
    test::TempDir dir;
    // An untied model saved without lm_head.weight: loading it as untied names the missing tensor;
    // loading it as tied works, and a tied model ignores an lm_head.weight in the file.
    const ModelConfig tied = test::tiny_config(true), untied = test::tiny_config(false);
    CpuModel t(tied, CpuModel::fp32_options(1, 4));
    t.init_random(4);
    t.save_hf(dir / "tied");
    CpuModel u(untied, CpuModel::fp32_options(1, 4));
    try {
        u.load_hf(dir / "tied");
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_TRUE(test::Contains(e.what(), "lm_head.weight"));
    }
    u.init_random(5);
    u.save_hf(dir / "untied");
    CpuModel t2(tied, CpuModel::fp32_options(1, 4));
    t2.load_hf(dir / "untied");
    const auto& spec = t2.params().front();
    EXPECT_EQ(0, std::memcmp(t2.param(spec.name), u.param(spec.name), sizeof(float) * spec.numel()));
}

// ---------------------------------------------------------------------------------------------------
// Options and the memory plan
// ---------------------------------------------------------------------------------------------------

void expect_refused(const ModelOptions& o, const std::string& flag) {
    try {
        CpuModel m(test::tiny_config(true), o);
        ADD_FAILURE() << "expected " << flag << " to be refused";
    } catch (const Error& e) {
        EXPECT_TRUE(test::Contains(e.what(), flag));
        EXPECT_TRUE(test::Contains(e.what(), "--device=cpu"));
    }
    EXPECT_THROW(CpuModel::plan(test::tiny_config(true), o), Error);
}

TEST(CpuModelOptions, UnsupportedOptionsNameTheFlag) {
    const ModelOptions ok = CpuModel::fp32_options(2, 8);
    EXPECT_NO_THROW(CpuModel(test::tiny_config(true), ok));
    expect_refused(ModelOptions{}, "--model-dtype=bf16");  // the defaults are for the GPU
    auto with = [&](auto edit) {
        ModelOptions o = ok;
        edit(o);
        return o;
    };
    expect_refused(with([](ModelOptions& o) { o.matmul_dtype = DType::BF16; }), "--matmul-dtype=bf16");
    // FP8 is emulated; fp8 gradients only with fp8 matmuls
    EXPECT_NO_THROW(CpuModel(test::tiny_config(true), with([](ModelOptions& o) { o.matmul_dtype = DType::E4M3; })));
    expect_refused(with([](ModelOptions& o) { o.gradient_dtype = DType::E5M2; }), "--gradient-dtype=e5m2");
    expect_refused(with([](ModelOptions& o) { o.opt_m_dtype = DType::BF16; }), "--opt-m-dtype=bf16");
    expect_refused(with([](ModelOptions& o) { o.opt_v_dtype = DType::BF16; }), "--opt-v-dtype=bf16");
    expect_refused(with([](ModelOptions& o) { o.master_dtype = DType::BF16; }), "--master-dtype=bf16");
    expect_refused(with([](ModelOptions& o) { o.recompute_block = true; }), "--recompute-block");
    expect_refused(with([](ModelOptions& o) { o.recompute_swiglu = true; }), "--recompute-swiglu");
    expect_refused(with([](ModelOptions& o) { o.offload_master = true; }), "--offload-master");
    expect_refused(with([](ModelOptions& o) { o.offload_opt_v = true; }), "--offload-opt-v");
    expect_refused(with([](ModelOptions& o) { o.shard_weights = true; }), "--shard-weights");
    expect_refused(with([](ModelOptions& o) { o.shard_gradients = true; }), "--shard-gradients");
    // with several ranks they are ZeRO-3 (a --zero-level on one rank is refused by the engine, under its
    // own name: TrainCliTrust.GpuFlagsOnTheCpuAreRefusedUnderTheirOwnName)
    EXPECT_NO_THROW(CpuModel(test::tiny_config(true), with([](ModelOptions& o) {
                                 o.gpus = 2, o.shard_weights = o.shard_gradients = true;
                             })));
    expect_refused(with([](ModelOptions& o) { o.persistent_quants = true; }), "--persistent-quants");
    expect_refused(with([](ModelOptions& o) { o.use_cuda_graphs = true; }), "--use-cuda-graphs");
    expect_refused(with([](ModelOptions& o) { o.gpus = 0; }), "--gpus=0");  // --gpus > 1: threads mode (the engine's ranks)
    // lmhead_chunks is the CPU model's own chunking: accepted.
    EXPECT_NO_THROW(CpuModel(test::tiny_config(true), with([](ModelOptions& o) { o.lmhead_chunks = 4; })));
}

TEST(CpuModelOptions, MemoryPlanAndBadBatches) {
    const ModelConfig cfg = test::tiny_config(false);
    CpuModel m(cfg, CpuModel::fp32_options(2, 8));
    const MemoryPlan plan = m.memory_plan();
    EXPECT_EQ(plan.device, "cpu");
    ASSERT_EQ(plan.entries.size(), 5u);
    const uint64_t bytes = static_cast<uint64_t>(cfg.num_parameters()) * 4;
    EXPECT_EQ(static_cast<int64_t>(bytes), m.num_elements() * 4);
    const char* names[] = {"Weights", "Gradients", "Adam M", "Adam V"};
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(plan.entries[i].category, names[i]);
        EXPECT_EQ(plan.entries[i].device_bytes, bytes);
    }
    EXPECT_EQ(plan.entries[4].category, "Activations");
    EXPECT_GT(plan.entries[4].device_bytes, 0u);

    m.init_random(1);
    test::TokenBatch tb = test::random_batch(2, 8, cfg.vocab_size, 1);
    tb.inputs[5] = cfg.vocab_size;
    EXPECT_THROW(m.forward_backward(tb.view(), 1.0f), Error);
    tb.inputs[5] = 0;
    tb.targets[3] = cfg.vocab_size + 4;
    EXPECT_THROW(m.evaluate(tb.view()), Error);
}

// ---------------------------------------------------------------------------------------------------
// FP8 emulation (--matmul-dtype=e4m3, --gradient-dtype=e4m3|e5m2): the reference the GPU's FP8 path
// is compared with (tests/gpu/cuda_model_test.cpp). Here: it is active, close to fp32 and learns.
// ---------------------------------------------------------------------------------------------------

double cosine_of(const std::vector<float>& a, const std::vector<float>& b) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < a.size(); ++i) ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
    return ab / std::sqrt(aa * bb + 1e-300);
}

TEST(CpuModelFp8, EmulationIsActiveCloseToFp32AndDeterministic) {
    ModelConfig cfg = test::tiny_config(false);
    cfg.initializer_range = 0.2;  // gradients well above rounding noise in every tensor
    const test::TokenBatch tb = cyclic_batch(2, 16, cfg.vocab_size);
    auto grads = [&](DType matmul, DType grad) {
        ModelOptions o = CpuModel::fp32_options(2, 16);
        o.matmul_dtype = matmul;
        o.gradient_dtype = grad;
        CpuModel m(cfg, o);
        m.init_random(5);
        m.forward_backward(tb.view(), 1.0f);
        std::vector<float> g;
        for (const auto& s : m.params()) {
            const float* p = m.grad(s.name);
            g.insert(g.end(), p, p + s.numel());
        }
        g.push_back(static_cast<float>(m.step_loss()));
        return g;
    };
    const auto ref = grads(DType::F32, DType::F32);
    for (DType gd : {DType::BF16, DType::E4M3, DType::E5M2}) {
        SCOPED_TRACE(std::string(dtype_name(gd)));
        const auto g = grads(DType::E4M3, gd);
        EXPECT_FALSE(bit_identical(g, ref)) << "the emulation changed nothing";
        EXPECT_TRUE(bit_identical(g, grads(DType::E4M3, gd))) << "not deterministic";
        EXPECT_NEAR(g.back(), ref.back(), 0.02 * ref.back()) << "loss";
        EXPECT_GT(cosine_of(g, ref), 0.95) << "all gradients together";
    }
}

TEST(CpuModelFp8, LearnsTheRepetitiveSequence) {
    const ModelConfig cfg = test::tiny_config(true);
    ModelOptions opt = CpuModel::fp32_options(4, 16);
    opt.matmul_dtype = DType::E4M3;
    opt.gradient_dtype = DType::E5M2;
    CpuModel model(cfg, opt);
    model.init_random(11);
    const test::TokenBatch tb = cyclic_batch(4, 16, cfg.vocab_size);
    const float initial = model.evaluate(tb.view());
    OptimizerParams o;
    o.learning_rate = 1e-2f;
    o.weight_decay = 0.01f;
    o.grad_clip = 1.0f;
    for (int step = 1; step <= 60; ++step) {
        model.forward_backward(tb.view(), 1.0f);
        o.step = step;
        const StepStats s = model.optimizer_step(o);
        ASSERT_TRUE(std::isfinite(s.loss) && std::isfinite(s.grad_norm)) << "step " << step;
    }
    EXPECT_LT(model.evaluate(tb.view()), 0.1f * initial);
}

}  // namespace
}  // namespace qtrain
