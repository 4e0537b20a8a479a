// The GPU model with document masking (--document-masking, Batch::positions): a packed micro-batch
// (several documents per row, of lengths 1 to 30, T = 48 so no tile edge is a row edge) gives the same
// logits, loss and parameter gradients as each of its documents run alone through a plain GPU model
// (B = 1, the document at the start of the row, filler after it that causal attention keeps out of
// the document and whose targets are ignored): fp32 tight, bf16 at the model tests' tolerances. Qwen2
// (bias, RoPE) and Qwen3 (the fused q/k norm + RoPE, head_dim 128). Also against the CPU reference
// model where that model honours positions (it skips, saying so, where it ignores them), CUDA graph
// replay with positions changing between micro-batches, the clear errors for a batch and model that
// disagree about document masking, and (host only) the attention choice and the memory plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attention_doc_util.h"
#include "gpu_model_fixture.h"
#include "model/cuda/attention_choice.h"

using namespace qtrain;
using namespace qtrain::test;

namespace {

// qwen2_case (head_dim 64, GQA 2), qwen3_case and FamilyCase: gpu_model_fixture.h.
const FamilyCase kFamilies[] = {{"qwen2_d64", qwen2_case}, {"qwen3_d128_qk_norm", qwen3_case}};

ModelOptions gpu_options(DType act, int B, int T, bool doc) {
    ModelOptions o = CpuModel::fp32_options(B, T);
    o.model_dtype = o.matmul_dtype = o.gradient_dtype = act;
    o.lmhead_chunks = 2;
    o.attention = AttentionImpl::Flash;
    o.document_masking = doc;
    return o;
}

constexpr int kB = 2, kT = 48;
// Row 0: documents of 1, 20 and 27 tokens; row 1: 30, 1, 17.
const std::vector<std::vector<int>> kDocs = {{1, 20, 27}, {30, 1, 17}};

using test::attention::positions_of;  // (attention_doc_util.h: 0, 1, ... within each document)

struct Packed {
    std::vector<int32_t> in, tgt, pos;
    Batch batch() const {
        Batch b{in.data(), tgt.data(), kB, kT};
        b.positions = pos.data();
        return b;
    }
};
// Random tokens; targets random with every 7th ignored (-1), and each document's last target
// ignored too (as a packer does: a document does not predict the next one's first token).
Packed make_packed(int vocab, uint64_t seed) {
    Rng r(seed);
    Packed p;
    p.pos = positions_of(kDocs);
    for (int i = 0; i < kB * kT; ++i) {
        p.in.push_back(static_cast<int32_t>(r.below(vocab)));
        const bool last_of_doc = i + 1 == kB * kT || p.pos[i + 1] == 0;
        p.tgt.push_back(i % 7 == 5 || last_of_doc ? -1 : static_cast<int32_t>(r.below(vocab)));
    }
    return p;
}

// Every document of the packed batch: row, first token, length.
struct Doc {
    int row, start, len;
};
std::vector<Doc> documents() {
    std::vector<Doc> docs;
    for (int b = 0; b < kB; ++b) {
        int start = 0;
        for (int len : kDocs[b]) {
            docs.push_back({b, start, len});
            start += len;
        }
    }
    return docs;
}

// Document d alone as a one-row plain batch of T tokens: the document first, then filler tokens
// (later in the row, so causal attention keeps them out of the document) with ignored targets.
struct Single {
    std::vector<int32_t> in, tgt;
    Batch batch() const { return Batch{in.data(), tgt.data(), 1, kT}; }
};
Single single_of(const Packed& p, const Doc& d, int vocab) {
    Single s;
    const int n0 = d.row * kT + d.start;
    for (int t = 0; t < kT; ++t) {
        s.in.push_back(t < d.len ? p.in[n0 + t] : static_cast<int32_t>((t * 31 + 7) % vocab));
        s.tgt.push_back(t < d.len ? p.tgt[n0 + t] : -1);
    }
    return s;
}

int valid_targets(const std::vector<int32_t>& tgt, int begin, int end) {
    int n = 0;
    for (int i = begin; i < end; ++i) n += tgt[i] >= 0;
    return n;
}

// The same weights in every model: random init, norms and biases away from one and zero.
std::vector<std::pair<std::string, std::vector<float>>> random_weights(CudaModel& m, uint64_t seed) {
    m.init_random(seed);
    Rng rng(seed + 1);
    std::vector<std::pair<std::string, std::vector<float>>> w;
    for (const ParamSpec& p : m.layout().specs) {
        std::vector<float> v = m.download(p.name, CudaModel::Which::Master);
        draw_away_from_init(p.kind, v.data(), static_cast<int64_t>(v.size()), rng);
        w.emplace_back(p.name, std::move(v));
    }
    return w;
}
template <class Model>
void set_weights(Model& m, const std::vector<std::pair<std::string, std::vector<float>>>& w) {
    for (const auto& [name, v] : w) m.upload_master(name, v.data());
}

class CudaModelDocMasking : public ::testing::TestWithParam<std::tuple<int, DType>> {};

// Logits, eval loss and gradients of a packed micro-batch against each document run alone.
TEST_P(CudaModelDocMasking, PackedBatchEqualsEachDocumentAlone) {
    QTRAIN_REQUIRE_GPU();
    const auto [which, act] = GetParam();
    const ModelConfig cfg = kFamilies[which].make();
    const int V = cfg.vocab_size;
    CudaModel packed(cfg, gpu_options(act, kB, kT, true));
    CudaModel alone(cfg, gpu_options(act, 1, kT, false));
    const auto weights = random_weights(packed, 11);
    set_weights(packed, weights);
    set_weights(alone, weights);
    const Packed p = make_packed(V, 21);
    const bool f32 = act == DType::F32;

    // logits: the packed rows of each document against the single run's first rows
    const std::vector<float> lp = packed.logits(p.batch());
    for (const Doc& d : documents()) {
        SCOPED_TRACE(cat("row ", d.row, ", document at ", d.start, " of length ", d.len));
        const std::vector<float> ls = alone.logits(single_of(p, d, V).batch());
        const std::size_t n0 = static_cast<std::size_t>(d.row) * kT + d.start;
        const std::vector<float> got(lp.begin() + n0 * V, lp.begin() + (n0 + d.len) * V);
        const std::vector<float> want(ls.begin(), ls.begin() + static_cast<std::size_t>(d.len) * V);
        EXPECT_TRUE(AllClose("logits", got, want, f32 ? 1e-5 : 5e-2, f32 ? 1e-6 : 1e-3, f32 ? 0.0 : 0.999,
                             [&](std::size_t i) {
                                 return cat("document token ", i / V, " (packed token ", n0 + i / V, ") vocab ", i % V);
                             }));
    }

    // eval loss: the packed mean over all valid targets = the documents' sums over the same count
    const int total = valid_targets(p.tgt, 0, kB * kT);
    ASSERT_GT(total, 0);
    double sum = 0;
    for (const Doc& d : documents()) {
        const int n0 = d.row * kT + d.start, n = valid_targets(p.tgt, n0, n0 + d.len);
        if (n > 0) sum += static_cast<double>(alone.evaluate(single_of(p, d, V).batch())) * n;
    }
    const double want_loss = sum / total;
    const float got_loss = packed.evaluate(p.batch());
    EXPECT_NEAR(got_loss, want_loss, (f32 ? 1e-5 : 2e-2) * want_loss) << "eval loss";

    // gradients: the packed step's (mean over `total`) = the documents' accumulated with grad_scale
    // n_d / total (each then also divides by its own n_d)
    packed.forward_backward(p.batch(), 1.0f);
    for (const Doc& d : documents()) {
        const int n0 = d.row * kT + d.start, n = valid_targets(p.tgt, n0, n0 + d.len);
        if (n > 0) alone.forward_backward(single_of(p, d, V).batch(), static_cast<float>(n) / total);
    }
    double worst_rel = 0, worst_cos = 1;
    std::string worst_name;
    for (const ParamSpec& s : packed.layout().specs) {
        const auto g = packed.download(s.name, CudaModel::Which::Grad);
        const auto ref = alone.download(s.name, CudaModel::Which::Grad);
        const double rel = rel_max_error(g, ref), cos = cosine(g, ref);
        if (f32)
            EXPECT_LT(rel, 1e-4) << s.name;
        else
            EXPECT_GT(cos, 0.99) << s.name;
        if (cos < worst_cos) worst_cos = cos, worst_name = s.name;
        worst_rel = std::max(worst_rel, rel);
    }
    std::printf("[%s %s packed vs alone] worst grad cosine %.6f (%s), worst rel max error %.3g\n",
                kFamilies[which].name, std::string(dtype_name(act)).c_str(), worst_cos, worst_name.c_str(), worst_rel);
}

// Whether a CPU model uses Batch::positions: one that ignores them gives the packed batch the same loss
// as the plain one (the CPU model of a branch without its document masking); one that uses them
// gives another, or refuses the plain batch.
bool cpu_honours_positions(CpuModel& cpu, const Packed& p) {
    Batch plain = p.batch();
    plain.positions = nullptr;
    const float with = cpu.evaluate(p.batch());
    try {
        return cpu.evaluate(plain) != with;
    } catch (const std::exception&) {
        return true;  // it insists on positions: it reads them
    }
}

// The GPU model against the CPU reference on the packed batch (the tolerances of CudaModelVsCpu).
TEST_P(CudaModelDocMasking, PackedBatchMatchesTheCpuModel) {
    QTRAIN_REQUIRE_GPU();
    const auto [which, act] = GetParam();
    const ModelConfig cfg = kFamilies[which].make();
    ModelOptions co = CpuModel::fp32_options(kB, kT);
    co.document_masking = true;
    CpuModel cpu(cfg, co);
    CudaModel gpu(cfg, gpu_options(act, kB, kT, true));
    const auto weights = random_weights(gpu, 31);
    set_weights(gpu, weights);
    for (const auto& s : cpu.params()) {  // the CPU computes with the weights the GPU computes with
        const auto w = gpu.download(s.name, act == DType::F32 ? CudaModel::Which::Master : CudaModel::Which::Weights);
        ASSERT_EQ(static_cast<int64_t>(w.size()), s.numel()) << s.name;
        std::copy(w.begin(), w.end(), cpu.param(s.name));
    }
    const Packed p = make_packed(cfg.vocab_size, 41);
    if (!cpu_honours_positions(cpu, p)) GTEST_SKIP() << "the CPU model on this branch ignores Batch::positions";
    const bool f32 = act == DType::F32;
    const float ce = cpu.evaluate(p.batch()), ge = gpu.evaluate(p.batch());
    EXPECT_NEAR(ge, ce, (f32 ? 1e-5 : 2e-2) * ce) << "eval loss";
    cpu.forward_backward(p.batch(), 1.0f);
    gpu.forward_backward(p.batch(), 1.0f);
    for (const auto& s : cpu.params()) {
        const std::vector<float> ref(cpu.grad(s.name), cpu.grad(s.name) + s.numel());
        const auto g = gpu.download(s.name, CudaModel::Which::Grad);
        if (f32)
            EXPECT_LT(rel_max_error(g, ref), 1e-4) << s.name;
        else
            EXPECT_GT(cosine(g, ref), 0.99) << s.name;
    }
}

INSTANTIATE_TEST_SUITE_P(Families, CudaModelDocMasking,
                         ::testing::Combine(::testing::Values(0, 1), ::testing::Values(DType::F32, DType::BF16)),
                         [](const auto& info) {
                             return std::string(kFamilies[std::get<0>(info.param)].name) + "_" +
                                    std::string(dtype_name(std::get<1>(info.param)));
                         });

// With --use-cuda-graphs the captured step reads the positions buffer that upload_batch refreshes:
// micro-batches with different document layouts, replayed, give the eager model's losses bit for bit;
// and the backward's recompute (--recompute-block: RoPE and attention again, with the positions)
// gives the kept activations' bits.
// The same with cuDNN's variable-length attention (--attention=cudnn): its ragged index is written
// from those positions by a kernel inside the captured step.
void expect_graphs_read_each_micro_batch(AttentionImpl attention) {
    const ModelConfig cfg = qwen3_case();
    auto run = [&](bool graphs, bool recompute) {
        ModelOptions o = gpu_options(DType::BF16, kB, kT, true);
        o.attention = attention;
        o.max_docs_per_row = 3;  // kDocs' rows hold 3
        o.use_cuda_graphs = graphs;
        o.recompute_block = recompute;
        CudaModel m(cfg, o);
        m.init_random(5);
        std::vector<float> out;
        for (int step = 1; step <= 3; ++step) {
            for (int micro = 0; micro < 2; ++micro) {
                Packed p = make_packed(cfg.vocab_size, 100 * step + micro);
                if ((step + micro) % 2 == 1) {  // another layout: row 0 split 10 | 38, row 1 one document
                    p.pos.clear();
                    for (int t = 0; t < kT; ++t) p.pos.push_back(t < 10 ? t : t - 10);
                    for (int t = 0; t < kT; ++t) p.pos.push_back(t);
                }
                m.forward_backward(p.batch(), 0.5f);
            }
            const StepStats s = m.optimizer_step({1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step});
            out.push_back(s.loss);
            out.push_back(s.grad_norm);
        }
        return out;
    };
    const auto eager = run(false, false);
    for (const auto [graphs, recompute] : {std::pair{true, false}, std::pair{false, true}, std::pair{true, true}}) {
        SCOPED_TRACE(cat(graphs ? "graphs" : "eager", recompute ? ", recompute" : ""));
        const auto other = run(graphs, recompute);
        ASSERT_EQ(eager.size(), other.size());
        for (std::size_t i = 0; i < eager.size(); ++i)
            EXPECT_EQ(eager[i], other[i]) << (i % 2 ? "grad norm" : "loss") << " of step " << i / 2 + 1;
    }
}

TEST(CudaModelDocMaskingGraphs, ReplayedAndRecomputedStepsReadEachMicroBatchsPositions) {
    QTRAIN_REQUIRE_GPU();
    expect_graphs_read_each_micro_batch(AttentionImpl::Flash);
}

TEST(CudaModelDocMaskingGraphs, CudnnRaggedReplayedAndRecomputedStepsReadEachMicroBatchsPositions) {
    QTRAIN_REQUIRE_GPU();
    std::string why;
    if (!attention_backend_available(AttentionBackend::Cudnn, &why)) GTEST_SKIP() << why;
    expect_graphs_read_each_micro_batch(AttentionImpl::Cudnn);
}

// cuDNN's variable-length attention in the model gives flash's loss and gradients (bf16, the
// tolerances of PackedBatchMatchesTheCpuModel), and a row with more documents than
// --max-docs-per-row is refused on the host.
TEST(CudaModelDocMaskingCudnn, MatchesFlashAndRefusesTooManyDocuments) {
    QTRAIN_REQUIRE_GPU();
    std::string why;
    if (!attention_backend_available(AttentionBackend::Cudnn, &why)) GTEST_SKIP() << why;
    const ModelConfig cfg = qwen2_case();
    ModelOptions fo = gpu_options(DType::BF16, kB, kT, true), co = fo;
    co.attention = AttentionImpl::Cudnn;
    co.max_docs_per_row = 5;  // 2 spare slots per row
    CudaModel flash(cfg, fo), cudnn(cfg, co);
    ASSERT_EQ(describe_attention_backend(cfg, co).rfind("cudnn (variable-length", 0), 0u)
        << describe_attention_backend(cfg, co);
    const auto weights = random_weights(flash, 51);
    set_weights(flash, weights);
    set_weights(cudnn, weights);
    const Packed p = make_packed(cfg.vocab_size, 61);
    const float fe = flash.evaluate(p.batch()), ce = cudnn.evaluate(p.batch());
    EXPECT_NEAR(ce, fe, 2e-2 * fe) << "eval loss";
    flash.forward_backward(p.batch(), 1.0f);
    cudnn.forward_backward(p.batch(), 1.0f);
    for (const ParamSpec& s : flash.layout().specs) {
        const auto g = cudnn.download(s.name, CudaModel::Which::Grad);
        const auto ref = flash.download(s.name, CudaModel::Which::Grad);
        EXPECT_GT(cosine(g, ref), 0.99) << s.name;
    }
    Packed many = p;  // row 0: six documents of 8
    for (int t = 0; t < kT; ++t) many.pos[t] = t % 8;
    EXPECT_ERROR(cudnn.evaluate(many.batch()), "a row of this micro-batch holds 6 documents, more than --max-docs-per-row=5");
}

TEST(CudaModelDocMaskingErrors, BatchAndModelMustAgree) {
    QTRAIN_REQUIRE_GPU();
    const ModelConfig cfg = qwen2_case();
    const Packed p = make_packed(cfg.vocab_size, 3);
    {
        CudaModel plain(cfg, gpu_options(DType::F32, kB, kT, false));
        EXPECT_ERROR(plain.evaluate(p.batch()), "built without document masking (--document-masking)");
    }
    CudaModel doc(cfg, gpu_options(DType::F32, kB, kT, true));
    Batch no_pos = p.batch();
    no_pos.positions = nullptr;
    EXPECT_ERROR(doc.forward_backward(no_pos, 1.0f), "built with --document-masking, but the batch carries no document positions");
    Packed bad = p;
    bad.pos[5] = 7;  // not 0 nor the previous position + 1
    EXPECT_ERROR(doc.evaluate(bad.batch()), "Batch::positions at row 0, token 5 is 7");
    bad = p;
    bad.pos[kT] = 3;  // a row must start a document
    EXPECT_ERROR(doc.evaluate(bad.batch()), "Batch::positions at row 1, token 0 is 3");
}

// Host only (no GPU needed): the attention choice and the memory plan. With document masking auto
// stays flash; --attention=cudnn is cuDNN's variable-length path where cuDNN runs (without a GPU:
// where the build has it), and otherwise an error with the reason.
TEST(CudaModelDocMaskingPlan, AutoIsFlashAndExplicitCudnnIsVariableLength) {
    const ModelConfig cfg = qwen2_case();
    ModelOptions o = gpu_options(DType::BF16, kB, kT, true);
    o.attention = AttentionImpl::Auto;
    EXPECT_EQ(choose_attention_backend(cfg, o), AttentionBackend::Flash);
    EXPECT_NE(describe_attention_backend(cfg, o).find("document masking runs on qtrain's flash kernels"),
              std::string::npos)
        << describe_attention_backend(cfg, o);
    o.attention = AttentionImpl::Cudnn;
    AttentionBackend b = AttentionBackend::Flash;
    try {
        b = choose_attention_backend(cfg, o);
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--attention=cudnn: "), std::string::npos) << e.what();
        return;
    }
    EXPECT_EQ(b, AttentionBackend::Cudnn);
    EXPECT_NE(describe_attention_backend(cfg, o).find("up to 32 per row"), std::string::npos)
        << describe_attention_backend(cfg, o);
    EXPECT_EQ(attention_shape(cfg, o, kB, kT, b).max_docs, 32);
    EXPECT_EQ(attention_shape(cfg, o, kB, kT, AttentionBackend::Flash).max_docs, 0);
}

TEST(CudaModelDocMaskingPlan, PlanCountsThePositionsBuffer) {
    const ModelConfig cfg = qwen2_case();
    const int B = 4, T = 1024;
    auto bytes = [&](bool doc, const char* category, bool pinned) {
        const MemoryPlan plan = CudaModel::plan(cfg, gpu_options(DType::BF16, B, T, doc));
        for (const auto& e : plan.entries)
            if (e.category == category) return pinned ? e.pinned_bytes : e.device_bytes;
        ADD_FAILURE() << "no " << category << " in the plan";
        return uint64_t{0};
    };
    const uint64_t positions = static_cast<uint64_t>(B) * T * sizeof(int32_t);
    EXPECT_GE(bytes(true, "Workspace", false), bytes(false, "Workspace", false) + positions);
    EXPECT_LE(bytes(true, "Workspace", false), bytes(false, "Workspace", false) + positions + 256);  // (alignment)
    EXPECT_GE(bytes(true, "Host staging", true), bytes(false, "Host staging", true) + positions);
}

}  // namespace
