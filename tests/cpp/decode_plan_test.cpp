// The split-KV plan of the decode ops (src/plan/decode_plan.h): shapes and the SM count only,
// one CTA per SM, whole waves, a small cost per split.
#include "plan/decode_plan.h"

#include <gtest/gtest.h>

namespace openmla {
namespace {

int64_t splits_for(int64_t batch, int64_t query_tokens, int64_t heads) {
  return plan_dense_decode(batch, query_tokens, heads, 132).splits;
}

TEST(DecodePlan, FillsOneWaveWhenTheRequestsDoNot) {
  EXPECT_EQ(splits_for(1, 1, 16), 128);  // one request: the whole GPU, capped at 128 splits
  EXPECT_EQ(splits_for(2, 1, 16), 66);
  EXPECT_EQ(splits_for(4, 1, 16), 33);
  EXPECT_EQ(splits_for(4, 4, 128), 4);   // 8 row tiles per request: 32 CTAs x 4
}

TEST(DecodePlan, SplitsOnlyForARealGain) {
  EXPECT_EQ(splits_for(128, 1, 64), 1);  // 128 CTAs: 0.97 of the SMs without a combine step
  EXPECT_EQ(splits_for(64, 2, 128), 1);  // 256 CTAs: two full waves
  EXPECT_EQ(splits_for(67, 1, 16), 7);   // 67 CTAs would leave half the SMs idle
  EXPECT_EQ(splits_for(100, 1, 16), 5);
  EXPECT_EQ(splits_for(200, 1, 16), 5);  // 1000 CTAs in 8 waves: 0.95 busy (1 split: 0.76)
}

TEST(DecodePlan, RowTilesFoldTokensAndHeads) {
  EXPECT_EQ(plan_dense_decode(3, 2, 63, 132).row_tiles, 2);  // 126 rows
  EXPECT_EQ(plan_dense_decode(3, 1, 16, 132).row_tiles, 1);
  EXPECT_LE(splits_for(1, 1, 1), kMaxDecodeSplits);
}

}  // namespace
}  // namespace openmla
