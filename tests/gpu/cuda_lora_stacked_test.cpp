// LoRA's stacked adapters (lora_layout.h, LoraAdapters::forward_matrix / backward_matrix): the targets
// that read one input (q|k|v, gate|up) keep their A's adjacent, so one GEMM makes u for all of them
// and one each makes dA and dx. The layout's promises are checked without a GPU; the stacked GEMMs
// against the same adapters run one target at a time (fp32: the same dot products, summed in another
// order at most).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "cuda_lora_fixture.h"
#include "gpu_test_util.h"
#include "model/cuda/lora_adapters.h"
#include "model/cuda/lora_layout.h"
#include "model/model_config.h"

namespace qtrain::test {
namespace {

using T = LoraTarget;

// Every tensor at its own 64-aligned place, none overlapping, all inside `total`; a layer's A's
// before its B's, in target order.
void expect_disjoint_and_aligned(const LoraLayout& ly) {
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (std::size_t i = 0; i < ly.specs.size(); ++i) {
        EXPECT_EQ(ly.offsets[i] % 64, 0) << ly.specs[i].name;
        spans.push_back({ly.offsets[i], ly.offsets[i] + ly.specs[i].numel()});
    }
    std::sort(spans.begin(), spans.end());
    for (std::size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first);
    ASSERT_FALSE(spans.empty());
    EXPECT_LE(spans.back().second, ly.total);
    EXPECT_EQ(ly.total % 64, 0);
}

TEST(LoraStackedLayout, Qwen25_7BStacksQkvAndGateUpOfEveryLayer) {
    const ModelConfig cfg = preset_config("Qwen2.5-7B");
    LoraOptions lora = lora_options(0.0f, "all");
    lora.rank = 16;
    const LoraLayout ly = make_lora_layout(cfg, lora);
    expect_disjoint_and_aligned(ly);
    EXPECT_EQ(ly.widest_stack, 3);
    const T qkv[] = {T::Q, T::K, T::V}, gate_up[] = {T::Gate, T::Up}, qk[] = {T::Q, T::K}, o_gate[] = {T::O, T::Gate};
    for (int l = 0; l < cfg.num_hidden_layers; ++l) {
        EXPECT_TRUE(ly.stacked(l, qkv, 3)) << l;
        EXPECT_TRUE(ly.stacked(l, gate_up, 2)) << l;
        EXPECT_TRUE(ly.stacked(l, qk, 2)) << l;
        EXPECT_FALSE(ly.stacked(l, qkv, 1)) << l;      // (one target: nothing to stack)
        EXPECT_FALSE(ly.stacked(l, o_gate, 2)) << l;  // adjacent, but o and gate read other inputs
        // the adjacency itself: k's A starts where q's ends (r x hidden, no padding at 3584)
        EXPECT_EQ(ly.a_offset[ly.index(l, T::K)], ly.a_offset[ly.index(l, T::Q)] + 16 * 3584);
        EXPECT_EQ(ly.a_offset[ly.index(l, T::Up)], ly.a_offset[ly.index(l, T::Gate)] + 16 * 3584);
        EXPECT_EQ(ly.saved_slot[ly.index(l, T::V)], ly.saved_slot[ly.index(l, T::Q)] + 2);
        EXPECT_LT(ly.a_offset[ly.index(l, T::Down)], ly.b_offset[ly.index(l, T::Q)]);  // A's, then B's
    }
    // the same space as PEFT's order would take: only the order moved
    int64_t padded = 0;
    for (const ParamSpec& s : ly.specs) padded += (s.numel() + 63) / 64 * 64;
    EXPECT_EQ(ly.total, padded);
}

TEST(LoraStackedLayout, DropoutSubsetsAndPaddingDecideWhatStacks) {
    const ModelConfig cfg = preset_config("Qwen2.5-0.5B");
    const T qkv[] = {T::Q, T::K, T::V}, qv[] = {T::Q, T::V};
    {  // dropout: every target draws its own mask of x, so nothing reads one x
        const LoraLayout ly = make_lora_layout(cfg, lora_options(0.1f, "all"));
        EXPECT_EQ(ly.widest_stack, 1);
        EXPECT_FALSE(ly.stacked(0, qkv, 3));
    }
    {  // q and v without k: their A's are adjacent, v's u the second column block
        const LoraLayout ly = make_lora_layout(cfg, lora_options(0.0f, "q,v,down"));
        expect_disjoint_and_aligned(ly);
        EXPECT_EQ(ly.widest_stack, 2);
        EXPECT_TRUE(ly.stacked(0, qv, 2));
    }
    {  // r x in not a multiple of 64: A's are padded apart, so each target runs alone
        ModelConfig odd = cfg;
        odd.hidden_size = 100;
        LoraOptions lora = lora_options(0.0f, "all");
        lora.rank = 3;
        const LoraLayout ly = make_lora_layout(odd, lora);
        expect_disjoint_and_aligned(ly);
        EXPECT_EQ(ly.widest_stack, 1);
        EXPECT_FALSE(ly.stacked(0, qkv, 3));
    }
}

// The stacked GEMMs against one target at a time on the same adapters (fp32): q|k|v of layer 0 and
// gate|up of layer 1, forward output, input gradient and every adapter gradient.
TEST(CudaLoraStacked, StackedGemmsEqualOneTargetAtATime) {
    QTRAIN_REQUIRE_GPU();
    const ModelConfig cfg = qwen2_case();
    const int B = 2, T_ = 24, N = B * T_;
    const LoraOptions lora = lora_options(0.0f, "all");
    CudaModel gpu(cfg, lora_gpu_options(DType::F32, B, T_, lora));
    start_lora_models({&gpu}, 3, 11);
    LoraAdapters& ad = *gpu.lora();
    struct Case {
        int layer;
        std::vector<T> targets;
        std::vector<int64_t> cols;
        int64_t width;
    };
    const Case cases[] = {
        {0, {T::Q, T::K, T::V}, {0, cfg.q_dim(), cfg.q_dim() + cfg.kv_dim()}, cfg.q_dim() + 2 * cfg.kv_dim()},
        {1, {T::Gate, T::Up}, {0, cfg.intermediate_size}, 2 * int64_t{cfg.intermediate_size}},
    };
    Rng rng(99);
    auto normal = [&](std::size_t n) {
        std::vector<float> v(n);
        for (float& x : v) x = rng.normal();
        return v;
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.layer);
        const int n = static_cast<int>(c.targets.size());
        ASSERT_TRUE(ad.layout().stacked(c.layer, c.targets.data(), n));  // (or the test compares a path with itself)
        const int64_t in = cfg.hidden_size;
        const DeviceBuffer x(normal(static_cast<std::size_t>(N) * in), DType::F32);
        const DeviceBuffer dy(normal(static_cast<std::size_t>(N) * c.width), DType::F32);
        struct Run {
            std::vector<float> y, dx;
            std::vector<std::vector<float>> grads;
        };
        // write: the adapters write y and dx (the model's order when they cover the whole matrix, the base
        // GEMM adding onto them after) instead of adding to them: onto NaN bytes, which an add would keep
        auto run = [&](bool stacked, bool write = false) {
            DeviceBuffer y(static_cast<std::size_t>(N) * c.width, DType::F32), dx(static_cast<std::size_t>(N) * in, DType::F32);
            if (write) y.fill_bytes(0xFF), dx.fill_bytes(0xFF);
            ad.zero_grads();
            if (stacked) {
                EXPECT_TRUE(!write || ad.writes_whole(c.layer, c.targets.data(), n));
                ad.forward_matrix(c.layer, c.targets.data(), c.cols.data(), n, y.get(), c.width, x.get(), N, true, write);
                ad.backward_matrix(c.layer, c.targets.data(), c.cols.data(), n, dx.get(), dy.get(), c.width, x.get(), N,
                                   write);
            } else {
                for (int j = 0; j < n; ++j)
                    ad.forward(c.layer, c.targets[j], y.f32() + c.cols[j], c.width, x.get(), N, true);
                for (int j = 0; j < n; ++j)
                    ad.backward(c.layer, c.targets[j], dx.get(), dy.f32() + c.cols[j], c.width, x.get(), N);
            }
            sync_device();
            Run r{y.download(), dx.download(), {}};
            for (T t : c.targets)
                for (const char* part : {"lora_A", "lora_B"})
                    r.grads.push_back(gpu.download(lora_tensor_name(c.layer, t, part), CudaModel::Which::Grad));
            return r;
        };
        const Run one = run(false), all = run(true), written = run(true, true);
        // (beta 0 and 1 may pick other cuBLASLt algorithms: equal up to the order of the sums; a NaN left
        // from the buffer's bytes fails the comparison)
        EXPECT_LT(rel_max_error(written.y, all.y), 1e-5) << "y written onto NaN bytes against y added onto zeros";
        EXPECT_LT(rel_max_error(written.dx, all.dx), 1e-5) << "dx written against dx added onto zeros";
        // (fp32 both ways: the same products, summed in another order at most)
        EXPECT_LT(rel_max_error(all.y, one.y), 1e-5);
        EXPECT_LT(rel_max_error(all.dx, one.dx), 1e-5);
        for (std::size_t k = 0; k < one.grads.size(); ++k) {
            float largest = 0.0f;  // (a gradient of zeros would compare equal whatever the GEMMs did)
            for (float g : one.grads[k]) largest = std::max(largest, std::abs(g));
            EXPECT_GT(largest, 0.0f) << k;
            EXPECT_LT(rel_max_error(all.grads[k], one.grads[k]), 1e-5) << k;
        }
    }
}

}  // namespace
}  // namespace qtrain::test
