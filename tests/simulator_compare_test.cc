// The agreement check: counted bytes against the planner, measured memory
// against the estimator, for small recipes where both claim exactness.
#include <gtest/gtest.h>

#include <string>

#include "preflight/recipe.h"
#include "preflight/sim.h"

namespace preflight {
namespace {

/// The default recipe through the parser with `sets`, scaled small.
Recipe Scaled(const std::vector<Override>& sets) {
  const LoadResult loaded = LoadRecipeFile(std::string(PREFLIGHT_SOURCE_DIR) + "/recipes/nam56r-h200.yaml", sets);
  EXPECT_TRUE(loaded.ok());
  ScaleOptions s;
  s.hidden = 16;
  s.head_dim = 4;
  s.ffn_hidden = 16;
  s.moe_ffn_hidden = 8;
  s.vocab = 40;
  s.seq_len = 8;
  return ScaleRecipe(*loaded.recipe, s);
}

const CommAgreement* Find(const SimComparison& c, const std::string& axis, const std::string& kind,
                          const std::string& pass, const std::string& what) {
  for (const CommAgreement& a : c.comm) {
    if (a.axis == axis && a.kind == kind && a.pass == pass && a.what == what) return &a;
  }
  return nullptr;
}

TEST(SimulatorCompare, DenseTpSpAgreesExactlyWithPlanner) {
  const Recipe r = Scaled({{"model.pattern", "AD"}});
  const SimulationReport rep = Simulate(r);
  for (int64_t rank = 0; rank < rep.ranks; ++rank) {
    const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64, rank);
    EXPECT_TRUE(c.numerics_ok);
    EXPECT_TRUE(c.comm_ok());
    EXPECT_TRUE(c.agrees());
    for (const CommAgreement& a : c.comm) {
      EXPECT_TRUE(a.exact) << a.what;
      EXPECT_TRUE(a.in_model && a.in_run) << a.axis << " " << a.kind << " " << a.pass << " " << a.what;
    }
    // X = s b h beta = 8 * 16 * 2 = 256 B; attention's backward AG (dy gather
    // + input re-gather) sends 2 * (t-1)/t X = 2 * 3/4 * 256 = 384 B.
    const CommAgreement* a = Find(c, "tp", "all_gather", "backward", "attention");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->measured_sent, 384);
    EXPECT_EQ(a->modeled_sent, 384);
  }
}

TEST(SimulatorCompare, PaddedMoeAgreesExactlyOnExpertAxes) {
  const Recipe r = Scaled({{"model.pattern", "AE"}, {"parallel.ep", "2"}, {"parallel.expert_tp", "2"},
                           {"model.moe.pad_to_capacity", "true"}});
  const SimulationReport rep = Simulate(r);
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64, 1);
  EXPECT_TRUE(c.comm_ok());
  // T = 2 tokens per rank, C = ceil(2 * 2 / 64 * 1.25) = 1: E * C = 64 rows of
  // 16 x 2 B = 2048 B per A2A buffer; (e-1)/e of it = 1024 B on the wire.
  const CommAgreement* d = Find(c, "ep", "all_to_all", "forward", "moe_dispatch");
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(d->exact);
  EXPECT_EQ(d->measured_sent, 1024);
  EXPECT_EQ(d->modeled_sent, 1024);
  // Expert-TP all-gather of the 64 received rows: (t_e - 1) x 2048 B.
  const CommAgreement* g = Find(c, "etp", "all_gather", "forward", "moe_experts");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->measured_sent, 2048);
  EXPECT_EQ(g->modeled_sent, 2048);
}

TEST(SimulatorCompare, DroplessRoutingBucketsAreInformational) {
  const Recipe r = Scaled({{"model.pattern", "AE"}, {"parallel.ep", "2"}});
  const SimulationReport rep = Simulate(r);
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64, 0);
  const CommAgreement* d = Find(c, "ep", "all_to_all", "forward", "moe_dispatch");
  ASSERT_NE(d, nullptr);
  EXPECT_FALSE(d->exact);
  const CommAgreement* counts = Find(c, "ep", "all_to_all", "forward", "moe_counts");
  ASSERT_NE(counts, nullptr);
  EXPECT_FALSE(counts->in_model);
  // Counts exchange: 32 local experts' int64 counts to the one other EP rank = 256 B.
  EXPECT_EQ(counts->measured_sent, 256);
  // Exact buckets still hold: the replicated-grad all-reduce over TP.
  const CommAgreement* rep_grads = Find(c, "tp", "all_reduce", "optimizer", "replicated_grads");
  ASSERT_NE(rep_grads, nullptr);
  EXPECT_TRUE(rep_grads->agrees);
}

TEST(SimulatorCompare, ACountThatDiffersIsADisagreement) {
  const Recipe r = Scaled({{"model.pattern", "AD"}});
  SimulationReport rep = Simulate(r);
  rep.per_rank[0].comm[0].bytes_sent += 2;  // one bf16 element too many
  const SimComparison c = CompareWithModels(r, rep, SimPrecision::kFp64, 0);
  EXPECT_FALSE(c.comm_ok());
  EXPECT_FALSE(c.agrees());
  rep = Simulate(r);
  rep.gradients[0].max_rel = 1e-6;  // a gradient off by more than fp64 tolerance
  EXPECT_FALSE(CompareWithModels(r, rep, SimPrecision::kFp64, 0).numerics_ok);
}

}  // namespace
}  // namespace preflight
