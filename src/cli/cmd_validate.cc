// preflight validate R: parse and check a recipe without estimating.
#include <cstdio>

#include "common.h"
#include "preflight/recipe/diagnostic.h"
#include "verbs.h"

namespace preflight::cli {

void SetupValidate(CLI::App& command, int& exit_code) {
  auto args = std::make_shared<RecipeArgs>();
  AddRecipeArgs(command, *args);
  command.callback([args, &exit_code] {
    auto recipe = LoadRecipeOrReport(*args);
    if (!recipe) {
      exit_code = static_cast<int>(ExitCode::kBadInput);
      return;
    }
    std::printf("%s: valid (%zu layers, world %lld)\n", args->path.c_str(), recipe->model.layers.size(),
                static_cast<long long>(recipe->world()));
    exit_code = static_cast<int>(ExitCode::kOk);
  });
}

}  // namespace preflight::cli
