// Which CUDA device each rank uses (src/train/rank_devices.h): --gpu-ids, else rank r -> device r in
// threads mode and the local rank under mpirun.
#include <gtest/gtest.h>

#include "test_util.h"
#include "train/rank_devices.h"

using namespace qtrain;

TEST(RankDevices, GpuIdsParseOneIndexPerRank) {
    EXPECT_EQ(parse_gpu_ids("0"), (std::vector<int>{0}));
    EXPECT_EQ(parse_gpu_ids("3,1,0,2"), (std::vector<int>{3, 1, 0, 2}));
    EXPECT_EQ(parse_gpu_ids("0,0"), (std::vector<int>{0, 0}));  // two ranks on one device
    EXPECT_EQ(parse_gpu_ids("10,11"), (std::vector<int>{10, 11}));
}

TEST(RankDevices, BadGpuIdsNameTheFlagAndTheEntry) {
    for (const char* bad : {"", ",", "0,", ",1", "a", "1,b", "-1", "+1", " 1", "1 ", "1.5", "0x1", "9999999999"}) {
        SCOPED_TRACE(bad);
        EXPECT_ERROR(parse_gpu_ids(bad), "--gpu-ids=", "is not a device index", "comma-separated");
    }
}

TEST(RankDevices, CountMustBeTheNumberOfRanks) {
    check_gpu_ids_count({}, 4, "--gpus=4");  // not given: the default
    check_gpu_ids_count({0, 1}, 2, "--gpus=2");
    EXPECT_ERROR(check_gpu_ids_count({0, 1, 2}, 2, "--gpus=2"), "--gpu-ids lists 3 devices but the run has 2 ranks (--gpus=2)");
    EXPECT_ERROR(check_gpu_ids_count({0}, 3, "mpirun -np 3"), "lists 1 device but the run has 3 ranks (mpirun -np 3)");
}

TEST(RankDevices, DefaultIsTheRankInThreadsModeAndTheLocalRankUnderMpirun) {
    for (int r = 0; r < 4; ++r) EXPECT_EQ(rank_device_index({}, r, std::nullopt), r);
    EXPECT_EQ(rank_device_index({}, 5, 1), 1);  // rank 5, the second process on its node
    EXPECT_EQ(rank_device_index({2, 2, 0}, 1, std::nullopt), 2);
    EXPECT_EQ(rank_device_index({2, 2, 0}, 2, 7), 0);  // --gpu-ids wins over the local rank
}
