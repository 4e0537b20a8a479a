// `train` with QTRAIN_TIME_BREAKDOWN=1 on the GPU prints the op timer's table once, after its steps and
// before the export (RankSession::finish), so a run stopped during the export (bench_qtrain.sh's stop
// after the timed steps) has it: session 24's breakdown runs lost the table, which the model's
// destructor printed after the export.
#include <gtest/gtest.h>

#include <string>

#include "gpu_test_util.h"
#include "train/train_cli_fixture.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::train_cli;

TEST(TrainCliTimeBreakdown, TableComesOnceBeforeTheExport) {
    QTRAIN_REQUIRE_GPU();
    Fixture f(kGpuShape);
    auto r = run_command("QTRAIN_TIME_BREAKDOWN=1 " + f.base_cmd("run", "cuda") + " --steps=3 --eval-every-n-steps=0");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::size_t table = r.output.find("[Time breakdown]");
    ASSERT_NE(table, std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("[Time breakdown]", table + 1), std::string::npos) << "printed twice:\n" << r.output;
    EXPECT_NE(r.output.find("idle or untimed", table), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("gemm fwd", table), std::string::npos) << r.output;
    // the export's message comes after the table
    const std::size_t exported = r.output.find("model exported in", table);
    EXPECT_NE(exported, std::string::npos) << "no export message after the table:\n" << r.output;
    // and without the variable: no table
    auto plain = run_command(f.base_cmd("plain", "cuda") + " --steps=2 --eval-every-n-steps=0");
    ASSERT_EQ(plain.exit_code, 0) << plain.output;
    EXPECT_EQ(plain.output.find("[Time breakdown]"), std::string::npos) << plain.output;
}
