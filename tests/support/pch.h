// The precompiled header every test shares (tests/CMakeLists.txt): the
// third-party and standard headers nearly every test includes, parsed once
// instead of once per test. Each test still includes what it uses.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
