// Per-op tests of the CPU reference ops: each forward against a direct double-precision evaluation of
// its formula, each backward against central finite differences of L = sum(out * r) (r random,
// accumulated in double) through the fp32 forward itself.
#include "model/cpu/cpu_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "core/error.h"
#include "cpu_test_util.h"

namespace qtrain {
namespace {

using test::central_difference;
using test::Near;
using test::random_vector;

using test::expect_gradient;
using test::weighted_sum;

TEST(CpuOps, MatmulForwardBackward) {
    const int N = 5, IC = 7, OC = 3;
    auto inp = random_vector(N * IC, 1), w = random_vector(OC * IC, 2), b = random_vector(OC, 3);
    const auto r = random_vector(N * OC, 4);
    std::vector<float> out(N * OC);
    cpu::matmul_forward(out.data(), inp.data(), w.data(), b.data(), N, IC, OC);
    for (int n = 0; n < N; ++n)
        for (int o = 0; o < OC; ++o) {
            double ref = b[o];
            for (int i = 0; i < IC; ++i) ref += static_cast<double>(inp[n * IC + i]) * w[o * IC + i];
            EXPECT_TRUE(Near(out[n * OC + o], ref, 1e-6, 1e-6));
        }

    // The backward adds: start from ones and subtract them afterwards.
    std::vector<float> dinp(N * IC, 1.0f), dw(OC * IC, 1.0f), db(OC, 1.0f);
    cpu::matmul_backward(dinp.data(), dw.data(), db.data(), r.data(), inp.data(), w.data(), N, IC, OC);
    for (auto* g : {&dinp, &dw, &db})
        for (auto& v : *g) v -= 1.0f;
    auto loss = [&] {
        cpu::matmul_forward(out.data(), inp.data(), w.data(), b.data(), N, IC, OC);
        return weighted_sum(out, r);
    };
    expect_gradient("dinp", inp, dinp, loss);
    expect_gradient("dweight", w, dw, loss);
    expect_gradient("dbias", b, db, loss);
}

TEST(CpuOps, GemmTransposes) {
    const int M = 4, N = 3, K = 5;
    const auto a = random_vector(M * K, 5), b = random_vector(K * N, 6);
    std::vector<float> at(K * M), bt(N * K);
    for (int i = 0; i < M; ++i)
        for (int k = 0; k < K; ++k) at[k * M + i] = a[i * K + k];
    for (int k = 0; k < K; ++k)
        for (int j = 0; j < N; ++j) bt[j * K + k] = b[k * N + j];
    for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb) {
            std::vector<float> c(M * N, 2.0f);
            cpu::gemm(ta, tb, M, N, K, 0.5f, ta ? at.data() : a.data(), ta ? M : K, tb ? bt.data() : b.data(),
                      tb ? K : N, 3.0f, c.data(), N);
            for (int i = 0; i < M; ++i)
                for (int j = 0; j < N; ++j) {
                    double ref = 6.0;
                    for (int k = 0; k < K; ++k) ref += 0.5 * a[i * K + k] * b[k * N + j];
                    EXPECT_TRUE(Near(c[i * N + j], ref, 1e-6, 1e-6)) << "ta=" << ta << " tb=" << tb;
                }
        }
}

TEST(CpuOps, EmbeddingBackwardSumsRepeatedTokens) {
    const int V = 6, C = 3, N = 5;
    const std::vector<int32_t> tokens = {2, 4, 2, 0, 2};
    const auto table = random_vector(V * C, 7), dout = random_vector(N * C, 8);
    std::vector<float> out(N * C), dtable(V * C, 0.0f);
    cpu::embedding_forward(out.data(), tokens.data(), table.data(), N, C);
    for (int n = 0; n < N; ++n)
        for (int c = 0; c < C; ++c) EXPECT_EQ(out[n * C + c], table[tokens[n] * C + c]);
    cpu::embedding_backward(dtable.data(), dout.data(), tokens.data(), N, C);
    for (int c = 0; c < C; ++c) {
        EXPECT_FLOAT_EQ(dtable[2 * C + c], dout[0 * C + c] + dout[2 * C + c] + dout[4 * C + c]);
        EXPECT_EQ(dtable[4 * C + c], dout[1 * C + c]);
        EXPECT_EQ(dtable[0 * C + c], dout[3 * C + c]);
        EXPECT_EQ(dtable[1 * C + c], 0.0f);
    }
}

TEST(CpuOps, RmsNorm) {
    const int N = 4, C = 8;
    const float eps = 1e-5f;
    auto x = random_vector(N * C, 9);
    auto w = random_vector(C, 10, 0.5f);
    for (auto& v : w) v += 1.0f;
    const auto r = random_vector(N * C, 11);
    std::vector<float> out(N * C), rstd(N);
    cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    for (int n = 0; n < N; ++n) {
        double ms = 0.0;
        for (int c = 0; c < C; ++c) ms += static_cast<double>(x[n * C + c]) * x[n * C + c];
        const double ref_rstd = 1.0 / std::sqrt(ms / C + eps);
        EXPECT_TRUE(Near(rstd[n], ref_rstd, 1e-6, 0));
        for (int c = 0; c < C; ++c) EXPECT_TRUE(Near(out[n * C + c], w[c] * x[n * C + c] * ref_rstd, 1e-6, 1e-7));
    }
    std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f);
    cpu::rmsnorm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), N, C);
    auto loss = [&] {
        cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
        return weighted_sum(out, r);
    };
    expect_gradient("dx", x, dx, loss);
    expect_gradient("dweight", w, dw, loss);
}

// Llama 3.1-8B's frequencies (theta 5e5, head_dim 128, factor 8, low 1, high 4, original 8192) against
// the published rule computed here in double: wavelengths below 8192 / 4 positions keep their
// frequency, those above 8192 / 1 are divided by 8, the band between is blended linearly in
// 8192 / wavelength. Every regime occurs.
TEST(CpuOps, Llama3RopeFrequencies) {
    ModelConfig c = preset_config("Llama-3.1-8B");
    const std::vector<float> f = cpu::rope_inv_freq(c);
    ASSERT_EQ(f.size(), 64u);
    int kept = 0, divided = 0, blended = 0;
    for (int i = 0; i < 64; ++i) {
        const double base = 1.0 / std::pow(500000.0, 2.0 * i / 128.0);
        const double wavelen = 2 * M_PI / base;
        double want;
        if (wavelen < 2048) want = base, ++kept;
        else if (wavelen > 8192) want = base / 8, ++divided;
        else {
            const double smooth = (8192 / wavelen - 1) / 3;
            want = (1 - smooth) * base / 8 + smooth * base;
            ++blended;
        }
        EXPECT_TRUE(Near(f[i], want, 2e-6, 0)) << "i=" << i << " wavelength " << wavelen;
    }
    EXPECT_GT(kept, 0);
    EXPECT_GT(divided, 0);
    EXPECT_GT(blended, 0);
    // plain RoPE is untouched by the llama3 fields when rope_type says default
    c.rope_type = "default";
    const std::vector<float> plain = cpu::rope_inv_freq(c);
    for (int i = 0; i < 64; ++i) EXPECT_TRUE(Near(plain[i], 1.0 / std::pow(500000.0, 2.0 * i / 128.0), 2e-6, 0));
    EXPECT_EQ(plain[63], f[63] * 8);
}

TEST(CpuOps, RopeMatchesRotateHalfAndInvertsInBackward) {
    const int B = 2, T = 5, H = 3, D = 8, half = D / 2;
    const double theta = 10000.0;
    std::vector<float> cos(T * half), sin(T * half);
    cpu::rope_tables(cos.data(), sin.data(), T, D, theta);
    auto x = random_vector(B * T * H * D, 12);
    std::vector<float> out(x.size());
    cpu::rope_forward(out.data(), x.data(), cos.data(), sin.data(), B, T, H, D);
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t)
            for (int h = 0; h < H; ++h) {
                const float* xi = x.data() + ((b * T + t) * H + h) * D;
                const float* oi = out.data() + ((b * T + t) * H + h) * D;
                for (int i = 0; i < D; ++i) {
                    // HF: x * cos + rotate_half(x) * sin, rotate_half = cat(-x[D/2:], x[:D/2]),
                    // frequencies repeated over both halves.
                    const int f = i % half;
                    const double angle = t * std::pow(theta, -2.0 * f / D);
                    const double rot = i < half ? -xi[i + half] : xi[i - half];
                    EXPECT_TRUE(Near(oi[i], xi[i] * std::cos(angle) + rot * std::sin(angle), 1e-5, 1e-5))
                        << "b=" << b << " t=" << t << " h=" << h << " i=" << i;
                }
            }
    // Position 0 is the identity.
    for (int i = 0; i < D; ++i) EXPECT_EQ(out[i], x[i]);

    const auto r = random_vector(x.size(), 13);
    std::vector<float> dx = r;  // in place
    cpu::rope_backward(dx.data(), dx.data(), cos.data(), sin.data(), B, T, H, D);
    auto loss = [&] {
        cpu::rope_forward(out.data(), x.data(), cos.data(), sin.data(), B, T, H, D);
        return weighted_sum(out, r);
    };
    expect_gradient("dx", x, dx, loss);
}

// Direct evaluation of causal GQA attention in double, with explicit probabilities.
void attention_reference(std::vector<double>& out, std::vector<double>& lse, const std::vector<float>& q,
                         const std::vector<float>& k, const std::vector<float>& v, int B, int T, int Hq, int Hkv,
                         int D) {
    out.assign(static_cast<size_t>(B) * T * Hq * D, 0.0);
    lse.assign(static_cast<size_t>(B) * Hq * T, 0.0);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < Hq; ++h) {
            const int kvh = h / (Hq / Hkv);
            for (int t = 0; t < T; ++t) {
                std::vector<double> s(T, -std::numeric_limits<double>::infinity());
                for (int u = 0; u <= t; ++u) {
                    double d = 0.0;
                    for (int i = 0; i < D; ++i)
                        d += static_cast<double>(q[((b * T + t) * Hq + h) * D + i]) *
                             k[((b * T + u) * Hkv + kvh) * D + i];
                    s[u] = d / std::sqrt(static_cast<double>(D));
                }
                double mx = *std::max_element(s.begin(), s.end()), z = 0.0;
                for (int u = 0; u <= t; ++u) z += std::exp(s[u] - mx);
                lse[(b * Hq + h) * T + t] = mx + std::log(z);
                for (int u = 0; u <= t; ++u)
                    for (int i = 0; i < D; ++i)
                        out[((b * T + t) * Hq + h) * D + i] +=
                            std::exp(s[u] - mx) / z * v[((b * T + u) * Hkv + kvh) * D + i];
            }
        }
}

TEST(CpuOps, CausalGqaAttention) {
    const int B = 2, T = 6, Hq = 4, Hkv = 2, D = 4;
    auto q = random_vector(B * T * Hq * D, 14), k = random_vector(B * T * Hkv * D, 15),
         v = random_vector(B * T * Hkv * D, 16);
    const auto r = random_vector(q.size(), 17);
    std::vector<float> out(q.size()), lse(B * Hq * T);
    cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, Hq, Hkv, D);
    std::vector<double> ref_out, ref_lse;
    attention_reference(ref_out, ref_lse, q, k, v, B, T, Hq, Hkv, D);
    for (size_t i = 0; i < out.size(); ++i) EXPECT_TRUE(Near(out[i], ref_out[i], 1e-5, 1e-6)) << "out[" << i << "]";
    for (size_t i = 0; i < lse.size(); ++i) EXPECT_TRUE(Near(lse[i], ref_lse[i], 1e-6, 1e-6)) << "lse[" << i << "]";

    std::vector<float> dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f);
    cpu::attention_backward(dq.data(), dk.data(), dv.data(), r.data(), q.data(), k.data(), v.data(), lse.data(), B, T,
                            Hq, Hkv, D);
    auto loss = [&] {
        cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, Hq, Hkv, D);
        return weighted_sum(out, r);
    };
    expect_gradient("dq", q, dq, loss);
    expect_gradient("dk", k, dk, loss);
    expect_gradient("dv", v, dv, loss);
    // Causality: the last position's keys and values reach nothing but the last query.
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < Hkv; ++h)
            for (int i = 0; i < D; ++i) EXPECT_NE(dv[((b * T + T - 1) * Hkv + h) * D + i], 0.0f);
}

// Document masking: a packed row (documents of 5 and 4 tokens, then 3 of padding) gives, per
// document, exactly what that document gives run alone as its own row — attention, RoPE and their
// backwards — so nothing of one document reaches another.
TEST(CpuOps, DocumentMaskedAttentionAndRopeEqualEachDocumentAlone) {
    const int T = 12, Hq = 4, Hkv = 2, D = 4;
    const std::vector<int> docs = {5, 4, 3};
    std::vector<int32_t> positions;
    for (int len : docs)
        for (int p = 0; p < len; ++p) positions.push_back(p);
    std::vector<float> cos(T * D / 2), sin(T * D / 2);
    cpu::rope_tables(cos.data(), sin.data(), T, D, 10000.0);
    auto q = random_vector(T * Hq * D, 31), k = random_vector(T * Hkv * D, 32), v = random_vector(T * Hkv * D, 33);
    const auto r = random_vector(q.size(), 34);
    cpu::rope_forward(q.data(), q.data(), cos.data(), sin.data(), 1, T, Hq, D, positions.data());
    cpu::rope_forward(k.data(), k.data(), cos.data(), sin.data(), 1, T, Hkv, D, positions.data());
    std::vector<float> out(q.size()), lse(Hq * T), dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f);
    cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), 1, T, Hq, Hkv, D, positions.data());
    cpu::attention_backward(dq.data(), dk.data(), dv.data(), r.data(), q.data(), k.data(), v.data(), lse.data(), 1, T,
                            Hq, Hkv, D, positions.data());
    cpu::rope_backward(dq.data(), dq.data(), cos.data(), sin.data(), 1, T, Hq, D, positions.data());

    int start = 0;
    for (int len : docs) {
        auto slice = [&](const std::vector<float>& x, int H) {
            return std::vector<float>(x.begin() + static_cast<long>(start) * H * D,
                                      x.begin() + static_cast<long>(start + len) * H * D);
        };
        // The document alone: the same pre-RoPE inputs, positions 0..len-1.
        auto q1 = random_vector(T * Hq * D, 31), k1 = random_vector(T * Hkv * D, 32);
        auto qd = slice(q1, Hq), kd = slice(k1, Hkv), vd = slice(v, Hkv), rd = slice(r, Hq);
        cpu::rope_forward(qd.data(), qd.data(), cos.data(), sin.data(), 1, len, Hq, D);
        cpu::rope_forward(kd.data(), kd.data(), cos.data(), sin.data(), 1, len, Hkv, D);
        std::vector<float> od(qd.size()), ld(Hq * len), dqd(qd.size(), 0.0f), dkd(kd.size(), 0.0f), dvd(vd.size(), 0.0f);
        cpu::attention_forward(od.data(), ld.data(), qd.data(), kd.data(), vd.data(), 1, len, Hq, Hkv, D);
        cpu::attention_backward(dqd.data(), dkd.data(), dvd.data(), rd.data(), qd.data(), kd.data(), vd.data(),
                                ld.data(), 1, len, Hq, Hkv, D);
        cpu::rope_backward(dqd.data(), dqd.data(), cos.data(), sin.data(), 1, len, Hq, D);
        const auto o = slice(out, Hq), g_q = slice(dq, Hq), g_k = slice(dk, Hkv), g_v = slice(dv, Hkv);
        for (size_t i = 0; i < od.size(); ++i) EXPECT_EQ(o[i], od[i]) << "doc at " << start << " out[" << i << "]";
        for (size_t i = 0; i < dqd.size(); ++i) EXPECT_EQ(g_q[i], dqd[i]) << "doc at " << start << " dq[" << i << "]";
        for (size_t i = 0; i < dkd.size(); ++i) EXPECT_EQ(g_k[i], dkd[i]) << "doc at " << start << " dk[" << i << "]";
        for (size_t i = 0; i < dvd.size(); ++i) EXPECT_EQ(g_v[i], dvd[i]) << "doc at " << start << " dv[" << i << "]";
        for (int h = 0; h < Hq; ++h)
            for (int t = 0; t < len; ++t) EXPECT_EQ(lse[h * T + start + t], ld[h * len + t]);
        start += len;
    }
}

TEST(CpuOps, SwiGlu) {
    const int n = 40;
    auto gate = random_vector(n, 18, 2.0f), up = random_vector(n, 19);
    const auto r = random_vector(n, 20);
    std::vector<float> out(n);
    cpu::swiglu_forward(out.data(), gate.data(), up.data(), n);
    for (int i = 0; i < n; ++i) {
        const double g = gate[i];
        EXPECT_TRUE(Near(out[i], g / (1.0 + std::exp(-g)) * up[i], 1e-6, 1e-7));
    }
    std::vector<float> dgate(n, 0.0f), dup(n, 0.0f);
    cpu::swiglu_backward(dgate.data(), dup.data(), r.data(), gate.data(), up.data(), n);
    auto loss = [&] {
        cpu::swiglu_forward(out.data(), gate.data(), up.data(), n);
        return weighted_sum(out, r);
    };
    expect_gradient("dgate", gate, dgate, loss);
    expect_gradient("dup", up, dup, loss);
}

// log-softmax cross-entropy of one row in double.
double ce_reference(const float* row, int V, int target) {
    double mx = row[0];
    for (int j = 0; j < V; ++j) mx = std::max(mx, static_cast<double>(row[j]));
    double z = 0.0;
    for (int j = 0; j < V; ++j) z += std::exp(row[j] - mx);
    return mx + std::log(z) - row[target];
}

TEST(CpuOps, SoftmaxCrossEntropyIsExactAndStable) {
    // A long row spanning exp's whole useful range (and beyond: -200 underflows) checks the vectorised
    // exp against double precision, through the probabilities it produces.
    const int V = 5000;
    std::vector<float> row(V);
    Rng rng(21);
    for (int j = 0; j < V; ++j) row[j] = 1000.0f + (j == 17 ? 5.0f : -200.0f * rng.uniform());
    const std::vector<int32_t> target = {3};
    const double ref = ce_reference(row.data(), V, 3);
    std::vector<double> ref_p(V);
    double mx = 1005.0, z = 0.0;
    for (int j = 0; j < V; ++j) z += std::exp(static_cast<double>(row[j]) - mx);
    for (int j = 0; j < V; ++j) ref_p[j] = std::exp(static_cast<double>(row[j]) - mx) / z;
    float loss = 0.0f;
    cpu::softmax_cross_entropy(row.data(), &loss, target.data(), 1, V, 1.0f, true);
    EXPECT_TRUE(Near(loss, ref, 1e-6, 0));
    for (int j = 0; j < V; ++j) {
        const double want = ref_p[j] - (j == 3 ? 1.0 : 0.0);
        EXPECT_TRUE(Near(row[j], want, 2e-6, 1e-30)) << "j=" << j;
    }

    // A NaN logit anywhere makes the loss NaN (a broken model must not look fine).
    std::vector<float> with_nan(V, -1.0f);
    with_nan[V - 3] = std::numeric_limits<float>::quiet_NaN();
    cpu::softmax_cross_entropy(with_nan.data(), &loss, target.data(), 1, V, 1.0f, false);
    EXPECT_TRUE(std::isnan(loss));

    std::vector<int32_t> bad = {V};
    EXPECT_THROW(cpu::softmax_cross_entropy(row.data(), &loss, bad.data(), 1, V, 1.0f, false), Error);
}

TEST(CpuOps, SoftmaxCrossEntropyGradientAndMasking) {
    const int n = 3, V = 11;
    auto logits = random_vector(n * V, 22, 2.0f);
    const std::vector<int32_t> targets = {4, -1, 10};
    const float dscale = 0.7f;
    std::vector<float> grad = logits, losses(n);
    cpu::softmax_cross_entropy(grad.data(), losses.data(), targets.data(), n, V, dscale, true);
    EXPECT_EQ(losses[1], 0.0f);
    for (int j = 0; j < V; ++j) EXPECT_EQ(grad[V + j], 0.0f);
    EXPECT_TRUE(Near(losses[0], ce_reference(logits.data(), V, 4), 1e-6, 0));
    EXPECT_TRUE(Near(losses[2], ce_reference(logits.data() + 2 * V, V, 10), 1e-6, 0));
    auto loss = [&] {
        std::vector<float> l = logits, out(n);
        cpu::softmax_cross_entropy(l.data(), out.data(), targets.data(), n, V, 0.0f, false);
        return dscale * (static_cast<double>(out[0]) + out[1] + out[2]);
    };
    expect_gradient("dlogits", logits, grad, loss);
}

struct LmHeadCase {
    int N = 7, C = 6, V = 37;
    std::vector<float> x = random_vector(7 * 6, 23), w = random_vector(37 * 6, 24, 0.5f);
    std::vector<int32_t> targets = {5, -1, 36, 0, -1, 12, 12};
};

TEST(CpuOps, LmHeadCrossEntropyMatchesReferenceAndFiniteDifferences) {
    LmHeadCase c;
    const float dscale = 1.0f / 5.0f;  // mean over the 5 valid targets
    EXPECT_EQ(cpu::count_valid_targets(c.targets.data(), c.N), 5);
    std::vector<float> losses(c.N), dx(c.N * c.C, 0.0f), dw(c.V * c.C, 0.0f);
    std::vector<float> scratch(static_cast<size_t>(cpu::lmhead_chunk_rows(c.N, 2)) * c.V);
    cpu::lmhead_cross_entropy(losses.data(), dx.data(), dw.data(), c.x.data(), c.w.data(), c.targets.data(), c.N, c.C,
                              c.V, 2, dscale, scratch.data());
    for (int n = 0; n < c.N; ++n) {
        if (c.targets[n] < 0) {
            EXPECT_EQ(losses[n], 0.0f);
            continue;
        }
        std::vector<float> logits(c.V);
        for (int v = 0; v < c.V; ++v) {
            double s = 0.0;
            for (int i = 0; i < c.C; ++i) s += static_cast<double>(c.x[n * c.C + i]) * c.w[v * c.C + i];
            logits[v] = static_cast<float>(s);
        }
        EXPECT_TRUE(Near(losses[n], ce_reference(logits.data(), c.V, c.targets[n]), 1e-5, 1e-6)) << "row " << n;
    }
    auto loss = [&] {
        std::vector<float> l(c.N);
        cpu::lmhead_cross_entropy(l.data(), nullptr, nullptr, c.x.data(), c.w.data(), c.targets.data(), c.N, c.C, c.V,
                                  2, 0.0f, scratch.data());
        double s = 0.0;
        for (float v : l) s += v;
        return s * dscale;
    };
    expect_gradient("dx", c.x, dx, loss);
    expect_gradient("dweight", c.w, dw, loss);
    // Masked rows get no gradient.
    for (int i = 0; i < c.C; ++i) EXPECT_EQ(dx[1 * c.C + i], 0.0f);
}

TEST(CpuOps, LmHeadChunkCountDoesNotChangeResults) {
    LmHeadCase c;
    const float dscale = 0.2f;
    std::vector<float> ref_losses, ref_dx, ref_dw;
    for (int chunks : {1, 2, 3, 4, 7, 50}) {
        std::vector<float> losses(c.N), dx(c.N * c.C, 0.0f), dw(c.V * c.C, 0.0f);
        std::vector<float> scratch(static_cast<size_t>(cpu::lmhead_chunk_rows(c.N, chunks)) * c.V);
        cpu::lmhead_cross_entropy(losses.data(), dx.data(), dw.data(), c.x.data(), c.w.data(), c.targets.data(), c.N,
                                  c.C, c.V, chunks, dscale, scratch.data());
        if (chunks == 1) {
            ref_losses = losses, ref_dx = dx, ref_dw = dw;
            continue;
        }
        // Rows are independent: losses and the input gradient do not depend on the chunking. The
        // weight gradient sums over rows chunk by chunk, so only its rounding may differ.
        for (int n = 0; n < c.N; ++n) EXPECT_EQ(losses[n], ref_losses[n]) << "chunks=" << chunks << " row " << n;
        for (size_t i = 0; i < dx.size(); ++i) EXPECT_TRUE(Near(dx[i], ref_dx[i], 1e-6, 1e-8)) << "chunks=" << chunks;
        for (size_t i = 0; i < dw.size(); ++i) EXPECT_TRUE(Near(dw[i], ref_dw[i], 1e-5, 1e-8)) << "chunks=" << chunks;
    }
}

TEST(CpuOps, SumSquaresAndAdamW) {
    const int64_t n = 200003;  // several blocks, the last one partial
    const auto x = random_vector(n, 25);
    double ref = 0.0;
    for (float v : x) ref += static_cast<double>(v) * v;
    EXPECT_TRUE(Near(cpu::sum_squares(x.data(), n), ref, 1e-12, 0));

    const int m = 9;
    auto p = random_vector(m, 26), g = random_vector(m, 27), mom = random_vector(m, 28, 0.1f),
         vel = random_vector(m, 29);
    for (auto& v : vel) v = v * v * 0.01f;
    const auto p0 = p, m0 = mom, v0 = vel;
    const float lr = 0.01f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, scale = 0.5f;
    const int step = 3;
    cpu::adamw_update(p.data(), g.data(), mom.data(), vel.data(), m, lr, b1, b2, eps, wd, scale, step);
    for (int i = 0; i < m; ++i) {
        const double gi = static_cast<double>(g[i]) * scale;
        const double mi = b1 * static_cast<double>(m0[i]) + (1 - static_cast<double>(b1)) * gi;
        const double vi = b2 * static_cast<double>(v0[i]) + (1 - static_cast<double>(b2)) * gi * gi;
        const double mh = mi / (1 - std::pow(static_cast<double>(b1), step));
        const double vh = vi / (1 - std::pow(static_cast<double>(b2), step));
        const double want = p0[i] - lr * (mh / (std::sqrt(vh) + eps) + wd * static_cast<double>(p0[i]));
        EXPECT_TRUE(Near(mom[i], mi, 1e-6, 1e-9));
        EXPECT_TRUE(Near(vel[i], vi, 1e-6, 1e-12));
        EXPECT_TRUE(Near(p[i], want, 1e-6, 1e-8));
    }
}

}  // namespace
}  // namespace qtrain
