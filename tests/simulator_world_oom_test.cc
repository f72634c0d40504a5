// Hostile-input defect 5: a simulated rank that runs out of memory is a
// resource limit, reported as such (World::Run rethrows the bad_alloc;
// `simulate` exits 2 asking for a smaller --scale), not a numerical
// disagreement.
#include <new>

#include <gtest/gtest.h>

#include "world.h"

namespace preflight::sim::simulator_world_oom_test {
namespace {

TEST(HostileInput, Defect5OutOfMemoryOnARankIsAResourceError) {
  World world(4);
  EXPECT_THROW(world.Run([](Rank& rank) {
    if (rank.id() == 2) throw std::bad_alloc();
  }),
               std::bad_alloc);
}

}  // namespace
}  // namespace preflight::sim::simulator_world_oom_test
