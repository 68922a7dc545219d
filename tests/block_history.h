// The checks a block solve's progress calls and residual history must pass, on any backend
// (test_block_tridiagonal on the CPU, test_cuda_block on the GPU).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "trisolve/types.h"

namespace trisolve::testing {

// The history from iteration 0 (residual 1, within `first_tol`: y0 = 0) to the reported
// (iterations, residual), iterations increasing, at most `limit` points; the progress calls
// non-decreasing in iteration, the first at 0, none past the answer; with `points_are_calls`,
// every point of the history but the last one of the calls.
inline void ExpectHistoryConsistent(const std::vector<std::pair<int64_t, double>>& calls,
                                    const SolveInfo& info, int64_t limit, double first_tol,
                                    const std::string& what, bool points_are_calls) {
  SCOPED_TRACE(what + ": " + info.method);
  const auto& h = info.residual_history;
  ASSERT_GE(h.size(), 2u);
  EXPECT_LE(int64_t(h.size()), limit);
  EXPECT_EQ(h.front().iteration, 0);
  EXPECT_NEAR(h.front().residual, 1.0, first_tol);
  for (size_t i = 1; i < h.size(); ++i) EXPECT_GT(h[i].iteration, h[i - 1].iteration) << i;
  EXPECT_EQ(h.back().iteration, info.iterations);
  EXPECT_EQ(h.back().residual, info.residual);
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.front().first, 0);
  for (size_t i = 1; i < calls.size(); ++i) EXPECT_GE(calls[i].first, calls[i - 1].first) << i;
  EXPECT_LE(calls.back().first, info.iterations);
  for (size_t i = 0; points_are_calls && i + 1 < h.size(); ++i) {
    bool found = false;
    for (const auto& [it, res] : calls) found |= it == h[i].iteration && res == h[i].residual;
    EXPECT_TRUE(found) << "history point " << i << " at iteration " << h[i].iteration;
  }
}

}  // namespace trisolve::testing
