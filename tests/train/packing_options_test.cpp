// --document-masking and --loss-normalization resolved on the train files (train/packing_options.h),
// and the positions of rows given without them.
#include <gtest/gtest.h>

#include <vector>

#include "io/token_file.h"
#include "test_util.h"
#include "train/packing_options.h"

using namespace qtrain;
using qtrain::test::TempDir;

TEST(PackingOptions, AutoIsOnOnlyWhenEveryTrainFileRecordsDocumentStarts) {
    TempDir d;
    const std::string chat = d / "chat.bin", chat2 = d / "chat2.bin", text = d / "text.bin";
    const std::vector<int32_t> tokens = {3, 4, 5, 6, 7, 8};
    const std::vector<int64_t> starts = {0, 2};
    write_token_file(chat, tokens, 16, nullptr, &starts);
    write_token_file(chat2, tokens, 16, nullptr, &starts);
    write_token_file(text, tokens, 16);
    auto decide = [](const std::string& masking, const std::string& norm, const std::vector<std::string>& files) {
        TrainOptions o;
        o.document_masking = masking;
        o.loss_normalization = norm;
        return decide_packing(o, files);
    };
    EXPECT_TRUE(decide("auto", "auto", {chat, chat2}).document_masking);
    EXPECT_TRUE(decide("auto", "auto", {chat, chat2}).token_normalization);
    EXPECT_FALSE(decide("auto", "auto", {chat, text}).document_masking);
    EXPECT_FALSE(decide("auto", "auto", {chat, text}).token_normalization);
    EXPECT_FALSE(decide("auto", "auto", {}).document_masking);  // the Python session's own tokens
    EXPECT_TRUE(decide("on", "auto", {text}).document_masking);
    EXPECT_TRUE(decide("on", "auto", {text}).token_normalization);
    EXPECT_FALSE(decide("off", "auto", {chat}).document_masking);
    EXPECT_FALSE(decide("off", "auto", {chat}).token_normalization);
    EXPECT_TRUE(decide("off", "tokens", {chat}).token_normalization);
    EXPECT_FALSE(decide("on", "micro-batch", {chat}).token_normalization);
    EXPECT_EQ(TrainOptions().document_masking, "auto");
    EXPECT_EQ(TrainOptions().loss_normalization, "auto");
    // the model is told "on" by the table; auto is the engine's to resolve
    TrainOptions on;
    on.document_masking = "on";
    EXPECT_TRUE(on.model_options("cpu").document_masking);
    EXPECT_FALSE(TrainOptions().model_options("cpu").document_masking);
}

TEST(PackingOptions, PositionsRestartAfterEachEos) {
    const int eos = 9, T = 6;
    const std::vector<int32_t> inputs = {1, 2, 9, 3, 9, 9, /* row 2 */ 9, 4, 5, 6, 7, 8};
    std::vector<int32_t> pos(inputs.size(), -7);
    positions_after_eos(inputs.data(), 2, T, eos, pos.data());
    EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 2, 0, 1, 0, /* row 2 */ 0, 0, 1, 2, 3, 4}));
}
