// ZeRO-3 of the frozen base under LoRA on the GPU model (issue 33; --gpus=N --zero-level=3 --lora-rank):
// W ranks as threads on one GPU (cuda_lora_ranks_util.h), each keeping only its block of the base — the
// bf16 weights, or the FP8 base's e4m3 codes — and gathering every layer into the two slots as it is
// used (weights.h). The gathered bytes are the unsharded base's (the FP8 base's scales are the whole
// matrices', taken by the load on every rank), and ZeRO-3 is ZeRO-2 of the adapters, so every loss,
// norm, adapter and moment bit is ZeRO-1's and ZeRO-2's, with dropout, recompute and --train-also (on the
// bf16 base each rank writes its block's part of the trained tensors). A checkpoint written at ZeRO-3 resumes bit for bit at ZeRO-1 and the reverse (the files hold
// the adapters only), and the PEFT export (and the bf16 base's merged export, a collective gather)
// is ZeRO-1's, byte for byte. (The plan: tests/train/lora_zero3_plan_test.cpp.)
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "cuda_lora_ranks_util.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::lora_ranks;
namespace fs = std::filesystem;

namespace {

// A mode as ZeRO-3 runs it: CUDA graphs refused (the gathers are collectives a graph does not
// capture), so recompute without them; adapters of rank 12, alpha 20 (neither a default).
Mode zero3_mode(const Mode& m) {
    Mode z = m;
    if (z.graphs) z.graphs = false, z.recompute = true;
    z.rank = 12;
    z.alpha = 20.0f;
    return z;
}

// ZeRO-3 needs --model-dtype=bf16. --train-also runs on both bases: the bf16 base's trained tensors are
// written into the owners' blocks (each rank its part) and read back whole from them; the FP8 base keeps
// them whole on every rank.
bool runs_at_zero3(const Mode& m, bool fp8) {
    (void)fp8;
    return m.act == DType::BF16;
}

std::unique_ptr<comm::Communicator> copy_engine(int r, comm::ThreadWorld& tw) {
    return comm::make_copy_engine_communicator(tw, r, 0);
}

std::string read_bytes(const fs::path& p) { return read_file(p.string()); }  // (test_util.h)

}  // namespace

class CudaLoraZeroThree : public ::testing::TestWithParam<int> {};

// Against ZeRO-1 and ZeRO-2 of the same ranks, bit for bit; against a run with another accumulation,
// which must differ (so the comparison can fail).
TEST_P(CudaLoraZeroThree, GivesZeroOneAndTwosBits) {
    QTRAIN_REQUIRE_GPU();
    const Mode mode = zero3_mode(kModes[GetParam()]);
    if (mode.act != DType::BF16) GTEST_SKIP() << "ZeRO-3 needs --model-dtype=bf16 (" << mode.name << ")";
    for (int world : {2, 3})
        for (bool fp8 : {false, true}) {
            if (!runs_at_zero3(mode, fp8)) continue;
            SCOPED_TRACE(std::string(mode.name) + " world " + std::to_string(world) + (fp8 ? " FP8 base" : " bf16 base"));
            const LoraRun three = run(mode, world, 2, 3, fp8);
            ASSERT_EQ(three.losses.size(), static_cast<std::size_t>(kSteps));
            for (const int level : {1, 2}) {
                const LoraRun other = run(mode, world, 2, level, fp8);
                EXPECT_TRUE(same_bits(other.losses, three.losses)) << "ZeRO-" << level;
                EXPECT_TRUE(same_bits(other.norms, three.norms)) << "ZeRO-" << level;
                for (int r = 0; r < world; ++r) {
                    EXPECT_TRUE(same_bits(other.adapters[r], three.adapters[r])) << "ZeRO-" << level << " rank " << r;
                    EXPECT_TRUE(same_bits(other.moments[r], three.moments[r])) << "ZeRO-" << level << " rank " << r;
                }
            }
            for (int r = 1; r < world; ++r)
                EXPECT_TRUE(same_bits(three.adapters[r], three.adapters[0])) << "rank " << r << " holds other adapters";
            EXPECT_FALSE(same_bits(three.adapters[0], run(mode, world, 1, 3, fp8).adapters[0]))
                << "another accumulation gave the same bits: the comparison cannot fail";
        }
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaLoraZeroThree, ::testing::Range(0, static_cast<int>(std::size(kModes))),
                         [](const ::testing::TestParamInfo<int>& i) { return "mode" + std::to_string(i.param); });

// What the layers are gathered from equals the unsharded base: every layer matrix's e4m3 codes and
// scales of the FP8 base (gathered from the ranks' blocks of codes), and every bf16 weight of the bf16
// base (gathered from the ranks' blocks), on every rank of 2 and 3, against one GPU's resident base
// from the same seed.
TEST(CudaLoraZeroThreeGpu, GatheredBaseIsTheUnshardedBase) {
    QTRAIN_REQUIRE_GPU();
    for (const FamilyCase& family : kLoraFamilies) {
        const ModelConfig cfg = family.make();
        const Mode mode = zero3_mode(kModes[3]);
        // the FP8 base
        std::vector<std::vector<uint8_t>> codes;
        std::vector<std::pair<float, float>> scales;
        {
            CudaModel one(cfg, rank_options(mode, 1, 1, true));
            one.init_random(42);
            for (int l = 0; l < cfg.num_hidden_layers; ++l)
                for (int mi = 0; mi < 4; ++mi) {
                    codes.push_back(one.download_fp8_matrix(l, static_cast<Matrix>(mi), false));
                    scales.push_back(one.fp8_matrix_scale(l, static_cast<Matrix>(mi)));
                }
        }
        // the bf16 base
        std::vector<float> weights;
        {
            CudaModel one(cfg, rank_options(mode, 1, 1, false));
            one.init_random(42);
            weights = all_weights(one);
        }
        for (int world : {2, 3}) {
            SCOPED_TRACE(std::string(family.name) + " world " + std::to_string(world));
            std::vector<std::vector<std::vector<uint8_t>>> got_codes(world);
            std::vector<std::vector<std::pair<float, float>>> got_scales(world);
            std::vector<std::vector<float>> got_weights(world);
            std::vector<int> sharded(world, 0);
            run_rank_threads(world, copy_engine, [&](int r, comm::Communicator& c) {
                {
                    CudaModel m(cfg, rank_options(mode, world, 3, true));
                    m.set_communicator(&c, 3);
                    m.init_random(42);
                    sharded[r] = m.weights_sharded();
                    for (int l = 0; l < cfg.num_hidden_layers; ++l)
                        for (int mi = 0; mi < 4; ++mi) {  // (collective: every rank asks for the same matrix)
                            got_codes[r].push_back(m.download_fp8_matrix(l, static_cast<Matrix>(mi), false));
                            got_scales[r].push_back(m.fp8_matrix_scale(l, static_cast<Matrix>(mi)));
                        }
                }
                CudaModel m(cfg, rank_options(mode, world, 3, false));
                m.set_communicator(&c, 3);
                m.init_random(42);
                got_weights[r] = all_weights(m);  // (collective)
            });
            for (int r = 0; r < world; ++r) {
                EXPECT_TRUE(sharded[r]) << "rank " << r;
                ASSERT_EQ(got_codes[r].size(), codes.size());
                for (std::size_t k = 0; k < codes.size(); ++k) {
                    EXPECT_EQ(got_codes[r][k], codes[k]) << "rank " << r << " layer " << k / 4 << " matrix " << k % 4;
                    EXPECT_EQ(got_scales[r][k], scales[k]) << "rank " << r << " layer " << k / 4 << " matrix " << k % 4;
                }
                EXPECT_TRUE(same_bits(got_weights[r], weights)) << "rank " << r;
            }
        }
    }
}

// A checkpoint written by 2 ranks at one level and resumed by 2 ranks at another (ZeRO-3 -> 1,
// 1 -> 3, 3 -> 3) continues bit for bit: the files hold the whole adapter state, and the base comes
// from its seed (--model) and is sharded again at load. bf16 base and FP8 base, dropout on.
TEST(CudaLoraZeroThreeGpu, CheckpointsResumeBitExactAcrossLevels) {
    QTRAIN_REQUIRE_GPU();
    // qwen3 bf16, dropout 0.2; and the untied qwen2 with --train-also=norms,embeddings (the load writes the
    // trained tensors into the owners' blocks again: upload_from_host -> write_base -> changed)
    for (const Mode& base_mode : {kModes[3], kModes[std::size(kModes) - 1]}) {
        for (bool fp8 : {false, true}) {
            for (const auto [save_level, load_level] : {std::pair{3, 1}, {1, 3}, {3, 3}}) {
                const Mode mode = zero3_mode(base_mode);
                const ModelConfig cfg = mode.config();
                SCOPED_TRACE(std::string(mode.name) + (fp8 ? ", FP8 base" : ", bf16 base") + ", saved at ZeRO-" +
                             std::to_string(save_level) + ", resumed at ZeRO-" + std::to_string(load_level));
                TempDir tmp;
                const std::string dir = (tmp.path / "ckpt").string();
                fs::create_directories(dir);
                const auto [whole, resumed, passes] =
                    checkpoint_and_resume(cfg, rank_options(mode, 2, save_level, fp8), save_level,
                                          rank_options(mode, 2, load_level, fp8), load_level, dir);
                ASSERT_EQ(whole.losses.size(), static_cast<std::size_t>(kSteps - 2));
                EXPECT_TRUE(same_bits(whole.losses, resumed.losses));
                EXPECT_TRUE(same_bits(whole.norms, resumed.norms));
                for (int r = 0; r < 2; ++r) {
                    EXPECT_TRUE(same_bits(whole.adapters[r], resumed.adapters[r])) << "rank " << r;
                    EXPECT_TRUE(same_bits(whole.moments[r], resumed.moments[r])) << "rank " << r;
                    EXPECT_EQ(passes[r], 8u) << "the global pass count: 2 steps of 2 ranks x 2 micro-batches";
                }
            }
        }
    }
}

// The PEFT export of 2 ranks at ZeRO-3 (collective: every rank's block of the adapters gathered, rank 0
// writes) is ZeRO-1's byte for byte; so is the merged export (--merge-lora), which under ZeRO-3 of the
// bf16 base gathers every base tensor from its owners on every rank (CudaModel::write_weights).
TEST(CudaLoraZeroThreeGpu, ExportsEqualZeroOnesBytes) {
    QTRAIN_REQUIRE_GPU();
    // (the untied qwen2 mode trains norms and embeddings: the merged export reads them from the owners' blocks)
    for (const Mode& base_mode : {kModes[3], kModes[std::size(kModes) - 1]}) {
        for (bool fp8 : {false, true}) {
            for (bool merge : {false, true}) {
                const Mode mode = zero3_mode(base_mode);
                const ModelConfig cfg = mode.config();
                SCOPED_TRACE(std::string(mode.name) + (fp8 ? ", FP8 base" : ", bf16 base") +
                             (merge ? ", merged" : ", adapter"));
                TempDir tmp;
                auto out = [&](int level) { return tmp.path / ("zero" + std::to_string(level)); };
                for (const int level : {1, 3})
                    run_rank_threads(2, copy_engine, [&](int r, comm::Communicator& c) {
                        ModelOptions o = rank_options(mode, 2, level, fp8);
                        o.lora.merge = merge;
                        CudaModel m(cfg, o);
                        m.set_communicator(&c, level);
                        start(m);
                        train(m, 1, 3, r, 2, 2, nullptr);
                        EXPECT_TRUE(m.saves_collectively());  // (not ASSERT: every rank must reach the export)
                        m.save_hf(out(level).string());       // (every rank: collective)
                    });
                const std::vector<std::string> files =
                    merge ? std::vector<std::string>{"model.safetensors", "config.json"}
                          : std::vector<std::string>{"adapter_model.safetensors", "adapter_config.json"};
                for (const std::string& f : files) {
                    ASSERT_TRUE(fs::exists(out(3) / f)) << f;
                    EXPECT_EQ(read_bytes(out(3) / f), read_bytes(out(1) / f)) << f;
                }
            }
        }
    }
}

// What ZeRO-3 under LoRA accepts and what it refuses, on the model (the flags' texts: the plan tests).
TEST(CudaLoraZeroThreeGpu, AcceptsBothBasesAndRefusesCudaGraphsByName) {
    QTRAIN_REQUIRE_GPU();
    const Mode mode = zero3_mode(kModes[3]);
    for (bool fp8 : {false, true}) EXPECT_NO_THROW((void)CudaModel(mode.config(), rank_options(mode, 2, 3, fp8)));
    ModelOptions graphs = rank_options(mode, 2, 3, false);
    graphs.use_cuda_graphs = true;
    EXPECT_ERROR((void)CudaModel(mode.config(), graphs), "--use-cuda-graphs", "--shard-weights");
    // set_communicator: ZeRO-3 and --shard-weights go together
    run_rank_threads(2, copy_engine, [&](int, comm::Communicator& c) {
        CudaModel m(mode.config(), rank_options(mode, 2, 2, false));
        EXPECT_ERROR(m.set_communicator(&c, 3), "--shard-weights", "--zero-level=3");
    });
}
