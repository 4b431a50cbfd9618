// elastic::choose_data_plane: NCCL where every member has a GPU of its own, host-staged (saying
// why) otherwise, and an explicit "nccl" refused rather than quietly host-staged.
#include "elastic/data_plane.h"

#include <gtest/gtest.h>

namespace troupe::elastic {
namespace {

const MemberDevice kGpuA{"GPU-aaaa"}, kGpuB{"GPU-bbbb"}, kGpuC{"GPU-cccc"}, kCpu{""};

TEST(DataPlane, AutoPicksTheDevicePlaneWhenEveryMemberHasItsOwnGpu) {
  PlaneChoice c = choose_data_plane("auto", {kGpuA, kGpuB, kGpuC});
  EXPECT_EQ(c.plane, DataPlane::device);
  EXPECT_FALSE(c.refused);
  EXPECT_NE(c.why.find("every member on a GPU of its own"), std::string::npos) << c.why;
  EXPECT_EQ(choose_data_plane("", {kGpuA}).plane, DataPlane::device);  // (an older spec)
  EXPECT_EQ(choose_data_plane("nccl", {kGpuA}).plane, DataPlane::device);
}

TEST(DataPlane, MembersSharingAGpuGoHostStagedUnderAutoAndAreRefusedUnderNccl) {
  PlaneChoice a = choose_data_plane("auto", {kGpuA, kGpuB, kGpuA});
  EXPECT_EQ(a.plane, DataPlane::host_staged);
  EXPECT_FALSE(a.refused);
  EXPECT_NE(a.why.find("ranks 0 and 2 share one GPU (GPU-aaaa"), std::string::npos) << a.why;
  PlaneChoice n = choose_data_plane("nccl", {kGpuA, kGpuA});
  EXPECT_TRUE(n.refused);
  EXPECT_EQ(n.plane, DataPlane::host_staged);
  EXPECT_NE(n.why.find("parallel.backend = \"nccl\", and ranks 0 and 1 share"), std::string::npos)
      << n.why;
}

TEST(DataPlane, ACpuMemberKeepsEveryoneHostStaged) {
  PlaneChoice a = choose_data_plane("auto", {kGpuA, kCpu});
  EXPECT_EQ(a.plane, DataPlane::host_staged);
  EXPECT_NE(a.why.find("rank 1 computes on the CPU"), std::string::npos) << a.why;
  EXPECT_TRUE(choose_data_plane("nccl", {kCpu}).refused);
  EXPECT_EQ(choose_data_plane("auto", {kCpu, kCpu}).plane, DataPlane::host_staged);
}

TEST(DataPlane, UcxIsAlwaysHostStaged) {
  PlaneChoice c = choose_data_plane("ucx", {kGpuA, kGpuB});
  EXPECT_EQ(c.plane, DataPlane::host_staged);
  EXPECT_FALSE(c.refused);
}

}  // namespace
}  // namespace troupe::elastic
