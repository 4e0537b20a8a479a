// DataLoader packing (--document-masking): documents from document starts or EOS tokens, greedy rows,
// splits, padding, fill rate, positions; shuffle, resume and the ranks' global order over rows; the
// step's valid-target count every rank makes alike.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <set>

#include "core/error.h"
#include "io/token_file.h"
#include "test_util.h"
#include "train/data_loader.h"

using namespace qtrain;
using qtrain::test::TempDir;

namespace {

constexpr int kVocab = 1000;

struct Doc {
    int64_t begin, length;
};

// A token file of documents of the given lengths: random tokens (never `avoid`), random masks, and
// document starts when `starts`. Returns the tokens and masks too.
struct MadeFile {
    std::string path;
    std::vector<int32_t> tokens;
    std::vector<uint8_t> mask;
    std::vector<Doc> docs;
};

MadeFile make_docs(const TempDir& dir, const std::string& name, const std::vector<int>& lengths, uint64_t seed,
                   bool starts = true, int avoid = -1) {
    MadeFile m;
    m.path = dir / name;
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::vector<int64_t> start_list;
    for (int L : lengths) {
        m.docs.push_back({static_cast<int64_t>(m.tokens.size()), L});
        start_list.push_back(static_cast<int64_t>(m.tokens.size()));
        for (int j = 0; j < L; ++j) {
            int32_t t;
            do t = static_cast<int32_t>(rng() % kVocab);
            while (t == avoid);
            m.tokens.push_back(t);
            m.mask.push_back(static_cast<uint8_t>(rng() % 4 != 0));  // a quarter masked out
        }
    }
    write_token_file(m.path, m.tokens, kVocab, &m.mask, starts ? &start_list : nullptr);
    return m;
}

// The expected contents of one packed row: the pieces (begin, length) of file `f`, then padding.
void expect_row(const MadeFile& f, const std::vector<Doc>& pieces, const int32_t* in, const int32_t* tgt,
                const int32_t* pos, int T, int pad_token) {
    int t = 0;
    for (const Doc& p : pieces)
        for (int64_t j = 0; j < p.length; ++j, ++t) {
            SCOPED_TRACE("slot " + std::to_string(t));
            ASSERT_LT(t, T);
            EXPECT_EQ(in[t], f.tokens[p.begin + j]);
            const bool last = j + 1 == p.length;
            EXPECT_EQ(tgt[t], !last && f.mask[p.begin + j + 1] ? f.tokens[p.begin + j + 1] : -1);
            EXPECT_EQ(pos[t], j);
        }
    for (int j = 0; t < T; ++t, ++j) {  // padding: its own document without loss
        EXPECT_EQ(in[t], pad_token);
        EXPECT_EQ(tgt[t], -1);
        EXPECT_EQ(pos[t], j);
    }
}

Packing packing(int eos) {
    Packing p;
    p.enabled = true;
    p.eos_token_id = eos;
    return p;
}

}  // namespace

// Rows (T = 8) of documents 5, 3, 7, 2, 12: [5 3] [7 pad] [2 pad] [8 of 12] [4 of 12, pad].
TEST(DataLoaderPacking, DocumentStartsPackGreedilyWithSplitsAndPadding) {
    TempDir d;
    const int T = 8, eos = 17;
    const MadeFile f = make_docs(d, "chat.bin", {5, 3, 7, 2, 12}, 11);
    DataLoader dl({f.path}, 1, T, 0, false, kVocab, "--train-file", packing(eos));
    ASSERT_EQ(dl.num_chunks(), 5);
    const PackStats& s = dl.pack_stats();
    EXPECT_EQ(s.documents, 5);
    EXPECT_EQ(s.split_documents, 1);
    EXPECT_EQ(s.rows, 5);
    EXPECT_EQ(s.document_tokens, 29);
    EXPECT_DOUBLE_EQ(s.fill_rate(T), 29.0 / 40.0);
    int64_t trained = 0;  // targets inside a piece, mask bit 1
    const std::vector<std::vector<Doc>> rows = {{{0, 5}, {5, 3}}, {{8, 7}}, {{15, 2}}, {{17, 8}}, {{25, 4}}};
    for (const auto& row : rows)
        for (const Doc& p : row)
            for (int64_t j = 1; j < p.length; ++j) trained += f.mask[p.begin + j];
    EXPECT_EQ(s.trained_targets, trained);
    std::vector<int32_t> in, tgt, pos;
    for (std::size_t r = 0; r < rows.size(); ++r) {
        SCOPED_TRACE("row " + std::to_string(r));
        ASSERT_TRUE(dl.next_batch_no_wrap(in, tgt, &pos));
        ASSERT_EQ(pos.size(), static_cast<std::size_t>(T));
        expect_row(f, rows[r], in.data(), tgt.data(), pos.data(), T, eos);
    }
    EXPECT_FALSE(dl.next_batch_no_wrap(in, tgt, &pos));
}

// --packing=one-per-row: the same documents, each in a row of its own (pieces of a long one too).
TEST(DataLoaderPacking, OnePerRowGivesEveryDocumentItsOwnRow) {
    TempDir d;
    const int T = 8, eos = 17;
    const MadeFile f = make_docs(d, "chat.bin", {5, 3, 7, 2, 12}, 11);
    Packing p = packing(eos);
    p.one_per_row = true;
    DataLoader dl({f.path}, 1, T, 0, false, kVocab, "--train-file", p);
    const std::vector<std::vector<Doc>> rows = {{{0, 5}}, {{5, 3}}, {{8, 7}}, {{15, 2}}, {{17, 8}}, {{25, 4}}};
    ASSERT_EQ(dl.num_chunks(), static_cast<int64_t>(rows.size()));
    EXPECT_EQ(dl.pack_stats().document_tokens, 29);
    EXPECT_DOUBLE_EQ(dl.pack_stats().fill_rate(T), 29.0 / 48.0);
    std::vector<int32_t> in, tgt, pos;
    for (std::size_t r = 0; r < rows.size(); ++r) {
        SCOPED_TRACE("row " + std::to_string(r));
        ASSERT_TRUE(dl.next_batch_no_wrap(in, tgt, &pos));
        expect_row(f, rows[r], in.data(), tgt.data(), pos.data(), T, eos);
    }
}

// Without document starts a document ends after each EOS token; without EOS either, the file is one
// document cut into pieces of seq_len.
TEST(DataLoaderPacking, EosEndsDocumentsInFilesWithoutStarts) {
    TempDir d;
    const int T = 6, eos = 999;
    MadeFile f = make_docs(d, "text.bin", {4, 2, 5, 3}, 5, /*starts=*/false, eos);
    for (const Doc& doc : f.docs) f.tokens[doc.begin + doc.length - 1] = eos;  // each document ends with EOS
    write_token_file(f.path, f.tokens, kVocab, &f.mask);
    DataLoader dl({f.path}, 2, T, 0, false, kVocab, "--train-file", packing(eos));
    EXPECT_EQ(dl.pack_stats().documents, 4);
    EXPECT_EQ(dl.pack_stats().split_documents, 0);
    ASSERT_EQ(dl.num_chunks(), 3);  // [4 2] [5 pad] [3 pad]
    std::vector<int32_t> in, tgt, pos;
    ASSERT_TRUE(dl.next_batch_no_wrap(in, tgt, &pos));
    expect_row(f, {{0, 4}, {4, 2}}, in.data(), tgt.data(), pos.data(), T, eos);
    expect_row(f, {{6, 5}}, in.data() + T, tgt.data() + T, pos.data() + T, T, eos);
    ASSERT_TRUE(dl.next_batch_no_wrap(in, tgt, &pos));
    expect_row(f, {{11, 3}}, in.data(), tgt.data(), pos.data(), T, eos);
    // the final batch's missing row: padding, one document at 0..T-1 without loss
    for (int t = 0; t < T; ++t) {
        EXPECT_EQ(tgt[T + t], -1);
        EXPECT_EQ(pos[T + t], t);
    }

    // no EOS in the file (the model has none, or the text never has it): pieces of seq_len
    const MadeFile g = make_docs(d, "plain.bin", {15}, 6, /*starts=*/false, eos);
    DataLoader one({g.path}, 1, T, 0, false, kVocab, "--train-file", packing(eos));
    EXPECT_EQ(one.pack_stats().documents, 1);
    EXPECT_EQ(one.pack_stats().split_documents, 1);
    ASSERT_EQ(one.num_chunks(), 3);
    for (const Doc& piece : std::vector<Doc>{{0, 6}, {6, 6}, {12, 3}}) {
        ASSERT_TRUE(one.next_batch_no_wrap(in, tgt, &pos));
        expect_row(g, {piece}, in.data(), tgt.data(), pos.data(), T, eos);
    }
}

// Rows, not chunks, are shuffled: each once per epoch, in an order that resumes exactly from the state;
// packing off leaves positions empty.
TEST(DataLoaderPacking, ShuffledRowsResumeExactly) {
    TempDir d;
    std::mt19937 rng(3);
    std::vector<int> lengths;
    for (int i = 0; i < 60; ++i) lengths.push_back(1 + static_cast<int>(rng() % 20));
    const MadeFile f = make_docs(d, "a.bin", lengths, 9);
    const int T = 16, B = 3;
    DataLoader a({f.path}, B, T, 21, true, kVocab, "--train-file", packing(-1));
    const int64_t rows = a.num_chunks();
    ASSERT_GT(rows, 2 * B);
    std::vector<int32_t> in, tgt, pos, in2, tgt2, pos2;
    // one epoch's rows (as their first token and position layout) are each row once
    std::multiset<std::vector<int32_t>> seen, all;
    DataLoader plain({f.path}, 1, T, 0, false, kVocab, "--train-file", packing(-1));
    while (plain.next_batch_no_wrap(in, tgt, &pos)) {
        std::vector<int32_t> key(in);
        key.insert(key.end(), pos.begin(), pos.end());
        all.insert(key);
    }
    DataLoader one_row({f.path}, 1, T, 21, true, kVocab, "--train-file", packing(-1));
    for (int64_t r = 0; r < rows; ++r) {
        one_row.next_batch(in, tgt, &pos);
        std::vector<int32_t> key(in);
        key.insert(key.end(), pos.begin(), pos.end());
        seen.insert(key);
    }
    EXPECT_EQ(seen, all);
    for (int i = 0; i < 25; ++i) a.next_batch(in, tgt, &pos);  // crosses epoch boundaries
    ASSERT_GE(a.state().epoch, 1);
    DataLoader b({f.path}, B, T, 21, true, kVocab, "--train-file", packing(-1));
    b.set_state(a.state());
    for (int i = 0; i < 30; ++i) {
        a.next_batch(in, tgt, &pos);
        b.next_batch(in2, tgt2, &pos2);
        ASSERT_EQ(in, in2);
        ASSERT_EQ(tgt, tgt2);
        ASSERT_EQ(pos, pos2);
    }
    DataLoader unpacked({f.path}, B, T, 21, true, kVocab, "--train-file");
    pos.assign(3, 1);
    unpacked.next_batch(in, tgt, &pos);
    EXPECT_TRUE(pos.empty());
}

// Data parallel: every rank walks the same rows; micro-batch j of rank r is micro-batch j * W + r of
// one rank with W x the accumulation, positions included. valid_targets_ahead counts exactly the
// targets of the step's micro-batches of all ranks, on every rank alike, and consumes nothing.
TEST(DataLoaderPacking, RanksShareOneGlobalOrderAndCountTheStepAlike) {
    TempDir d;
    std::mt19937 rng(8);
    std::vector<int> lengths;
    for (int i = 0; i < 45; ++i) lengths.push_back(1 + static_cast<int>(rng() % 12));
    const MadeFile f = make_docs(d, "a.bin", lengths, 4);
    const int T = 8, B = 2, A = 3;
    for (int W : {1, 2, 3}) {
        SCOPED_TRACE("world " + std::to_string(W));
        DataLoader one({f.path}, B, T, 7, true, kVocab, "--train-file", packing(-1));
        std::vector<std::unique_ptr<DataLoader>> ranks;
        for (int r = 0; r < W; ++r) {
            ranks.push_back(std::make_unique<DataLoader>(std::vector<std::string>{f.path}, B, T, 7, true, kVocab,
                                                         "--train-file", packing(-1)));
            ranks.back()->set_rank(r, W);
        }
        std::vector<int32_t> tgt, rin, rtgt, rpos;
        for (int step = 0; step < 12; ++step) {
            std::vector<int64_t> counted;
            for (auto& rank : ranks) counted.push_back(rank->valid_targets_ahead(A));
            const DataLoaderState before = ranks[0]->state();
            std::vector<std::vector<int32_t>> single(A * W), single_pos(A * W);
            int64_t valid = 0;
            for (int m = 0; m < A * W; ++m) {
                one.next_batch(single[m], tgt, &single_pos[m]);
                for (int32_t t : tgt) valid += t >= 0;
            }
            for (int r = 0; r < W; ++r) EXPECT_EQ(counted[r], valid) << "rank " << r;
            EXPECT_EQ(before.epoch, ranks[0]->state().epoch);
            EXPECT_EQ(before.position, ranks[0]->state().position);
            for (int r = 0; r < W; ++r)
                for (int j = 0; j < A; ++j) {
                    ranks[r]->next_batch(rin, rtgt, &rpos);
                    ASSERT_EQ(rin, single[j * W + r]) << "step " << step << ", rank " << r;
                    ASSERT_EQ(rpos, single_pos[j * W + r]) << "step " << step << ", rank " << r;
                }
            for (int r = 0; r < W; ++r) EXPECT_EQ(ranks[r]->state().position, one.state().position);
        }
        EXPECT_GE(one.state().epoch, 1) << "the test must cross an epoch boundary";
    }
}

// Without packing the count is the chunks' unmasked targets, as next_batch gives them.
TEST(DataLoaderPacking, UnpackedStepCountMatchesTheBatches) {
    TempDir d;
    const MadeFile f = make_docs(d, "a.bin", {300}, 12, false);
    DataLoader dl({f.path}, 2, 10, 5, true, kVocab, "--train-file");
    std::vector<int32_t> in, tgt;
    for (int step = 0; step < 20; ++step) {
        const int64_t counted = dl.valid_targets_ahead(2);
        int64_t valid = 0;
        for (int m = 0; m < 2; ++m) {
            dl.next_batch(in, tgt);
            for (int32_t t : tgt) valid += t >= 0;
        }
        ASSERT_EQ(counted, valid) << "step " << step;
    }
}

// Every target masked is still refused with packing (nothing to train on).
TEST(DataLoaderPacking, AllMaskedIsAnError) {
    TempDir d;
    const std::string path = d / "m.bin";
    std::vector<int32_t> tok(40, 3);
    std::vector<uint8_t> mask(40, 0);
    std::vector<int64_t> starts = {0, 10, 20};
    write_token_file(path, tok, kVocab, &mask, &starts);
    EXPECT_THROW(DataLoader({path}, 1, 8, 0, true, kVocab, "--train-file", packing(-1)), Error);
}
