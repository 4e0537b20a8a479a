// `train` with --document-masking and --loss-normalization (issue 31) on the CPU model: chat-like data
// with document starts and masks packs by default and prints the fill rate; files without document
// starts pack at EOS tokens (or, with none, in pieces) when asked; the default path stays bit-identical
// to --document-masking=off; token normalisation over the ranks equals one rank with their
// accumulation; bad values are named.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/rng.h"
#include "io/token_file.h"
#include "test_util.h"
#include "train/train_cli_fixture.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::train_cli;
namespace fs = std::filesystem;

namespace {

const std::string kLimit = "timeout 120 ";

// Conversations: documents of 8..90 tokens of the fixture's learnable stream (no EOS = 0 inside), the
// first third of each masked (a prompt), with document starts.
std::string write_chat_file(const Fixture& f, const std::string& name, uint64_t seed, int documents) {
    Rng rng(seed);
    std::vector<int32_t> tokens;
    std::vector<uint8_t> mask;
    std::vector<int64_t> starts;
    const std::vector<int32_t> stream = make_tokens(documents * 100, seed);
    std::size_t at = 0;
    for (int d = 0; d < documents; ++d) {
        const int L = 8 + static_cast<int>(rng.below(83));
        starts.push_back(static_cast<int64_t>(tokens.size()));
        for (int j = 0; j < L; ++j, ++at) {
            tokens.push_back(stream[at] == 0 ? 5 : stream[at]);
            mask.push_back(j >= L / 3);
        }
    }
    const std::string path = f.dir / name;
    write_token_file(path, tokens, kVocab, &mask, &starts);
    return path;
}

std::vector<uint8_t> file_bytes(const std::string& path) {
    const std::string s = read_file(path);
    return std::vector<uint8_t>(s.begin(), s.end());
}

}  // namespace

TEST(TrainCliPacking, ChatDataPacksByDefaultAndTrains) {
    Fixture f;
    const std::string train = write_chat_file(f, "chat-train.bin", 3, 400), eval = write_chat_file(f, "chat-eval.bin", 4, 40);
    auto r = run_command(kLimit + f.base_cmd("chat") + " --train-file=" + train + " --eval-file=" + eval +
                         " --steps=30 --eval-every-n-steps=15");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(Contains(r.output, "[Setup] train data packed with document masking: 400 documents")) << r.output;
    EXPECT_TRUE(Contains(r.output, "[Setup] eval data packed with document masking: 40 documents")) << r.output;
    EXPECT_TRUE(Contains(r.output, "fill rate")) << r.output;
    EXPECT_TRUE(Contains(r.output, "longer than --seq-len split")) << r.output;
    EXPECT_TRUE(Contains(r.output, "--document-masking=on (given auto), loss normalised over the trained tokens"))
        << r.output;
    const auto losses = step_losses(f.dir / "chat/log.jsonl");
    ASSERT_EQ(losses.size(), 30u);
    EXPECT_LT((losses[27] + losses[28] + losses[29]) / 3, (losses[0] + losses[1] + losses[2]) / 3 - 0.5);
    const auto evals = event_values(f.dir / "chat/log.jsonl", "eval", "loss");
    ASSERT_EQ(evals.size(), 2u);
    EXPECT_TRUE(std::isfinite(evals[1]));
    EXPECT_TRUE(Contains(read_file(f.dir / "chat/log.jsonl"), "trained tokens of the whole eval pass"));
    EXPECT_EQ(event_values(f.dir / "chat/log.jsonl", "dataset", "chunks").size(), 2u);
    EXPECT_TRUE(Contains(read_file(f.dir / "chat/log.jsonl"), R"("packed":{"document_tokens":)"));

    // --document-masking=off on the same files: the token stream as before, another run
    auto off = run_command(kLimit + f.base_cmd("chat-off") + " --train-file=" + train + " --eval-file=" + eval +
                           " --steps=3 --eval-every-n-steps=0 --document-masking=off");
    ASSERT_EQ(off.exit_code, 0) << off.output;
    EXPECT_FALSE(Contains(off.output, "packed with document masking")) << off.output;
    EXPECT_NE(step_losses(f.dir / "chat-off/log.jsonl")[0], losses[0]);
}

// Files without document starts: --document-masking=on cuts documents after each EOS token (the
// fixture's eos_token_id is 0, which its stream holds); a file with no EOS at all still trains, cut
// into pieces of --seq-len.
TEST(TrainCliPacking, FilesWithoutDocumentStartsPackAtEosOrInPieces) {
    Fixture f;
    auto r = run_command(kLimit + f.base_cmd("eos") + " --steps=4 --eval-every-n-steps=4 --document-masking=on");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(Contains(r.output, "[Setup] train data packed with document masking")) << r.output;
    EXPECT_TRUE(Contains(r.output, "(given on)")) << r.output;

    std::vector<int32_t> tokens = make_tokens(20000, 9);
    for (int32_t& t : tokens) t = t == 0 ? 7 : t;
    const std::string no_eos = f.dir / "no-eos.bin";
    write_token_file(no_eos, tokens, kVocab);
    auto p = run_command(kLimit + f.base_cmd("pieces") + " --train-file=" + no_eos +
                         " --steps=2 --eval-every-n-steps=0 --document-masking=on --loss-normalization=micro-batch");
    ASSERT_EQ(p.exit_code, 0) << p.output;
    EXPECT_TRUE(Contains(p.output, "1 documents into 313 rows of 64 tokens")) << p.output;  // ceil(20000 / 64)
    EXPECT_TRUE(Contains(p.output, "1 documents longer than --seq-len split")) << p.output;
    EXPECT_TRUE(Contains(p.output, "loss normalised over each micro-batch")) << p.output;
}

// The default on plain token files (auto: no document starts, so off) is the path of before:
// bit-identical to --document-masking=off --loss-normalization=micro-batch, losses and weights.
TEST(TrainCliPacking, DefaultOnPlainFilesIsBitIdenticalToOff) {
    Fixture f;
    const std::string common = " --steps=5 --eval-every-n-steps=5";
    auto a = run_command(kLimit + f.base_cmd("default") + common);
    auto b = run_command(kLimit + f.base_cmd("off") + common + " --document-masking=off --loss-normalization=micro-batch");
    ASSERT_EQ(a.exit_code, 0) << a.output;
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_FALSE(Contains(a.output, "document masking")) << a.output;
    EXPECT_EQ(step_losses(f.dir / "default/log.jsonl"), step_losses(f.dir / "off/log.jsonl"));
    EXPECT_EQ(event_values(f.dir / "default/log.jsonl", "eval", "loss"), event_values(f.dir / "off/log.jsonl", "eval", "loss"));
    EXPECT_EQ(file_bytes(f.dir / "default/model.safetensors"), file_bytes(f.dir / "off/model.safetensors"));
}

// Token normalisation divides by the trained tokens of the whole step over all ranks, and the ranks'
// gradients are summed: 2 ranks with accumulation 2 equal 1 rank with accumulation 4 (the same rows in
// the same global order; only the order of the additions differs).
TEST(TrainCliPacking, TokenNormalisationOverRanksEqualsOneRank) {
    Fixture f;
    const std::string train = write_chat_file(f, "chat.bin", 5, 300);
    const std::string common = " --train-file=" + train + " --steps=4 --eval-every-n-steps=0 --grad-clip=0.3";
    auto one = run_command(kLimit + f.base_cmd("one") + common + " --grad-accumulation=4");
    auto two = run_command(kLimit + f.base_cmd("two") + common + " --grad-accumulation=2 --gpus=2");
    ASSERT_EQ(one.exit_code, 0) << one.output;
    ASSERT_EQ(two.exit_code, 0) << two.output;
    const auto la = step_losses(f.dir / "one/log.jsonl"), lb = step_losses(f.dir / "two/log.jsonl");
    const auto na = event_values(f.dir / "one/log.jsonl", "step", "norm"),
               nb = event_values(f.dir / "two/log.jsonl", "step", "norm");
    ASSERT_EQ(la.size(), 4u);
    ASSERT_EQ(lb.size(), 4u);
    for (int s = 0; s < 4; ++s) {
        EXPECT_NEAR(lb[s], la[s], 1e-6 * std::abs(la[s])) << "step " << s;
        EXPECT_NEAR(nb[s], na[s], 1e-5 * std::abs(na[s])) << "step " << s;
    }
}

// Rows replace chunks in the loader's state: --continue from a checkpoint of a packed run reproduces
// the uninterrupted run bit for bit (losses and weights), on one rank and on two.
TEST(TrainCliPacking, ContinueReproducesThePackedRunExactly) {
    Fixture f;
    const std::string train = write_chat_file(f, "chat.bin", 6, 300);
    expect_continue_reproduces_full_run(f, "cpu", " --train-file=" + train);
    Fixture g;
    const std::string train2 = write_chat_file(g, "chat.bin", 7, 300);
    expect_continue_reproduces_full_run(g, "cpu", " --train-file=" + train2 + " --gpus=2 --grad-accumulation=1", kLimit);
}

TEST(TrainCliPacking, BadValuesAreNamed) {
    Fixture f;
    for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
             {"--document-masking", "yes"}, {"--loss-normalization", "mean"}}) {
        auto r = run_command(f.base_cmd("x") + " --steps=1 " + flag + "=" + value);
        EXPECT_NE(r.exit_code, 0) << r.output;
        EXPECT_TRUE(Contains(r.output, flag)) << r.output;
        EXPECT_TRUE(Contains(r.output, value)) << r.output;
        EXPECT_FALSE(Contains(r.output, "[T] step")) << r.output;
    }
}
