// attn/train/ring_all_reduce.hpp's RingSchedule without MPI (part of test_data_parallel, so each
// rank runs it alone): every rank's schedule played on one process, all ranks at once, sums every
// element once for any size, rank count and piece; and sizes whose chunks would not fit one MPI
// message are refused from the size alone, before any buffer of that size exists.
#include <gtest/gtest.h>
#include <mpi.h>

#include <attn/train/ring_all_reduce.hpp>

#include <limits>
#include <string>
#include <vector>

namespace attn {
namespace {

// Plays the schedules of `ranks` ranks step by step and message by message: each rank sends its
// message to the right neighbour, which adds it (reduce-scatter) or copies it (all-gather).
// Checks that every message sent meets one of the same size posted to receive it.
void play(std::vector<std::vector<double>>& data, Index piece) {
  const int ranks = static_cast<int>(data.size());
  const auto n = static_cast<Index>(data[0].size());
  std::vector<RingSchedule> rings;
  for (int r = 0; r < ranks; ++r) rings.emplace_back(n, r, ranks, piece);
  for (int s = 0; s < rings[0].steps(); ++s) {
    for (int r = 1; r < ranks; ++r) ASSERT_EQ(rings[r].messages(s), rings[0].messages(s)) << s;
    for (int k = 0; k < rings[0].messages(s); ++k) {
      std::vector<std::vector<double>> sent(static_cast<std::size_t>(ranks));
      for (int r = 0; r < ranks; ++r) {
        const RingMessage m = rings[r].message(s, k);
        const double* from = data[r].data() + m.send_begin;
        sent[rings[r].right()].assign(from, from + m.send_count);
      }
      for (int r = 0; r < ranks; ++r) {
        const RingMessage m = rings[r].message(s, k);
        const std::vector<double>& arrived = sent[r];
        ASSERT_EQ(static_cast<int>(arrived.size()), m.recv_count) << "step " << s << " rank " << r;
        for (int j = 0; j < m.recv_count; ++j) {
          double& mine = data[r][static_cast<std::size_t>(m.recv_begin + j)];
          mine = m.adds ? arrived[j] + mine : arrived[j];
        }
      }
    }
  }
}

TEST(RingSchedule, PlayedForEveryRankAtOnceItSumsEveryElementOnceForAnySizeAndPiece) {
  for (int ranks : {1, 2, 3, 4, 7})
    for (Index n : {0, 1, 2, 3, 6, 7, 64, 1001})
      for (Index piece : {1, 3, 1000}) {
        SCOPED_TRACE(std::to_string(ranks) + " ranks, n " + std::to_string(n) + ", piece " +
                     std::to_string(piece));
        std::vector<std::vector<double>> data(static_cast<std::size_t>(ranks));
        std::vector<double> sum(static_cast<std::size_t>(n), 0.0);
        for (int r = 0; r < ranks; ++r)
          for (Index i = 0; i < n; ++i) {
            const double v = (r + 1) * 1000.0 + static_cast<double>(i);  // exact sums
            data[r].push_back(v);
            sum[static_cast<std::size_t>(i)] += v;
          }
        play(data, piece);
        for (int r = 0; r < ranks; ++r) EXPECT_EQ(data[r], sum) << "rank " << r;
        // The chunks cover [0, n) in order.
        const RingSchedule ring(n, 0, ranks, piece);
        Index covered = 0;
        for (int c = 0; c < ranks; ++c) {
          EXPECT_EQ(ring.begin(c), covered);
          covered += ring.count(c);
        }
        EXPECT_EQ(covered, n);
        // The scratch one arriving piece needs.
        EXPECT_GE(ring_scratch_values(n, ranks, piece), std::min(piece, (n + ranks - 1) / ranks));
      }
}

TEST(RingSchedule, SizesWhoseChunksExceedOneMessageAreRefusedFromTheSizeAlone) {
  constexpr Index kIntMax = std::numeric_limits<int>::max();
  // On 2 ranks a chunk holds n / 2 + 1 values at most: 2^32 - 4 values fit, 2^32 do not.
  EXPECT_TRUE(ring_chunks_fit(2 * kIntMax - 2, 2));
  EXPECT_FALSE(ring_chunks_fit(2 * kIntMax, 2));
  EXPECT_FALSE(ring_chunks_fit(Index{1} << 32, 2));
  EXPECT_TRUE(ring_chunks_fit(Index{1} << 32, 3));
  // One rank sends nothing: its sum is the values as they are, however many (it used to refuse
  // 2^31 - 1 values and more).
  EXPECT_TRUE(ring_chunks_fit(std::numeric_limits<Index>::max(), 1));
  const RingSchedule alone(Index{1} << 40, 0, 1);
  EXPECT_EQ(alone.steps(), 0);
  // A gradient of 2^32 values (16 GiB of float) is refused without a buffer of that size.
  try {
    const RingSchedule ring(Index{1} << 32, 0, 2);
    ADD_FAILURE() << "a schedule of 2^32 values on 2 ranks was made, " << ring.steps() << " steps";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("too large for one MPI message"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace attn
