// What the threads-mode `train` tests (train_cli_threads_test.cpp: the full model; train_cli_lora_ranks_test.cpp:
// LoRA) run alike, written once: N ranks against one rank on the same global batch, and a checkpoint
// of one number of ranks continued at another. Each test keeps its own flags, step counts, banner and
// the checks only it makes (on the files the runs leave in f.dir / name).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"
#include "train/train_cli_fixture.h"

namespace qtrain::test::train_cli {

// Run "one<world>" (one rank, accumulation 2 x world) and "many<world>" (`world` ranks, accumulation 2)
// with `common` under `limit`: both succeed, the ranks' run prints `banner`, and its `steps` step losses
// and gradient norms equal the one rank's to fp32 rounding (1e-6 relative: only the order of the
// micro-batch additions differs). `norms` (if given) gets the one rank's norms. Call through
// ASSERT_NO_FATAL_FAILURE.
inline void expect_ranks_equal_one_rank(const Fixture& f, const std::string& limit, const std::string& common, int world,
                                        int steps, const std::string& banner, std::vector<double>* norms = nullptr) {
    const std::string one = "one" + std::to_string(world), many = "many" + std::to_string(world);
    auto a = run_command(limit + f.base_cmd(one) + common + " --grad-accumulation=" + std::to_string(2 * world));
    auto b = run_command(limit + f.base_cmd(many) + common + " --grad-accumulation=2 --gpus=" + std::to_string(world));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_TRUE(Contains(b.output, banner)) << b.output;
    const std::string la = f.dir / (one + "/log.jsonl"), lb = f.dir / (many + "/log.jsonl");
    const auto loss_a = step_losses(la), loss_b = step_losses(lb);
    const auto norm_a = event_values(la, "step", "norm"), norm_b = event_values(lb, "step", "norm");
    ASSERT_EQ(loss_a.size(), static_cast<std::size_t>(steps));
    ASSERT_EQ(loss_b.size(), static_cast<std::size_t>(steps));
    ASSERT_EQ(norm_b.size(), static_cast<std::size_t>(steps));
    for (int s = 0; s < steps; ++s) {
        EXPECT_NEAR(loss_b[s], loss_a[s], 1e-6 * std::abs(loss_a[s])) << "step " << s;
        EXPECT_NEAR(norm_b[s], norm_a[s], 1e-6 * std::abs(norm_a[s])) << "step " << s;
    }
    if (norms) *norms = norm_a;
}

// The checkpoint folder of run "ws" copied to run `name`'s, its step-`last` checkpoint dropped, and
// continued with `common` at `ranks` x `accum`: the run succeeds and its steps from..last-1 have the
// losses of `reference` (the uninterrupted run's) to fp32 rounding (the same sequences per step,
// summed in another order). `output` (if given) gets what the run printed. Call through
// ASSERT_NO_FATAL_FAILURE.
inline void expect_resume_at_ranks(const Fixture& f, const std::string& limit, const std::string& common,
                                   const std::string& name, int ranks, int accum, int from, int last,
                                   const std::vector<double>& reference, std::string* output = nullptr) {
    namespace fs = std::filesystem;
    fs::copy(f.dir / "ws-ckpt", f.dir / (name + "-ckpt"), fs::copy_options::recursive);
    char last_dir[32];
    std::snprintf(last_dir, sizeof last_dir, "-ckpt/step_%08d", last);
    fs::remove_all(f.dir / (name + last_dir));
    auto resumed = run_command(limit + f.base_cmd(name) + common + " --continue --gpus=" + std::to_string(ranks) +
                               " --grad-accumulation=" + std::to_string(accum));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    if (output) *output = resumed.output;
    int first = -1;
    const auto losses = step_losses(f.dir / (name + "/log.jsonl"), &first);
    EXPECT_EQ(first, from);
    ASSERT_EQ(losses.size(), static_cast<std::size_t>(last - from));
    for (int i = 0; i < last - from; ++i)
        EXPECT_NEAR(losses[i], reference[from + i], 1e-6 * reference[from + i]) << "step " << from + i;
}

}  // namespace qtrain::test::train_cli
