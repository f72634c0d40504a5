// preflight validate R: parse and check a recipe without estimating.
#include <cstdio>

#include "common.h"
#include "preflight/recipe/diagnostic.h"
#include "preflight/recipe/partition.h"
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
    // Layers in the framework's unit (a transformer layer is attention + MLP).
    std::printf("%s: valid (%lld layers, world %lld)\n", Shown(args->path).c_str(),
                static_cast<long long>(LayerCount(recipe->model.layers)), static_cast<long long>(recipe->world()));
    exit_code = static_cast<int>(ExitCode::kOk);
  });
}

}  // namespace preflight::cli
