// Every elementwise/reduction kernel of src/cuda against the CPU reference ops, on fresh random
// inputs, in fp32 (tight: only float rounding-order differences) and bf16 (outputs rounded to bf16,
// so ~2^-8 relative per element; the CPU reference gets the same bf16-rounded inputs).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <utility>

#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "gpu_test_util.h"
#include "model/cpu/cpu_ops.h"

using namespace qtrain;
using namespace qtrain::test;

namespace {

class KernelTest : public DtypeKernelTest {};

// The AdamW segment table on the device (freed with the buffer, also when an assertion returns early).
DeviceBuffer device_segments(const std::vector<cuda::ParamSegment>& segs) {
    DeviceBuffer d(sizeof(cuda::ParamSegment) * segs.size());
    CUDA_CHECK(cudaMemcpy(d.get(), segs.data(), sizeof(cuda::ParamSegment) * segs.size(), cudaMemcpyHostToDevice));
    return d;
}

}  // namespace

TEST_P(KernelTest, ResidualRmsnormForward) {
  for (const int C : {200, 101, 896}) {  // vector path, scalar path, Qwen2.5-0.5B width
    SCOPED_TRACE(C);
    const int N = 37;
    auto a = in(random_vector(N * C, 1)), d = in(random_vector(N * C, 2)), w = in(random_vector(C, 3));
    DeviceBuffer ga(a, act()), gd(d, act()), gw(w, act()), gres(N * C, act()), gnorm(N * C, act()), grstd(N, DType::F32);
    cuda::residual_rmsnorm_forward(act(), gres.get(), gnorm.get(), grstd.f32(), ga.get(), gd.get(), gw.get(), N, C,
                                   1e-6f, nullptr);
    std::vector<float> res(N * C), norm(N * C), rstd(N);
    cpu::residual_forward(res.data(), a.data(), d.data(), N * C);
    res = in(res);  // the GPU stores the residual in the activation type and normalises that
    cpu::rmsnorm_forward(norm.data(), rstd.data(), res.data(), w.data(), N, C, 1e-6f);
    EXPECT_LT(rel_max_error(gres.download(), res), tol(1e-6, 1e-6));
    EXPECT_LT(rel_max_error(grstd.download(), rstd), tol(1e-5, 1e-5));
    EXPECT_LT(rel_max_error(gnorm.download(), norm), tol(1e-5, 8e-3));

    // the fused abs-max (FP8) is exactly max |norm_out| as stored, and changes no output
    DeviceBuffer amax(std::vector<float>{123.0f, 0, 0, 0}, DType::F32), gres2(N * C, act()), gnorm2(N * C, act());
    cuda::residual_rmsnorm_forward(act(), gres2.get(), gnorm2.get(), grstd.f32(), ga.get(), gd.get(), gw.get(), N, C,
                                   1e-6f, nullptr, amax.f32());
    const auto stored = gnorm.download();
    float expect = 0;
    for (float v : stored) expect = std::max(expect, std::fabs(v));
    EXPECT_EQ(amax.download()[0], expect);
    EXPECT_EQ(gnorm2.download(), stored);
    EXPECT_EQ(gres2.download(), gres.download());
  }
}

TEST_P(KernelTest, RmsnormBackward) {
  // vector path, scalar path; more rows than column-sum blocks (1024), so each block walks several
  // rows: two at a time in the vector path, with an odd one left in some blocks (2100 = 2 * 1024 + 52;
  // 3073 = 3 * 1024 + 1) and at the 0.5B width (896, more than one column tile of the reduction)
  for (const auto [C, N] : {std::pair{136, 2100}, std::pair{101, 2100}, std::pair{896, 3073}}) {
    SCOPED_TRACE(C);
    auto x = in(random_vector(N * C, 4)), w = in(random_vector(C, 5)), dy = in(random_vector(N * C, 6));
    auto dres0 = in(random_vector(N * C, 7)), dw0 = random_vector(C, 8);
    std::vector<float> rstd(N), tmp(N * C);
    cpu::rmsnorm_forward(tmp.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
    DeviceBuffer gx(x, act()), gw(w, act()), gdy(dy, act()), gdres(dres0, act()), gdw(dw0, DType::F32),
        grstd(rstd, DType::F32), scratch(cuda::rmsnorm_backward_scratch_floats(N, C), DType::F32);
    cuda::rmsnorm_backward(act(), gdres.get(), gdw.f32(), scratch.f32(), gdy.get(), gx.get(), gw.get(), grstd.f32(), N,
                           C, nullptr);
    auto dres = dres0, dw = dw0;
    cpu::rmsnorm_backward(dres.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
    EXPECT_LT(rel_max_error(gdres.download(), dres), tol(1e-5, 8e-3));
    EXPECT_LT(rel_max_error(gdw.download(), dw), tol(1e-5, 1e-5));  // fp32 accumulation both ways

    // the fused abs-max (FP8) is exactly max |dres| as stored after the update, outputs unchanged
    DeviceBuffer amax(std::vector<float>{123.0f, 0, 0, 0}, DType::F32), gdres2(dres0, act()), gdw2(dw0, DType::F32);
    cuda::rmsnorm_backward(act(), gdres2.get(), gdw2.f32(), scratch.f32(), gdy.get(), gx.get(), gw.get(), grstd.f32(),
                           N, C, nullptr, amax.f32());
    const auto stored = gdres.download();
    float expect = 0;
    for (float v : stored) expect = std::max(expect, std::fabs(v));
    EXPECT_EQ(amax.download()[0], expect);
    EXPECT_EQ(gdres2.download(), stored);
    EXPECT_EQ(gdw2.download(), gdw.download());
  }
}

TEST_P(KernelTest, RopeForwardAndBackwardOnFusedQkv) {
  for (const int D : {64, 128, 20}) {  // vector paths, scalar path (D/2 not a multiple of the pack)
    SCOPED_TRACE(D);
    const int B = 2, T = 7, Hq = 4, Hkv = 2, stride = (Hq + 2 * Hkv) * D, N = B * T;
    auto qkv = in(random_vector(N * stride, 9));
    std::vector<float> cs(2 * T * D / 2);
    cpu::rope_tables(cs.data(), cs.data() + T * D / 2, T, D, 1e6);
    DeviceBuffer g(qkv, act()), gcs(cs, DType::F32);
    cuda::rope_forward(act(), g.get(), gcs.f32(), B, T, Hq, Hkv, D, nullptr);
    auto out = g.download();
    // reference: rotate the q and k parts (heads 0..Hq+Hkv-1 of each row are contiguous)
    std::vector<float> x(N * (Hq + Hkv) * D), y(x.size());
    for (int n = 0; n < N; ++n)
        std::copy_n(qkv.begin() + n * stride, (Hq + Hkv) * D, x.begin() + n * (Hq + Hkv) * D);
    cpu::rope_forward(y.data(), x.data(), cs.data(), cs.data() + T * D / 2, B, T, Hq + Hkv, D);
    std::vector<float> expect = qkv;
    for (int n = 0; n < N; ++n)
        std::copy_n(y.begin() + n * (Hq + Hkv) * D, (Hq + Hkv) * D, expect.begin() + n * stride);
    EXPECT_LT(rel_max_error(out, expect), tol(1e-6, 8e-3));

    // backward: the transpose rotation
    auto d = in(random_vector(N * stride, 10));
    g.upload(d);
    cuda::rope_backward(act(), g.get(), gcs.f32(), B, T, Hq, Hkv, D, nullptr);
    for (int n = 0; n < N; ++n) std::copy_n(d.begin() + n * stride, (Hq + Hkv) * D, x.begin() + n * (Hq + Hkv) * D);
    cpu::rope_backward(y.data(), x.data(), cs.data(), cs.data() + T * D / 2, B, T, Hq + Hkv, D);
    expect = d;
    for (int n = 0; n < N; ++n)
        std::copy_n(y.begin() + n * (Hq + Hkv) * D, (Hq + Hkv) * D, expect.begin() + n * stride);
    const auto dq = g.download();
    EXPECT_LT(rel_max_error(dq, expect), tol(1e-6, 8e-3));

    // with the fused abs-max (FP8 gradients): the same result, and max |dqkv| over q, k and v
    g.upload(d);
    DeviceBuffer amax(std::vector<float>{-1.0f, 0, 0, 0}, DType::F32);
    cuda::rope_backward(act(), g.get(), gcs.f32(), B, T, Hq, Hkv, D, nullptr, amax.f32());
    EXPECT_EQ(g.download(), dq);
    float want = 0.0f;
    for (float v : dq) want = std::max(want, std::fabs(v));
    EXPECT_EQ(amax.download()[0], want);
    float v_max = 0.0f;  // make the v part hold the largest value: it must still be seen
    for (int n = 0; n < N; ++n)
        for (int j = (Hq + Hkv) * D; j < stride; ++j) v_max = std::max(v_max, std::fabs(dq[n * stride + j]));
    auto d_big = d;
    d_big[3 * stride + (Hq + Hkv) * D + 1] = in(std::vector<float>{-50.0f})[0];
    g.upload(d_big);
    cuda::rope_backward(act(), g.get(), gcs.f32(), B, T, Hq, Hkv, D, nullptr, amax.f32());
    EXPECT_EQ(amax.download()[0], 50.0f) << "the v part of dqkv is not in the abs-max (v max was " << v_max << ")";
  }
}

TEST_P(KernelTest, SwigluForwardAndBackward) {
  for (const int I : {300, 256}) {  // scalar path for bf16 (300 % 8 != 0), vector path
    SCOPED_TRACE(I);
    const int N = 19;
    auto gu = in(random_vector(N * 2 * I, 11, 2.0f)), dout = in(random_vector(N * I, 12));
    DeviceBuffer ggu(gu, act()), gout(N * I, act()), gdout(dout, act()), gdgu(N * 2 * I, act());
    cuda::swiglu_forward(act(), gout.get(), ggu.get(), N, I, nullptr);
    cuda::swiglu_backward(act(), gdgu.get(), gdout.get(), ggu.get(), N, I, nullptr);
    std::vector<float> gate(N * I), up(N * I), out(N * I), dg(N * I, 0.0f), du(N * I, 0.0f);
    for (int n = 0; n < N; ++n)
        for (int i = 0; i < I; ++i) {
            gate[n * I + i] = gu[n * 2 * I + i];
            up[n * I + i] = gu[n * 2 * I + I + i];
        }
    cpu::swiglu_forward(out.data(), gate.data(), up.data(), N * I);
    cpu::swiglu_backward(dg.data(), du.data(), dout.data(), gate.data(), up.data(), N * I);
    std::vector<float> dgu(N * 2 * I);
    for (int n = 0; n < N; ++n)
        for (int i = 0; i < I; ++i) {
            dgu[n * 2 * I + i] = dg[n * I + i];
            dgu[n * 2 * I + I + i] = du[n * I + i];
        }
    EXPECT_LT(rel_max_error(gout.download(), out), tol(1e-5, 8e-3));
    EXPECT_LT(rel_max_error(gdgu.download(), dgu), tol(1e-5, 8e-3));

    // the fused abs-max (FP8) is exactly the max |x| of what was stored, and the outputs are the same
    DeviceBuffer amax(std::vector<float>{123.0f, 0, 0, 0}, DType::F32), gout2(N * I, act()), gdgu2(N * 2 * I, act());
    cuda::swiglu_forward(act(), gout2.get(), ggu.get(), N, I, nullptr, amax.f32());
    const auto stored = gout.download();
    float expect = 0;
    for (float v : stored) expect = std::max(expect, std::fabs(v));
    EXPECT_EQ(amax.download()[0], expect);
    EXPECT_EQ(gout2.download(), stored);
    cuda::swiglu_backward(act(), gdgu2.get(), gdout.get(), ggu.get(), N, I, nullptr, amax.f32());
    const auto dstored = gdgu.download();
    expect = 0;
    for (float v : dstored) expect = std::max(expect, std::fabs(v));
    EXPECT_EQ(amax.download()[0], expect);
    EXPECT_EQ(gdgu2.download(), dstored);
  }
}

TEST_P(KernelTest, EmbeddingForwardAndDeterministicBackward) {
    const int V = 50, C = 96, N = 64;
    auto table = in(random_vector(V * C, 13)), dout = in(random_vector(N * C, 14));
    std::vector<int32_t> tok(N);
    Rng r(15);
    for (auto& t : tok) t = static_cast<int32_t>(r.below(7));  // many repeats
    // host CSR as the model builds it
    std::vector<int32_t> order(N), uniq, offs, pos;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return tok[a] < tok[b]; });
    for (int i = 0; i < N; ++i) {
        if (i == 0 || tok[order[i]] != tok[order[i - 1]]) {
            uniq.push_back(tok[order[i]]);
            offs.push_back(i);
        }
        pos.push_back(order[i]);
    }
    offs.push_back(N);
    int32_t *dtok, *duniq, *doffs, *dpos;
    CUDA_CHECK(cudaMalloc(&dtok, N * 4));
    CUDA_CHECK(cudaMalloc(&duniq, uniq.size() * 4));
    CUDA_CHECK(cudaMalloc(&doffs, offs.size() * 4));
    CUDA_CHECK(cudaMalloc(&dpos, pos.size() * 4));
    CUDA_CHECK(cudaMemcpy(dtok, tok.data(), N * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(duniq, uniq.data(), uniq.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(doffs, offs.data(), offs.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dpos, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
    DeviceBuffer gtable(table, act()), gout(N * C, act()), gdout(dout, act());
    auto dtable0 = random_vector(V * C, 16);
    DeviceBuffer gdtable(dtable0, DType::F32);
    cuda::embedding_forward(act(), gout.get(), dtok, gtable.get(), N, C, nullptr);
    // the count lives on the device; max_unique above it only adds idle blocks
    DeviceBuffer count(std::vector<float>{0.0f}, DType::F32);
    const int32_t n_uniq = static_cast<int32_t>(uniq.size());
    CUDA_CHECK(cudaMemcpy(count.get(), &n_uniq, 4, cudaMemcpyHostToDevice));
    const auto* n_dev = static_cast<const int32_t*>(count.get());
    cuda::embedding_backward(gdtable.f32(), DType::F32, act(), gdout.get(), duniq, doffs, dpos, n_dev, n_uniq + 7, C,
                             nullptr);
    std::vector<float> out(N * C);
    cpu::embedding_forward(out.data(), tok.data(), table.data(), N, C);
    auto dtable = dtable0;
    cpu::embedding_backward(dtable.data(), dout.data(), tok.data(), N, C);
    EXPECT_EQ(rel_max_error(gout.download(), out), 0.0);  // a copy
    const auto on_device = gdtable.download();
    EXPECT_LT(rel_max_error(on_device, dtable), 1e-6);

    // The table in pinned host memory (untied models with --offload-gradients): fp32 gives the same
    // bits as on the device; bf16 rounds each touched element's sum stochastically (within one bf16
    // step of the fp32 sum), leaves the other rows alone, and repeats bit for bit.
    float* host32 = nullptr;
    uint16_t* host16 = nullptr;
    CUDA_CHECK(cudaHostAlloc(&host32, V * C * sizeof(float), cudaHostAllocDefault));
    CUDA_CHECK(cudaHostAlloc(&host16, V * C * sizeof(uint16_t), cudaHostAllocDefault));
    std::copy(dtable0.begin(), dtable0.end(), host32);
    cuda::embedding_backward(host32, DType::F32, act(), gdout.get(), duniq, doffs, dpos, n_dev, n_uniq + 7, C, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(std::vector<float>(host32, host32 + V * C), on_device);
    std::vector<uint16_t> start(V * C);
    for (int i = 0; i < V * C; ++i) start[i] = float_to_bf16(dtable0[i]);
    std::vector<std::vector<uint16_t>> runs;
    for (int rep = 0; rep < 2; ++rep) {
        std::copy(start.begin(), start.end(), host16);
        cuda::embedding_backward(host16, DType::BF16, act(), gdout.get(), duniq, doffs, dpos, n_dev, n_uniq + 7, C,
                                 nullptr, /*index_base=*/1000, /*seed=*/77);
        CUDA_CHECK(cudaDeviceSynchronize());
        runs.emplace_back(host16, host16 + V * C);
    }
    EXPECT_EQ(runs[0], runs[1]);
    std::vector<char> touched(V, 0);
    for (int32_t t : tok) touched[t] = 1;
    int rounded_up = 0, rounded_down = 0;
    for (int v = 0; v < V; ++v)
        for (int c = 0; c < C; ++c) {
            const int i = v * C + c;
            if (!touched[v]) {
                EXPECT_EQ(runs[0][i], start[i]) << "row " << v << " has no token and must not change";
                continue;
            }
            const float exact = bf16_to_float(start[i]) + (on_device[i] - dtable0[i]);  // start + the rows' sum
            const float got = bf16_to_float(runs[0][i]);
            const float step = std::ldexp(1.0f, std::ilogb(exact) - 7);  // one bf16 step at |exact|
            EXPECT_LE(std::fabs(got - exact), step * 1.01f) << "element " << i;
            if (got > exact) ++rounded_up;
            if (got < exact) ++rounded_down;
        }
    EXPECT_GT(rounded_up, 0);  // stochastic: both directions occur
    EXPECT_GT(rounded_down, 0);
    cudaFreeHost(host32);
    cudaFreeHost(host16);
    cudaFree(dtok);
    cudaFree(duniq);
    cudaFree(doffs);
    cudaFree(dpos);
}

TEST_P(KernelTest, SoftmaxCrossEntropyLossAndGradient) {
  for (const int V : {3001, 4096, 151936}) {  // scalar path, vector path, and a Qwen-sized vocab
    SCOPED_TRACE(V);
    const int n = 9;
    auto logits = in(random_vector(n * V, 17, 3.0f));
    std::vector<int32_t> tgt = {0, 5, -1, 3000, 17, -1, V - 2, 1, 42};
    int32_t* dt;
    CUDA_CHECK(cudaMalloc(&dt, n * 4));
    CUDA_CHECK(cudaMemcpy(dt, tgt.data(), n * 4, cudaMemcpyHostToDevice));
    DeviceBuffer gl(logits, act()), gloss(n, DType::F32), acc(4, DType::F32);
    DeviceBuffer scales(std::vector<float>{0.25f, 0.5f}, DType::F32);
    cuda::softmax_cross_entropy(act(), gl.get(), gloss.f32(), dt, n, V, scales.f32(), true, nullptr);
    cuda::accumulate_loss(acc.f32(), gloss.f32(), n, scales.f32() + 1, nullptr);
    std::vector<float> ref = logits, loss(n);
    cpu::softmax_cross_entropy(ref.data(), loss.data(), tgt.data(), n, V, 0.25f, true);
    auto gpu_loss = gloss.download();
    EXPECT_LT(rel_max_error(gpu_loss, loss), tol(1e-5, 1e-5));  // fp32 math on identical inputs
    EXPECT_LT(rel_max_error(gl.download(), ref), tol(1e-5, 8e-3));
    EXPECT_NEAR(acc.download()[0], 0.5 * std::accumulate(loss.begin(), loss.end(), 0.0), 1e-4);
    cudaFree(dt);
  }
}

TEST_P(KernelTest, BiasGradIsAColumnSum) {
    // 77 columns: 2-byte loads; 1152 (a Qwen q|k|v width) and 2000 rows (> the 1024 partial rows):
    // 16-byte loads, which must give the same bits as the 2-byte path on the same values (run on a
    // copy of the matrix one element off 16-byte alignment).
    for (const auto [N, C] : {std::pair{1000, 77}, std::pair{2000, 1152}}) {
        SCOPED_TRACE(C);
        auto d = in(random_vector(N * C, 18));
        auto db0 = random_vector(C, 19);
        DeviceBuffer gd(d, act()), gdb(db0, DType::F32), scratch(cuda::bias_grad_scratch_floats(N, C), DType::F32);
        cuda::bias_grad(gdb.f32(), scratch.f32(), act(), gd.get(), N, C, nullptr);
        auto db = db0;
        for (int n = 0; n < N; ++n)
            for (int c = 0; c < C; ++c) db[c] += d[n * C + c];
        const std::vector<float> got = gdb.download();
        EXPECT_LT(rel_max_error(got, db), 1e-5);

        std::vector<float> shifted(d.size() + 1, 0.0f);
        std::copy(d.begin(), d.end(), shifted.begin() + 1);
        DeviceBuffer gs(shifted, act()), gdb2(db0, DType::F32);
        const void* misaligned = static_cast<const char*>(gs.get()) + dtype_size(act());
        cuda::bias_grad(gdb2.f32(), scratch.f32(), act(), misaligned, N, C, nullptr);
        EXPECT_EQ(gdb2.download(), got) << "16-byte and 2-byte loads must sum in the same order";
    }
}

TEST_P(KernelTest, LinearForwardAndBackwardThroughCublasLt) {
    const int N = 48, IC = 64, OC = 80;  // sizes keep every leading dimension 16-byte aligned
    auto x = in(random_vector(N * IC, 20)), w = in(random_vector(OC * IC, 21, 0.1f)), b = in(random_vector(OC, 22));
    auto dy = in(random_vector(N * OC, 23));
    auto dw0 = random_vector(OC * IC, 24);
    DeviceBuffer gx(x, act()), gw(w, act()), gb(b, act()), gy(N * OC, act()), gdy(dy, act()), gdx(N * IC, act()),
        gdw(dw0, DType::F32);
    GemmRunner gemm(16 << 20);
    gemm.linear_forward(gy.get(), act(), gx.get(), gw.get(), act(), gb.get(), N, IC, OC, nullptr);
    gemm.linear_backward_input(gdx.get(), act(), gdy.get(), gw.get(), act(), N, IC, OC, nullptr);
    gemm.linear_backward_weight(gdw.f32(), DType::F32, gdy.get(), gx.get(), act(), N, IC, OC, true, nullptr);
    std::vector<float> y(N * OC), dx(N * IC, 0.0f);
    auto dw = dw0;
    cpu::matmul_forward(y.data(), x.data(), w.data(), b.data(), N, IC, OC);
    cpu::matmul_backward(dx.data(), dw.data(), nullptr, dy.data(), x.data(), w.data(), N, IC, OC);
    EXPECT_LT(rel_max_error(gy.download(), y), tol(1e-5, 8e-3));
    EXPECT_LT(rel_max_error(gdx.download(), dx), tol(1e-5, 8e-3));
    EXPECT_LT(rel_max_error(gdw.download(), dw), tol(1e-5, 1e-5));  // fp32 output, fp32 accumulation

    // beta = 1 onto what LoRA's adapters wrote first (lora_adapters.h, writes_whole): y += x W^T + b, dx += dy W
    auto y0 = in(random_vector(N * OC, 25)), dx0 = in(random_vector(N * IC, 26));
    DeviceBuffer gy1(y0, act()), gdx1(dx0, act());
    gemm.linear_forward(gy1.get(), act(), gx.get(), gw.get(), act(), gb.get(), N, IC, OC, nullptr, 1.0f);
    gemm.linear_backward_input(gdx1.get(), act(), gdy.get(), gw.get(), act(), N, IC, OC, nullptr, 1.0f);
    auto y1 = y0, dx1 = dx0;
    for (std::size_t i = 0; i < y1.size(); ++i) y1[i] += y[i];
    for (std::size_t i = 0; i < dx1.size(); ++i) dx1[i] += dx[i];
    EXPECT_LT(rel_max_error(gy1.download(), y1), tol(1e-5, 8e-3));
    EXPECT_LT(rel_max_error(gdx1.download(), dx1), tol(1e-5, 8e-3));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KernelTest, ::testing::Values(DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(OptimizerKernels, GlobalNormAndAdamWMatchTheReference) {
    QTRAIN_REQUIRE_GPU();
    const int64_t n1 = 1000, n2 = 300, gap = 24, total = n1 + gap + n2;
    auto master0 = random_vector(total, 30), grad = random_vector(total, 31, 0.5f);
    auto m0 = random_vector(total, 32, 0.01f), v0 = random_vector(total, 33, 0.01f);
    for (auto& x : v0) x = std::fabs(x);
    for (int64_t i = n1; i < n1 + gap; ++i) grad[i] = master0[i] = m0[i] = v0[i] = 0.0f;  // padding
    std::vector<cuda::ParamSegment> segs = {{0, n1, 1}, {n1 + gap, n2, 0}};
    const DeviceBuffer dsegs = device_segments(segs);
    DeviceBuffer gm(master0, DType::F32), gg(grad, DType::F32), gmm(m0, DType::F32), gvv(v0, DType::F32),
        gw(total, DType::BF16), partials(cuda::norm_partials_count(), DType::F32), out(4, DType::F32);

    double ss = 0;
    for (float g : grad) ss += static_cast<double>(g) * g;
    const float norm = static_cast<float>(std::sqrt(ss)), clip = norm / 2;  // clipping active
    cuda::global_norm(out.f32(), partials.f32(), gg.f32(), DType::F32, total, clip, nullptr);
    auto o = out.download();
    EXPECT_NEAR(o[0], norm, 1e-5 * norm);
    EXPECT_NEAR(o[1], clip / o[0], 1e-6);

    cuda::AdamWArgs a{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 7};
    cuda::adamw_update(dsegs.as<const cuda::ParamSegment>(), 2, total, gm.f32(), gg.f32(), DType::F32,
                       gmm.get(), DType::F32, gvv.get(), DType::F32, gw.get(), DType::BF16, out.f32(), a, nullptr, nullptr);
    auto master = master0, m = m0, v = v0;
    cpu::adamw_update(master.data(), grad.data(), m.data(), v.data(), n1, a.lr, a.beta1, a.beta2, a.eps, 0.1f, o[1], 3);
    cpu::adamw_update(master.data() + n1 + gap, grad.data() + n1 + gap, m.data() + n1 + gap, v.data() + n1 + gap, n2,
                      a.lr, a.beta1, a.beta2, a.eps, 0.0f, o[1], 3);
    EXPECT_LT(rel_max_error(gm.download(), master), 1e-6);
    EXPECT_LT(rel_max_error(gmm.download(), m), 1e-6);
    EXPECT_LT(rel_max_error(gvv.download(), v), 1e-6);
    EXPECT_LT(rel_max_error(gw.download(), round_bf16(master)), 1e-6);  // weights = bf16(master)
}

// --master-dtype=bf16: no fp32 master, AdamW updates the bf16 weights in place. Updates of about
// 1e-3 on weights near 1 are below half a bf16 ulp (2^-8), so round-to-nearest would freeze the
// weights; stochastic rounding must land on one of the two bf16 neighbours of the exact fp32 result
// and average to it.
TEST(OptimizerKernels, Bf16MasterUpdatesTheWeightsWithUnbiasedStochasticRounding) {
    QTRAIN_REQUIRE_GPU();
    const int64_t n = 1 << 16;
    auto p0 = round_bf16(random_vector(n, 51, 1.0f));
    for (auto& x : p0) x = round_bf16(std::vector<float>{x + (x >= 0 ? 0.5f : -0.5f)})[0];  // |p| in [0.5, 1.5]
    auto grad = random_vector(n, 52, 0.3f);
    std::vector<float> m0(n, 0.0f), v0(n, 0.0f);
    std::vector<cuda::ParamSegment> segs = {{0, n, 1}};
    const DeviceBuffer dsegs = device_segments(segs);
    DeviceBuffer gw(p0, DType::BF16), gg(grad, DType::F32), gmm(m0, DType::F32), gvv(v0, DType::F32),
        clip(std::vector<float>{0, 1, 0, 0}, DType::F32);
    cuda::AdamWArgs a{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1234};
    cuda::adamw_update(dsegs.as<const cuda::ParamSegment>(), 1, n, nullptr, gg.f32(), DType::F32, gmm.get(),
                       DType::F32, gvv.get(), DType::F32, gw.get(), DType::BF16, clip.f32(), a, nullptr, nullptr);
    auto exact = p0, m = m0, v = v0;
    cpu::adamw_update(exact.data(), grad.data(), m.data(), v.data(), n, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                      1.0f, 1);
    const auto got = gw.download();
    EXPECT_LT(rel_max_error(gmm.download(), m), 1e-6);
    EXPECT_LT(rel_max_error(gvv.download(), v), 1e-6);
    double bias = 0;
    int64_t moved = 0, moved_rn = 0;
    for (int64_t i = 0; i < n; ++i) {
        const float ulp = std::ldexp(1.0f, std::ilogb(exact[i]) - 7);  // bf16 spacing at exact[i]
        ASSERT_LE(std::fabs(got[i] - exact[i]), ulp * 1.001f) << "element " << i << ": not a bf16 neighbour";
        ASSERT_EQ(got[i], round_bf16(std::vector<float>{got[i]})[0]) << "element " << i << " is not a bf16 value";
        bias += (got[i] - exact[i]) / ulp;
        moved += got[i] != p0[i];
        moved_rn += round_bf16(std::vector<float>{exact[i]})[0] != p0[i];
    }
    bias /= n;
    EXPECT_LT(std::fabs(bias), 0.01) << "mean rounding error in ulps";  // ~0.002 expected from noise
    EXPECT_LT(moved_rn, n / 100) << "the test needs updates below half an ulp";
    EXPECT_GT(moved, n / 20) << "stochastic rounding must move some weights";
}

// --param-grad-dtype=bf16: the norm and the update read bf16 gradients; with the same values in
// fp32 they must give exactly the same results.
TEST(OptimizerKernels, Bf16GradientsGiveTheSameNormAndUpdateAsTheirFp32Values) {
    QTRAIN_REQUIRE_GPU();
    const int64_t n = 4096 + 64;
    const auto grad = round_bf16(random_vector(n, 61, 0.3f)), p0 = random_vector(n, 62, 1.0f);
    std::vector<float> zero(n, 0.0f);
    std::vector<cuda::ParamSegment> segs = {{0, n, 1}};
    const DeviceBuffer dsegs = device_segments(segs);
    std::vector<std::vector<float>> results[2];
    for (int bf16 = 0; bf16 < 2; ++bf16) {
        const DType gt = bf16 ? DType::BF16 : DType::F32;
        DeviceBuffer gm(p0, DType::F32), gg(grad, gt), gmm(zero, DType::BF16), gvv(zero, DType::F32),
            gw(n, DType::BF16), partials(cuda::norm_partials_count(), DType::F32), out(4, DType::F32);
        cuda::global_norm(out.f32(), partials.f32(), gg.get(), gt, n, 1.0f, nullptr);
        cuda::AdamWArgs a{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 2, 5};
        cuda::adamw_update(dsegs.as<const cuda::ParamSegment>(), 1, n, gm.f32(), gg.get(), gt, gmm.get(),
                           DType::BF16, gvv.get(), DType::F32, gw.get(), DType::BF16, out.f32(), a, nullptr, nullptr);
        results[bf16] = {out.download(), gm.download(), gmm.download(), gvv.download(), gw.download()};
    }
    double ss = 0;
    for (float g : grad) ss += static_cast<double>(g) * g;
    EXPECT_NEAR(results[1][0][0], std::sqrt(ss), 1e-5 * std::sqrt(ss));
    EXPECT_LT(results[1][0][1], 1.0f);  // clipping active
    for (int k = 0; k < 5; ++k) EXPECT_EQ(results[1][k], results[0][k]) << "result " << k;
}

// accumulate_bf16 (offloaded bf16 gradients): overwrite rounds src, add rounds float(dst) + src;
// every result is one of the two bf16 neighbours of the exact fp32 value, the rounding is unbiased,
// deterministic for the same (index, value), and different at another index_base.
TEST(ConvertKernels, AccumulateBf16RoundsStochasticallyWithoutBias) {
    QTRAIN_REQUIRE_GPU();
    const int64_t n = 1 << 16;
    const auto src = random_vector(n, 71, 0.01f), dst0 = round_bf16(random_vector(n, 72, 1.0f));
    for (bool overwrite : {true, false}) {
        SCOPED_TRACE(overwrite ? "overwrite" : "add");
        DeviceBuffer gs(src, DType::F32);
        std::vector<float> got[3];
        for (int run = 0; run < 3; ++run) {
            DeviceBuffer gd(dst0, DType::BF16);
            cuda::accumulate_bf16(gd.get(), gs.f32(), n, overwrite, run == 2 ? 1u << 20 : 4096, 77, nullptr);
            got[run] = gd.download();
        }
        EXPECT_EQ(got[0], got[1]) << "not deterministic";
        EXPECT_NE(got[0], got[2]) << "the index does not enter the random bits";
        double bias = 0;
        int64_t off_nearest = 0;
        for (int64_t i = 0; i < n; ++i) {
            const float exact = overwrite ? src[i] : dst0[i] + src[i];
            const float ulp = std::ldexp(1.0f, std::ilogb(exact) - 7);
            ASSERT_LE(std::fabs(got[0][i] - exact), ulp * 1.001f) << "element " << i << ": not a bf16 neighbour";
            ASSERT_EQ(got[0][i], round_bf16(std::vector<float>{got[0][i]})[0]) << "element " << i;
            bias += (got[0][i] - exact) / ulp;
            off_nearest += got[0][i] != round_bf16(std::vector<float>{exact})[0];
        }
        EXPECT_LT(std::fabs(bias / n), 0.01) << "mean rounding error in ulps";
        EXPECT_GT(off_nearest, n / 10) << "this is round-to-nearest, not stochastic rounding";
    }
}

// FP8: AdamW folds each segment's max |weight as stored| into its amax slot — exactly what a
// separate abs_max pass over the written weights gives — for the fp32 master (bf16 weights rounded
// to nearest) and the bf16 master (stochastic rounding). The segments are placed so that warps
// straddle a segment end, padding and the next segment's start (the per-thread path).
TEST(OptimizerKernels, AdamWWeightAmaxEqualsAbsMaxOfTheStoredWeights) {
    QTRAIN_REQUIRE_GPU();
    const int64_t n1 = 1000, gap = 20, n2 = 3000, n3 = 500, total = n1 + gap + n2 + gap + n3 + 16;
    std::vector<cuda::ParamSegment> segs = {{0, n1, 1, 0}, {n1 + gap, n2, 1, 2}, {n1 + gap + n2 + gap, n3, 0, -1}};
    const DeviceBuffer dsegs = device_segments(segs);
    auto p0 = random_vector(total, 81, 1.0f), grad = random_vector(total, 82, 0.5f);
    p0[n1 + gap + 17] = 7.5f;   // the largest weight of segment 2 (slot 2)
    p0[n1 + gap + n2 + gap + 3] = -100.0f;  // in the segment without a slot: must not leak into slot 2
    for (int64_t i = n1; i < n1 + gap; ++i) p0[i] = grad[i] = 0.0f;
    for (int64_t i = n1 + gap + n2; i < n1 + gap + n2 + gap; ++i) p0[i] = grad[i] = 0.0f;
    for (int64_t i = total - 16; i < total; ++i) p0[i] = grad[i] = 0.0f;
    const auto p0_bf16 = round_bf16(p0);
    std::vector<float> zero(total, 0.0f);
    for (bool bf16_master : {false, true}) {
        SCOPED_TRACE(bf16_master ? "bf16 master" : "fp32 master");
        DeviceBuffer gm(p0, DType::F32), gg(grad, DType::F32), gmm(zero, DType::F32), gvv(zero, DType::F32),
            gw(p0_bf16, DType::BF16), amax(std::vector<float>(4 * 4, 0.0f), DType::F32),
            clip(std::vector<float>{0, 1, 0, 0}, DType::F32);
        cuda::AdamWArgs a{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 3};
        cuda::adamw_update(dsegs.as<const cuda::ParamSegment>(), 3, total, bf16_master ? nullptr : gm.f32(),
                           gg.f32(), DType::F32, gmm.get(), DType::F32, gvv.get(), DType::F32, gw.get(), DType::BF16,
                           clip.f32(), a, amax.f32(), nullptr);
        const auto w = gw.download(), got = amax.download();
        float want[2] = {0, 0};
        for (int64_t i = 0; i < n1; ++i) want[0] = std::max(want[0], std::fabs(w[i]));
        for (int64_t i = n1 + gap; i < n1 + gap + n2; ++i) want[1] = std::max(want[1], std::fabs(w[i]));
        EXPECT_EQ(got[0], want[0]);
        EXPECT_EQ(got[8], want[1]);
        EXPECT_GT(want[1], 7.0f);
        for (int slot : {1, 3}) EXPECT_EQ(got[4 * slot], 0.0f) << "slot " << slot << " has no segment";
    }
}

// adamw_update_range over consecutive chunks, each array given at its chunk start (as the
// double-buffered optimizer does with its staging slots), equals one whole update bit for bit —
// bf16 moments (stochastic rounding by absolute index), bf16 weights, padding between segments.
TEST(OptimizerKernels, ChunkedAdamWEqualsTheWholeUpdate) {
    QTRAIN_REQUIRE_GPU();
    const int64_t n1 = 5000, gap = 60, n2 = 3004, total = n1 + gap + n2 + 72;
    std::vector<cuda::ParamSegment> segs = {{0, n1, 1, -1}, {n1 + gap, n2, 0, -1}};
    const DeviceBuffer dsegs = device_segments(segs);
    auto p0 = random_vector(total, 91, 1.0f), grad = random_vector(total, 92, 0.5f);
    auto m0 = random_vector(total, 93, 0.01f), v0 = random_vector(total, 94, 0.01f);
    for (auto& x : v0) x = std::fabs(x);
    for (int64_t i = n1; i < n1 + gap; ++i) p0[i] = grad[i] = m0[i] = v0[i] = 0.0f;
    for (int64_t i = n1 + gap + n2; i < total; ++i) p0[i] = grad[i] = m0[i] = v0[i] = 0.0f;
    const cuda::AdamWArgs a{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 4, 11};
    std::vector<std::vector<float>> got[2];
    for (int chunked = 0; chunked < 2; ++chunked) {
        DeviceBuffer gm(p0, DType::F32), gg(grad, DType::F32), gmm(m0, DType::BF16), gvv(v0, DType::BF16),
            gw(std::vector<float>(total, 7.0f), DType::BF16), clip(std::vector<float>{0, 1, 0, 0}, DType::F32);
        const int64_t step = chunked ? 1024 : total;
        for (int64_t b = 0; b < total; b += step) {
            const int64_t e = std::min(total, b + step);
            cuda::adamw_update_range(dsegs.as<const cuda::ParamSegment>(), 2, b, e, gm.f32() + b,
                                     gg.f32() + b, DType::F32, static_cast<uint16_t*>(gmm.get()) + b, DType::BF16,
                                     static_cast<uint16_t*>(gvv.get()) + b, DType::BF16,
                                     static_cast<uint16_t*>(gw.get()) + b, DType::BF16, clip.f32(), a, nullptr,
                                     nullptr);
        }
        got[chunked] = {gm.download(), gmm.download(), gvv.download(), gw.download()};
    }
    for (int k = 0; k < 4; ++k) EXPECT_EQ(got[1][k], got[0][k]) << "array " << k;
    for (int64_t i = n1; i < n1 + gap; ++i) ASSERT_EQ(got[0][3][i], 0.0f) << "padding weights are written as zeros";
}

TEST(OptimizerKernels, Bf16MomentsUseUnbiasedStochasticRounding) {
    QTRAIN_REQUIRE_GPU();
    // g constant, so m after one step is (1-b1) g in fp32 for every element; that value is not a
    // bf16 number, so the bf16 stores must straddle it and average to it.
    const int64_t n = 1 << 16;
    const float g = 1.2345678f;
    std::vector<float> grad(n, g), zero(n, 0.0f), master(n, 0.0f);
    std::vector<cuda::ParamSegment> segs = {{0, n, 0}};
    const DeviceBuffer dsegs = device_segments(segs);
    DeviceBuffer gm(master, DType::F32), gg(grad, DType::F32), gmm(zero, DType::BF16), gvv(zero, DType::BF16),
        clip(std::vector<float>{0, 1, 0, 0}, DType::F32);
    cuda::AdamWArgs a{1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, 99};
    cuda::adamw_update(dsegs.as<const cuda::ParamSegment>(), 1, n, gm.f32(), gg.f32(), DType::F32,
                       gmm.get(), DType::BF16, gvv.get(), DType::BF16, nullptr, DType::F32, clip.f32(), a, nullptr, nullptr);
    auto m = gmm.download();
    double mean = 0;
    for (float x : m) mean += x;
    mean /= n;
    const float exact = (1.0f - a.beta1) * g;
    ASSERT_NE(bf16_to_float(float_to_bf16(exact)), exact);  // round-to-nearest alone would be biased
    EXPECT_NEAR(mean, exact, exact * 2e-4);                  // unbiased on average
    std::set<float> distinct(m.begin(), m.end());
    EXPECT_EQ(distinct.size(), 2u);                          // the two bf16 neighbours of `exact`
}
