#include "common.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

#include <fmt/format.h>

#include "preflight/recipe/diagnostic.h"
#include "preflight/planner/plan.h"

namespace preflight::cli {

std::optional<std::string> ReadInputFile(const std::string& path, int64_t max_bytes) {
  std::ifstream file;
  std::istream* in = &std::cin;
  if (path != "-") {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (ec || !std::filesystem::exists(status)) {
      std::fprintf(stderr, "%s: cannot read the file: no such file\n", Shown(path).c_str());
      return std::nullopt;
    }
    if (!std::filesystem::is_regular_file(status)) {
      std::fprintf(stderr, "%s: not a regular file (a directory, device or FIFO); give a file, or - for stdin\n",
                   Shown(path).c_str());
      return std::nullopt;
    }
    file.open(path, std::ios::binary);
    if (!file) {
      std::fprintf(stderr, "%s: cannot read the file: permission denied or unreadable\n", Shown(path).c_str());
      return std::nullopt;
    }
    in = &file;
  }
  // One byte past the bound tells a file that is too large, without reading it all.
  std::string text(static_cast<size_t>(max_bytes + 1), '\0');
  in->read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in->gcount()));
  if (static_cast<int64_t>(text.size()) > max_bytes) {
    std::fprintf(stderr, "%s: larger than %lld MiB; not an input preflight reads\n", Shown(path).c_str(),
                 static_cast<long long>(max_bytes >> 20));
    return std::nullopt;
  }
  return text;
}

CLI::Validator FiniteNumber() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          size_t used = 0;
          const double v = std::stod(text, &used);
          if (used == text.size() && std::isfinite(v)) return "";
        } catch (const std::exception&) {
        }
        return "expected a finite number, got '" + text + "'";
      },
      "FINITE");
}

void AddRecipeArgs(CLI::App& command, RecipeArgs& args) {
  command.add_option("recipe", args.path, "Recipe YAML file, or - to read it from stdin")->required();
  command.add_option("--set", args.sets, "Override a recipe key, e.g. --set parallel.tp=8 (repeatable)")
      ->type_name("KEY=VALUE");
}

std::optional<std::vector<Override>> ParseOverridesOrReport(const std::vector<std::string>& sets) {
  std::vector<Override> overrides;
  for (const auto& text : sets) {
    auto o = ParseOverride(text);
    if (!o) {
      std::fprintf(stderr, "--set %s: expected KEY.PATH=VALUE on one line, e.g. --set parallel.tp=8\n",
                   Shown(text).c_str());
      return std::nullopt;
    }
    overrides.push_back(*o);
  }
  return overrides;
}

std::optional<LoadResult> LoadRecipeFrom(const std::string& path, const std::vector<Override>& overrides) {
  if (path != "-") return LoadRecipeFile(path, overrides);
  // A recipe piped in (`import hf c.json | preflight fit -`); the parser
  // bounds its size as for a file.
  const std::optional<std::string> text = ReadInputFile("-");
  if (!text) return std::nullopt;
  return LoadRecipeFromString(*text, "<stdin>", overrides);
}

std::optional<Recipe> LoadRecipeOrReport(const RecipeArgs& args) {
  const auto overrides = ParseOverridesOrReport(args.sets);
  if (!overrides) return std::nullopt;
  std::optional<LoadResult> result = LoadRecipeFrom(args.path, *overrides);
  if (!result) return std::nullopt;
  for (const auto& d : result->diagnostics) std::fprintf(stderr, "%s\n", Format(d).c_str());
  return std::move(result->recipe);
}

StagePlan StagesFor(const Inventory& inventory, const Layout& layout) {
  PlanResult planned = MakePlan(inventory, layout);
  if (planned.plan) return planned.plan->stages;
  return PartitionStages(inventory, layout);
}

std::optional<Plan> PlanOrReport(const Inventory& inventory, const Layout& layout) {
  PlanResult planned = MakePlan(inventory, layout);
  for (const auto& d : planned.diagnostics) std::fprintf(stderr, "%s\n", Format(d).c_str());
  if (planned.plan) {
    for (const auto& d : planned.plan->warnings) std::fprintf(stderr, "%s\n", Format(d).c_str());
  }
  return std::move(planned.plan);
}

bool WriteTextFile(const std::string& path, const std::string& text, const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status link = fs::symlink_status(path, ec);
  const fs::file_status target_status = fs::status(path, ec);
  // A device or pipe (/dev/stdout, /dev/full) is written in place, and so is
  // anything under /dev (/dev/stdout links to whatever fd 1 is); any other
  // link is not written through.
  const bool device = (fs::exists(target_status) && !fs::is_regular_file(target_status)) || path.rfind("/dev/", 0) == 0;
  if (fs::is_symlink(link) && !device) {
    std::fprintf(stderr, "%s: a symbolic link; not written through it (give the target's own path)\n",
                 Shown(path).c_str());
    return false;
  }
  for (const std::string& input : inputs) {
    if (fs::exists(link) && fs::equivalent(path, input, ec)) {
      std::fprintf(stderr, "%s: is an input of this run (%s); not overwritten\n", Shown(path).c_str(),
                   Shown(input).c_str());
      return false;
    }
  }
  const auto fail = [&path](int error) {
    std::fprintf(stderr, "%s: cannot write: %s\n", Shown(path).c_str(), std::strerror(error));
    return false;
  };
  const auto write_all = [&text](std::FILE* f) {
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0;
    const int error = ok ? 0 : errno;
    return std::fclose(f) == 0 && ok ? 0 : (error != 0 ? error : errno);
  };
  // A file is written beside itself and renamed over, so a failed write
  // leaves the old file whole.
  if (device) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return fail(errno);
    const int error = write_all(f);
    return error == 0 || fail(error);
  }
  const fs::path target(path);
  fs::path temporary = target;
  temporary += fmt::format(".preflight-{}.tmp", static_cast<long>(getpid()));
  std::FILE* f = std::fopen(temporary.c_str(), "wb");
  if (f == nullptr) return fail(errno);
  const int error = write_all(f);
  if (error != 0) {
    fs::remove(temporary, ec);
    return fail(error);
  }
  fs::rename(temporary, target, ec);
  if (ec) {
    fs::remove(temporary, ec);
    return fail(ec.value());
  }
  return true;
}

void AddOutputOption(CLI::App& command, std::string& path) {
  command.add_option("-o,--out", path, "Write the output to FILE instead of stdout")->type_name("FILE");
}

bool EmitOutput(const std::string& path, const std::string& text, const std::vector<std::string>& inputs) {
  if (!path.empty()) return WriteTextFile(path, text, inputs);
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0) {
    std::fprintf(stderr, "standard output: cannot write: %s\n", std::strerror(errno));
    return false;
  }
  return true;
}

const char* Name(OutputFormat f) {
  switch (f) {
    case OutputFormat::kTable: return "table";
    case OutputFormat::kJson: return "json";
    case OutputFormat::kCsv: return "csv";
    case OutputFormat::kMd: return "md";
  }
  return "table";
}

void AddFormatOption(CLI::App& command, OutputFormat& format, const std::vector<OutputFormat>& allowed) {
  std::map<std::string, OutputFormat> names;
  std::string listed;  // "table, json": the command's formats, its default first
  for (OutputFormat f : allowed) {
    names[Name(f)] = f;
    listed += std::string(listed.empty() ? "" : ", ") + Name(f);
  }
  format = allowed.front();
  // A plain message on a bad value ("expected one of table, json"), not the
  // transformer's internal mapping.
  const CLI::Validator known(
      [names, listed](std::string& value) -> std::string {
        return names.count(value) != 0 ? "" : "'" + Shown(value) + "': expected one of " + listed;
      },
      "");
  // Help in plain words: "--format FORMAT  Output format: table (the default), json".
  command
      .add_option_function<std::string>(
          "--format", [&format, names](const std::string& value) { format = names.at(value); },
          "Output format: " + listed.insert(std::string_view(Name(allowed.front())).size(), " (the default)"))
      ->check(known)
      ->type_name("FORMAT");
}

}  // namespace preflight::cli
