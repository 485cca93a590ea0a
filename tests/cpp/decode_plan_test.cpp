// The split-KV plan of the decode ops (src/plan/decode_plan.h): shapes and the SM count only,
// one CTA per SM, whole waves, a small cost per split.
#include "plan/decode_plan.h"

#include <gtest/gtest.h>

#include <cstdint>

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
  EXPECT_EQ(splits_for(67, 1, 16), 7);   // 67 CTAs would leave half the SMs idle
  EXPECT_EQ(splits_for(100, 1, 16), 5);
  EXPECT_EQ(splits_for(200, 1, 16), 5);  // 1000 CTAs in 8 waves: 0.95 busy (1 split: 0.76)
  EXPECT_FALSE(plan_dense_decode(200, 1, 16, 132).balanced);
}

// Where one split per request is the best uniform plan, the grid gets kBalancedSplits splits
// and the device picks 1 or 2 per request from the lengths (split_common.cuh).
TEST(DecodePlan, BalancedWhenTheRequestsFillTheGpu) {
  for (const DenseDecodePlan plan : {plan_dense_decode(128, 1, 64, 132),   // 128 CTAs
                                     plan_dense_decode(64, 2, 128, 132),   // 256 CTAs: two waves
                                     plan_dense_decode(128, 2, 128, 132),  // PERF.md's D3
                                     plan_dense_decode(kMaxBalancedBatch, 1, 16, 132),
                                     plan_dense_decode(256, 2, 128, 132)}) {  // kMaxBalancedRows
    EXPECT_TRUE(plan.balanced);
    EXPECT_EQ(plan.splits, kBalancedSplits);
  }
  // Every CTA reads all seq_lens: larger batches keep one split; so do plans whose partial
  // rows would take more than kMaxBalancedRows rows' worth of workspace.
  for (const DenseDecodePlan plan : {plan_dense_decode(kMaxBalancedBatch + 1, 1, 16, 132),
                                     plan_dense_decode(1024, 4, 128, 132)}) {
    EXPECT_FALSE(plan.balanced);
    EXPECT_EQ(plan.splits, 1);
  }
  // The workspace holds both splits' partial rows and one count per request.
  EXPECT_EQ(decode_split_workspace_bytes(128, 2, 128, 512, 2),
            (size_t(2 * 128 * 2 * 128) * 513 * 4 + 128 * 4 + 255) / 256 * 256);
}

// A bound on the lengths keeps only the splits such requests fill: one per 64 keys (two where
// value halves share a tile); never more than the plan had, never fewer than one; 0 is none.
TEST(DecodePlan, ABoundOnTheLengthsTrimsUniformPlans) {
  const DenseDecodePlan d4_b1 = plan_dense_decode(1, 1, 16, 132);  // 128 splits
  EXPECT_EQ(bound_decode_splits(d4_b1, 4096, 1).splits, 64);
  EXPECT_EQ(bound_decode_splits(d4_b1, 4096, 2).splits, 128);
  EXPECT_EQ(bound_decode_splits(d4_b1, 4097, 1).splits, 65);
  EXPECT_EQ(bound_decode_splits(d4_b1, 1, 1).splits, 1);
  EXPECT_EQ(bound_decode_splits(d4_b1, 64, 2).splits, 2);
  EXPECT_EQ(bound_decode_splits(d4_b1, 0, 1).splits, 128);
  EXPECT_EQ(bound_decode_splits(d4_b1, 32768, 1).splits, 128);  // D5: every split has keys
  EXPECT_EQ(bound_decode_splits(d4_b1, INT64_MAX, 2).splits, 128);
  EXPECT_EQ(bound_decode_splits(plan_dense_decode(2, 1, 16, 132), 4096, 1).splits, 64);  // of 66
  EXPECT_EQ(bound_decode_splits(plan_dense_decode(4, 1, 16, 132), 4096, 1).splits, 33);
  // Balanced plans pick their splits per request on the device: kept.
  const DenseDecodePlan balanced = bound_decode_splits(plan_dense_decode(128, 1, 64, 132), 10, 1);
  EXPECT_TRUE(balanced.balanced);
  EXPECT_EQ(balanced.splits, kBalancedSplits);
}

// The bound a launch plans for: max_seq_len where it is below the block table's capacity
// (columns x page size, which bounds the lengths by contract), else the capacity; 0 only for an
// empty table without max_seq_len.
TEST(DecodePlan, TheLengthBoundIsTheTablesCapacityAtMost) {
  EXPECT_EQ(decode_length_bound(0, 64, 64), 4096);     // a table sized to D4's requests
  EXPECT_EQ(decode_length_bound(1000, 64, 64), 1000);
  EXPECT_EQ(decode_length_bound(10000, 64, 64), 4096);
  EXPECT_EQ(decode_length_bound(4096, 2560, 64), 4096);  // an engine's table for 163840 keys
  EXPECT_EQ(decode_length_bound(0, 2560, 64), 163840);
  EXPECT_EQ(decode_length_bound(0, 0, 64), 0);
  EXPECT_EQ(decode_length_bound(100, 0, 64), 100);
  EXPECT_EQ(bound_decode_splits(plan_dense_decode(1, 1, 16, 132), decode_length_bound(0, 2560, 64), 1).splits, 128);
}

TEST(DecodePlan, RowTilesFoldTokensAndHeads) {
  EXPECT_EQ(plan_dense_decode(3, 2, 63, 132).row_tiles, 2);  // 126 rows
  EXPECT_EQ(plan_dense_decode(3, 1, 16, 132).row_tiles, 1);
  EXPECT_LE(splits_for(1, 1, 1), kMaxDecodeSplits);
}

// 17..64 rows (Sq 2 or 4 x 16 heads): row tiles of 16 where one wave of them still splits every
// request in two or more (B <= 33 / 16 on 132 SMs) and the bound gives each at most the tiles
// asked; else the plan as given (bounded); 16 rows and fewer, balanced plans: as given.
TEST(DecodePlan, FewTilesOf17To64RowsTakeRowTilesOf16) {
  auto bounded = [](int64_t batch, int64_t sq, int64_t heads, int64_t bound) {
    return bound_decode_splits(plan_dense_decode(batch, sq, heads, 132), bound, 1);
  };
  const DenseDecodePlan d4 = latency_row_tiles(bounded(1, 2, 16, 4096), 1, 32, 4096, 132, 1);
  EXPECT_EQ(d4.rows_per_tile, kDecodeLatencyRowsPerTile);
  EXPECT_EQ(d4.row_tiles, 2);
  EXPECT_EQ(d4.splits, 64);  // one tile each
  const DenseDecodePlan d5 = latency_row_tiles(bounded(1, 2, 16, 32768), 1, 32, 32768, 132, 8);
  EXPECT_EQ(d5.row_tiles, 2);
  EXPECT_EQ(d5.splits, 66);  // 512 tiles: 8 each at most
  const DenseDecodePlan d5_kept = latency_row_tiles(bounded(1, 2, 16, 32768), 1, 32, 32768, 132, 7);
  EXPECT_EQ(d5_kept.row_tiles, 1);
  EXPECT_EQ(d5_kept.splits, 128);
  const DenseDecodePlan most = latency_row_tiles(bounded(33, 1, 20, 140), 33, 20, 140, 132, 2);  // rows 0..15, 16..19
  EXPECT_EQ(most.row_tiles, 2);
  EXPECT_EQ(most.splits, 2);
  const DenseDecodePlan more = latency_row_tiles(bounded(34, 2, 16, 140), 34, 32, 140, 132, 2);
  EXPECT_EQ(more.rows_per_tile, kDecodeRowsPerTile);
  EXPECT_EQ(more.row_tiles, 1);
  EXPECT_EQ(more.splits, 3);  // the bound's 3 tiles
  const DenseDecodePlan four = latency_row_tiles(bounded(2, 4, 16, 4096), 2, 64, 4096, 132, 4);
  EXPECT_EQ(four.row_tiles, 4);
  EXPECT_EQ(four.splits, 16);  // 4 tiles each
  EXPECT_EQ(latency_row_tiles(bounded(2, 4, 16, 4096), 2, 64, 4096, 132, 3).row_tiles, 1);
  EXPECT_EQ(latency_row_tiles(bounded(17, 4, 16, 140), 17, 64, 140, 132, 8).row_tiles, 1);  // 68 CTAs
  EXPECT_EQ(latency_row_tiles(bounded(1, 8, 16, 4096), 1, 128, 4096, 132, 8).rows_per_tile, kDecodeRowsPerTile);
  const DenseDecodePlan sixteen = latency_row_tiles(bounded(1, 1, 16, 4096), 1, 16, 4096, 132, 8);
  EXPECT_EQ(sixteen.row_tiles, 1);
  EXPECT_EQ(sixteen.splits, 64);
  EXPECT_TRUE(latency_row_tiles(plan_dense_decode(128, 2, 16, 132), 128, 32, 4096, 132, 8).balanced);
}

// The workspace is sized from the shape's plan (decode_workspace_bytes): a launch's plan, bounded
// and cut into row tiles, never has more splits; its row tiles cover the rows; a cut plan is one
// wave of at least two splits a request.
TEST(DecodePlan, RowTilesNeverOutgrowTheWorkspacesPlan) {
  constexpr int64_t kBounds[] = {1, 64, 1000, 4096, 32768, 163840};
  for (int64_t batch = 1; batch <= 70; ++batch) {
    for (const int64_t query_tokens : {1, 2, 3, 4, 8}) {
      for (const int64_t heads : {1, 3, 8, 16, 20, 32, 64}) {
        const int64_t rows = query_tokens * heads;
        const DenseDecodePlan shaped = plan_dense_decode(batch, query_tokens, heads, 132);
        for (const int64_t bound : kBounds) {
          for (const int64_t max_tiles : {2, 4, 8}) {
            const DenseDecodePlan plan =
                latency_row_tiles(bound_decode_splits(shaped, bound, 1), batch, rows, bound, 132, max_tiles);
            SCOPED_TRACE(::testing::Message() << "B " << batch << " Sq " << query_tokens << " Hq " << heads
                                              << " bound " << bound << " max tiles " << max_tiles);
            EXPECT_LE(plan.splits, shaped.splits);
            EXPECT_GE(plan.row_tiles * plan.rows_per_tile, rows);
            EXPECT_LT((plan.row_tiles - 1) * plan.rows_per_tile, rows);
            if (plan.rows_per_tile == kDecodeLatencyRowsPerTile) {
              EXPECT_TRUE(rows > kDecodeLatencyRowsPerTile && rows <= kDecodeRowsPerTile);
              EXPECT_LE(batch * plan.row_tiles * plan.splits, 132);
              EXPECT_GE(plan.splits, 2);
              EXPECT_FALSE(plan.balanced);
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace openmla
