// The --html pages (fit, plan, sweep, check) opened in a real headless
// browser, Debian's chromium: the page's script runs without an error and
// writes "ok" into #preflight-status only after everything drew, and the
// figures it drew (data- attributes of the charts' elements) equal the ones
// the command's own `--format json` output holds, parsed here independently.
// Without chromium these tests are skipped (ctest reports them as skipped);
// CI installs it (scripts/install-deps.sh).
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace preflight::html_page_test {
namespace {

using nlohmann::json;
using testing::ReadFile;
using testing::RunPreflight;
using testing::SourcePath;

namespace fs = std::filesystem;

constexpr double kGiB = 1073741824.0;

/// The browser: $PREFLIGHT_CHROMIUM when set (only that one), else Debian's.
std::string ChromiumPath() {
  const char* env = std::getenv("PREFLIGHT_CHROMIUM");
  for (const char* p : {env, "/usr/bin/chromium", "/usr/bin/chromium-browser"}) {
    if (p != nullptr && access(p, X_OK) == 0) return p;
    if (env != nullptr) break;
  }
  return "";
}

/// One element's start tag: its name and attributes (values unescaped for
/// the few entities the serializer writes).
struct Element {
  std::string tag;
  std::map<std::string, std::string> attrs;
  size_t offset = 0;  // where it starts in the document
  std::string Attr(const std::string& name) const {
    const auto it = attrs.find(name);
    return it == attrs.end() ? std::string() : it->second;
  }
  double Number(const std::string& name) const { return std::stod(Attr(name)); }
  int64_t Integer(const std::string& name) const { return std::stoll(Attr(name)); }
};

std::string Unescape(std::string v) {
  const std::pair<const char*, const char*> entities[] = {
      {"&quot;", "\""}, {"&lt;", "<"}, {"&gt;", ">"}, {"&nbsp;", "\xc2\xa0"}, {"&amp;", "&"}};
  for (const auto& [from, to] : entities) {
    for (size_t at = v.find(from); at != std::string::npos; at = v.find(from, at + std::string(to).size())) {
      v.replace(at, std::string(from).size(), to);
    }
  }
  return v;
}

/// Every start tag of the serialized DOM whose class attribute is `cls`.
/// Attribute values are double-quoted by the serializer and never hold a
/// raw quote, so scanning name="value" pairs finds where each tag ends.
std::vector<Element> ElementsOfClass(const std::string& dom, const std::string& cls) {
  std::vector<Element> out;
  for (size_t at = dom.find('<'); at != std::string::npos; at = dom.find('<', at + 1)) {
    size_t i = at + 1;
    if (i >= dom.size() || !std::isalpha(static_cast<unsigned char>(dom[i]))) continue;
    Element e;
    e.offset = at;
    while (i < dom.size() && (std::isalnum(static_cast<unsigned char>(dom[i])) || dom[i] == '-')) e.tag += dom[i++];
    while (i < dom.size() && dom[i] != '>') {
      if (std::isspace(static_cast<unsigned char>(dom[i])) || dom[i] == '/') {
        ++i;
        continue;
      }
      std::string name;
      while (i < dom.size() && dom[i] != '=' && dom[i] != '>' && !std::isspace(static_cast<unsigned char>(dom[i]))) {
        name += dom[i++];
      }
      std::string value;
      if (i < dom.size() && dom[i] == '=' && i + 1 < dom.size() && dom[i + 1] == '"') {
        const size_t end = dom.find('"', i + 2);
        value = Unescape(dom.substr(i + 2, end - i - 2));
        i = end + 1;
      }
      e.attrs[name] = value;
    }
    at = i;
    if (e.Attr("class") == cls) out.push_back(e);
  }
  return out;
}

/// A temporary directory for one test's files and the browser's profile.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "preflight-html-XXXXXX").string();
    path_ = mkdtemp(pattern.data()) != nullptr ? pattern : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct Loaded {
  nlohmann::json json;  // the same command's --format json output
  std::string html;     // the page as written
  std::string dom;      // the document after the script ran (--dump-dom)
  std::string status;   // #preflight-status's text: "ok", or "error: ..." from window.onerror
};

/// Opens `page` in headless chromium and returns the DOM after load. The
/// browser gets its own HOME, XDG dirs and profile in `dir` (it writes
/// there; two tests may run at once).
Loaded Open(const TempDir& dir, const std::string& page) {
  const std::string command = "HOME='" + dir.path() + "' XDG_CONFIG_HOME='" + dir.path() + "/config' XDG_CACHE_HOME='" +
                              dir.path() + "/cache' timeout 60 '" + ChromiumPath() +
                              "' --headless --no-sandbox --disable-gpu --disable-extensions --no-first-run "
                              "--enable-logging=stderr --v=0 "
                              "--user-data-dir='" +
                              dir.path() + "/profile' --dump-dom 'file://" + page + "' 2>'" + dir.path() +
                              "/chromium.log'";
  Loaded out;
  std::FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot start " << command;
    return out;
  }
  char buffer[65536];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.dom.append(buffer, n);
  EXPECT_EQ(pclose(pipe), 0) << command;
  // The page writes nothing to the console: any line there is an error (a
  // script error, a blocked load) the status marker might not show.
  std::istringstream log(ReadFile(dir / "chromium.log"));
  for (std::string line; std::getline(log, line);) {
    EXPECT_EQ(line.find(":CONSOLE"), std::string::npos) << line;
  }
  const size_t at = out.dom.find("<div id=\"preflight-status\"");
  if (at == std::string::npos) {
    ADD_FAILURE() << "no #preflight-status in the page";
    return out;
  }
  const size_t open_end = out.dom.find('>', at);
  out.status = out.dom.substr(open_end + 1, out.dom.find('<', open_end) - open_end - 1);
  return out;
}

#define REQUIRE_CHROMIUM()                                                                               \
  if (ChromiumPath().empty()) {                                                                          \
    GTEST_SKIP() << "chromium is not installed (apt-get install --no-install-recommends chromium): the " \
                    "HTML pages are not checked in a browser";                                           \
  }

json JsonOf(const std::vector<std::string>& args) {
  const testing::CommandResult r = RunPreflight(args);
  EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 1) << r.err;
  return json::parse(r.out);
}

/// The memory segments drawn for the page's `k`-th recipe section equal the
/// stages of `fit` (a `fit --format json` document): one per non-zero
/// category, the bytes exact, each bar's height the bytes at the chart's
/// scale, the stage totals and the capacity and headroom-floor lines.
void ExpectMemoryMatches(const std::string& dom, const json& fit) {
  const std::vector<Element> charts = ElementsOfClass(dom, "chart memory");
  ASSERT_EQ(charts.size(), 1u);
  const double px_per_gib = charts[0].Number("data-px-per-gib");
  std::map<std::pair<int64_t, std::string>, Element> segments;
  for (const Element& e : ElementsOfClass(dom, "segment")) {
    EXPECT_TRUE(segments.emplace(std::make_pair(e.Integer("data-stage"), e.Attr("data-category")), e).second);
  }
  size_t expected = 0;
  for (const json& stage : fit["stages"]) {
    const int64_t s = stage["pipeline_rank"];
    int64_t sum = 0;
    for (const auto& [category, bytes] : stage["memory_bytes"].items()) {
      const int64_t b = bytes.get<int64_t>();
      const auto it = segments.find({s, category});
      if (b == 0) {
        EXPECT_EQ(it, segments.end()) << "stage " << s << " " << category << " is 0 bytes but drawn";
        continue;
      }
      ++expected;
      ASSERT_NE(it, segments.end()) << "stage " << s << " " << category << " not drawn";
      EXPECT_EQ(it->second.Integer("data-bytes"), b) << "stage " << s << " " << category;
      // Heights are written with two decimals.
      EXPECT_NEAR(it->second.Number("height"), static_cast<double>(b) / kGiB * px_per_gib, 0.0051)
          << "stage " << s << " " << category;
      sum += it->second.Integer("data-bytes");
    }
    EXPECT_EQ(sum, stage["total_bytes"].get<int64_t>()) << "stage " << s;
  }
  EXPECT_EQ(segments.size(), expected);
  std::map<int64_t, int64_t> totals;
  for (const Element& g : ElementsOfClass(dom, "stage"))
    totals[g.Integer("data-stage")] = g.Integer("data-total-bytes");
  ASSERT_EQ(totals.size(), fit["stages"].size());
  for (const json& stage : fit["stages"])
    EXPECT_EQ(totals[stage["pipeline_rank"]], stage["total_bytes"].get<int64_t>());
  const std::vector<Element> capacity = ElementsOfClass(dom, "capacity");
  const std::vector<Element> floor = ElementsOfClass(dom, "headroom-floor");
  ASSERT_EQ(capacity.size(), 1u);
  ASSERT_EQ(floor.size(), 1u);
  EXPECT_EQ(capacity[0].Integer("data-bytes"), fit["device"]["capacity_bytes"].get<int64_t>());
  EXPECT_EQ(floor[0].Integer("data-bytes"),
            fit["device"]["capacity_bytes"].get<int64_t>() - fit["verdict"]["min_headroom_bytes"].get<int64_t>());
}

/// The page loads without network: a Content-Security-Policy that allows
/// nothing from outside, and no reference to any other file.
void ExpectSelfContained(const std::string& html) {
  EXPECT_NE(html.find("content=\"default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'\""),
            std::string::npos);
  EXPECT_EQ(html.find(" src="), std::string::npos);
  EXPECT_EQ(html.find("href=\"http"), std::string::npos);
  EXPECT_EQ(html.find("url(http"), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
}

/// Runs preflight with `args` and `--html` into `dir`, expects `exit_code`,
/// checks the page is self-contained and opens it (its script must end
/// "ok"); then runs `args` with `--format json` for the figures to compare.
Loaded RunAndOpen(const TempDir& dir, std::vector<std::string> args, int exit_code = 0) {
  const std::string path = dir / "page.html";
  args.insert(args.end(), {"--html", path});
  const testing::CommandResult run = RunPreflight(args);
  EXPECT_EQ(run.exit_code, exit_code) << run.err;
  Loaded page = Open(dir, path);
  page.html = ReadFile(path);
  args.resize(args.size() - 2);
  args.insert(args.end(), {"--format", "json"});
  page.json = JsonOf(args);
  ExpectSelfContained(page.html);
  EXPECT_EQ(page.status, "ok") << page.dom.substr(0, 2000);
  return page;
}

TEST(HtmlPage, FitDrawsTheMemoryOfEveryStageAndTheWorstRanksFormulas) {
  REQUIRE_CHROMIUM();
  TempDir dir;
  const std::string recipe = SourcePath("recipes/nam56r-h200.yaml");
  const Loaded page = RunAndOpen(dir, {"fit", recipe, "--explain"});
  ASSERT_EQ(page.status, "ok");
  const std::string& html = page.html;
  const json& fit = page.json;
  ASSERT_EQ(fit["stages"].size(), 4u);  // the recipe's pp
  ExpectMemoryMatches(page.dom, fit);
  // The formulas table shows the worst stage first: the --explain lines, in order.
  const std::vector<Element> rows = ElementsOfClass(page.dom, "explain-row");
  ASSERT_EQ(rows.size(), fit["explain"].size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].Attr("data-category"), fit["explain"][i]["category"]);
    EXPECT_EQ(rows[i].Integer("data-bytes"), fit["explain"][i]["bytes"].get<int64_t>());
  }
  // Hovering a segment shows its bytes and the formulas of that figure.
  const int64_t worst = fit["worst_stage"];
  for (const Element& e : ElementsOfClass(page.dom, "segment")) {
    if (e.Integer("data-stage") != worst) continue;
    const std::string tip = e.Attr("data-tip");
    EXPECT_NE(tip.find(fmt::format("({} bytes)", e.Attr("data-bytes"))), std::string::npos) << tip;
    for (const json& line : fit["explain"]) {
      if (line["category"] != e.Attr("data-category")) continue;
      EXPECT_NE(tip.find(fmt::format("= {}", line["formula"].get<std::string>())), std::string::npos) << tip;
      EXPECT_NE(tip.find(fmt::format("with {}", line["inputs"].get<std::string>())), std::string::npos) << tip;
    }
  }
  // The embedded data is the JSON of `fit --explain --format json`.
  const size_t open = html.find("<script type=\"application/json\" id=\"preflight-data\">");
  ASSERT_NE(open, std::string::npos);
  const size_t start = html.find('>', open) + 1;
  const json data = json::parse(html.substr(start, html.find("</script>", start) - start));
  json embedded = data["reports"][0]["fit"];
  EXPECT_EQ(embedded, fit);
  // One formula list per stage, each adding up to the stage's categories.
  ASSERT_EQ(data["reports"][0]["explain_by_stage"].size(), fit["stages"].size());
  for (size_t s = 0; s < fit["stages"].size(); ++s) {
    std::map<std::string, int64_t> sums;
    for (const json& e : data["reports"][0]["explain_by_stage"][s]) sums[e["category"]] += e["bytes"].get<int64_t>();
    for (const auto& [category, bytes] : fit["stages"][s]["memory_bytes"].items()) {
      EXPECT_EQ(sums[category], bytes.get<int64_t>()) << "stage " << s << " " << category;
    }
  }
}

TEST(HtmlPage, OverCapacityIsMarkedOnEveryStageOverIt) {
  REQUIRE_CHROMIUM();
  TempDir dir;
  // 130 GiB of runtime reserve puts every stage of the recipe over the 140 GiB of an H200.
  const Loaded page =
      RunAndOpen(dir, {"fit", SourcePath("recipes/nam56r-h200.yaml"), "--set", "cluster.reserve_gib=130"},
                 /*exit_code=*/1);  // does not fit, and the page is written
  ASSERT_EQ(page.status, "ok");
  const json& fit = page.json;
  ASSERT_FALSE(fit["verdict"]["fits"].get<bool>());
  ExpectMemoryMatches(page.dom, fit);
  const double px_per_gib = ElementsOfClass(page.dom, "chart memory")[0].Number("data-px-per-gib");
  const std::vector<Element> over = ElementsOfClass(page.dom, "over");
  size_t over_stages = 0;
  for (const json& stage : fit["stages"]) {
    const int64_t excess = stage["total_bytes"].get<int64_t>() - stage["capacity_bytes"].get<int64_t>();
    if (excess <= 0) continue;
    ASSERT_LT(over_stages, over.size());
    EXPECT_NEAR(over[over_stages].Number("height"), static_cast<double>(excess) / kGiB * px_per_gib, 0.0051);
    ++over_stages;
  }
  EXPECT_EQ(over_stages, 4u);
  EXPECT_EQ(over.size(), over_stages);
  EXPECT_NE(page.dom.find("data-fits=\"false\""), std::string::npos);
  EXPECT_NE(page.dom.find("DOES NOT FIT"), std::string::npos);
}

TEST(HtmlPage, PlanDrawsRanksGroupsCommunicationAndStepTimeAsItsJson) {
  REQUIRE_CHROMIUM();
  TempDir dir;
  const std::string recipe = SourcePath("recipes/nam56r-h200.yaml");
  const Loaded page = RunAndOpen(dir, {"plan", recipe});
  ASSERT_EQ(page.status, "ok");
  const json& plan = page.json;
  // The memory geometry is fit's.
  ExpectMemoryMatches(page.dom, JsonOf({"fit", recipe, "--format", "json"}));

  // Rank map: every rank on the node and GPU the rank map puts it, with the
  // coordinates that node holds.
  const std::vector<Element> ranks = ElementsOfClass(page.dom, "rank");
  ASSERT_EQ(static_cast<int64_t>(ranks.size()), plan["world"].get<int64_t>());  // 64 ranks: all drawn
  const int64_t gpn = plan["gpus_per_node"];
  std::set<int64_t> seen;
  for (const Element& r : ranks) {
    const int64_t rank = r.Integer("data-rank"), node = r.Integer("data-node");
    seen.insert(rank);
    const json& row = plan["rank_map"][static_cast<size_t>(node)];
    EXPECT_EQ(row["node"], node);
    EXPECT_GE(rank, row["first_rank"].get<int64_t>());
    EXPECT_LE(rank, row["last_rank"].get<int64_t>());
    EXPECT_EQ(r.Integer("data-gpu"), rank - node * gpn);
    for (const char* axis : {"tp", "cp", "dp", "pp"}) {
      const std::set<int64_t> held = row[axis].get<std::set<int64_t>>();
      EXPECT_EQ(held.count(r.Integer(std::string("data-") + axis)), 1u) << "rank " << rank << " " << axis;
    }
  }
  EXPECT_EQ(seen.size(), ranks.size());
  // Groups: the ranks of each axis's first group share one colour group and
  // no other rank is in it; the axis has `groups` distinct groups.
  std::map<int64_t, const Element*> by_rank;
  for (const Element& r : ranks) by_rank[r.Integer("data-rank")] = &r;
  for (const json& g : plan["groups"]) {
    const std::string attr = "data-group-" + g["axis"].get<std::string>();
    const std::vector<int64_t> first = g["first_group"];
    ASSERT_EQ(static_cast<int64_t>(first.size()), g["size"].get<int64_t>());
    const std::string id = by_rank[first[0]]->Attr(attr);
    std::set<int64_t> members;
    std::set<std::string> ids;
    for (const Element& r : ranks) {
      ids.insert(r.Attr(attr));
      if (r.Attr(attr) == id) members.insert(r.Integer("data-rank"));
    }
    EXPECT_EQ(members, std::set<int64_t>(first.begin(), first.end())) << attr;
    if (g["axis"] != "embedding") {
      EXPECT_EQ(static_cast<int64_t>(ids.size()), g["groups"].get<int64_t>()) << attr;
    }
  }

  // Communication per axis of the slowest stage, as sent per step.
  const int64_t slowest = plan["step"]["slowest_stage"];
  std::map<std::string, int64_t> drawn;
  for (const Element& e : ElementsOfClass(page.dom, "comm-axis")) drawn[e.Attr("data-axis")] = e.Integer("data-bytes");
  std::map<std::string, int64_t> expected;
  for (const json& c : plan["communication"]) {
    if (c["pipeline_rank"] != slowest) continue;
    for (const auto& [axis, bytes] : c["send_bytes_by_axis"].items()) {
      if (bytes.get<int64_t>() > 0) expected[axis] = bytes.get<int64_t>();
    }
  }
  EXPECT_FALSE(expected.empty());
  EXPECT_EQ(drawn, expected);

  // Step time: steady + bubble + the tail is the step.
  const json& step = plan["step"];
  std::map<std::string, double> parts;
  for (const Element& e : ElementsOfClass(page.dom, "step-part")) parts[e.Attr("data-part")] = e.Number("data-seconds");
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_DOUBLE_EQ(parts["steady"], step["steady_s"].get<double>());
  EXPECT_DOUBLE_EQ(parts["bubble"], step["bubble_s"].get<double>());
  EXPECT_NEAR(parts["steady"] + parts["bubble"] + parts["tail"], step["step_s"].get<double>(),
              1e-12 * step["step_s"].get<double>());
  std::map<std::string, double> families, expected_families;
  for (const Element& e : ElementsOfClass(page.dom, "compute-family")) {
    families[e.Attr("data-family")] = e.Number("data-seconds");
  }
  for (const auto& [family, seconds] : step["compute_by_family_s"].items()) {
    if (seconds.get<double>() > 0) expected_families[family] = seconds.get<double>();
  }
  if (step["head_compute_s"].get<double>() > 0) expected_families["head"] = step["head_compute_s"];
  EXPECT_EQ(families, expected_families);
}

TEST(HtmlPage, ALargeWorldsMapDrawsTheFirstNodesAndSaysSo) {
  REQUIRE_CHROMIUM();
  TempDir dir;
  // Llama 3 405B on 16,384 GPUs: the map stops at 1,024 ranks (128 nodes).
  const Loaded page = RunAndOpen(dir, {"plan", SourcePath("recipes/llama3-405b-h200.yaml")});
  ASSERT_EQ(page.json["world"], 16384);
  ASSERT_EQ(page.status, "ok");
  const std::vector<Element> ranks = ElementsOfClass(page.dom, "rank");
  ASSERT_EQ(ranks.size(), 1024u);
  for (size_t r = 0; r < ranks.size(); ++r) EXPECT_EQ(ranks[r].Integer("data-rank"), static_cast<int64_t>(r));
  EXPECT_NE(page.dom.find("the first 128 of 2048 nodes drawn"), std::string::npos);
}

TEST(HtmlPage, SweepDrawsTheParetoFrontAndTheFittingCloud) {
  REQUIRE_CHROMIUM();
  TempDir dir;
  const std::string recipe = SourcePath("recipes/llama3-8b-h200.yaml");
  const Loaded page = RunAndOpen(dir, {"sweep", recipe, "--gpus", "8"});
  ASSERT_EQ(page.status, "ok");
  const json& sweep = page.json;
  const json& layouts = sweep["layouts"];
  auto expect_row = [&](const Element& e) {
    const json& row = layouts[static_cast<size_t>(e.Integer("data-index"))];
    EXPECT_TRUE(row["status"] == "fits" || row["status"] == "tight") << row.dump();
    EXPECT_EQ(e.Integer("data-peak-bytes"), row["peak_bytes"].get<int64_t>());
    EXPECT_DOUBLE_EQ(e.Number("data-step-s"), row["step_s"].get<double>());
  };
  std::vector<int64_t> front;
  for (const Element& e : ElementsOfClass(page.dom, "pareto")) {
    expect_row(e);
    front.push_back(e.Integer("data-index"));
  }
  EXPECT_EQ(front, sweep["pareto"].get<std::vector<int64_t>>());
  const std::vector<Element> cloud = ElementsOfClass(page.dom, "layout");
  for (const Element& e : cloud) expect_row(e);
  // Fewer fitting layouts than the chart's cap: every one is drawn, once.
  const int64_t fitting = sweep["counts"]["fits"].get<int64_t>() + sweep["counts"]["tight"].get<int64_t>();
  ASSERT_LT(fitting, 5000);
  EXPECT_EQ(static_cast<int64_t>(cloud.size() + front.size()), fitting);
  std::vector<int64_t> top;
  for (const Element& e : ElementsOfClass(page.dom, "top-row")) top.push_back(e.Integer("data-index"));
  EXPECT_EQ(top, sweep["top"].get<std::vector<int64_t>>());
}

TEST(HtmlPage, ASweepWhereNothingFitsSaysWhy) {
  REQUIRE_CHROMIUM();
  TempDir dir;
  // DeepSeek-V3 on one node: nothing fits, and the recipe's pp 16 does not divide 8 GPUs.
  const Loaded page = RunAndOpen(dir, {"sweep", SourcePath("recipes/deepseek-v3-h200.yaml"), "--gpus", "8"});
  ASSERT_EQ(page.status, "ok");
  ASSERT_TRUE(page.json["top"].empty());
  EXPECT_TRUE(ElementsOfClass(page.dom, "layout").empty());
  const std::vector<Element> why = ElementsOfClass(page.dom, "verdict bad");
  ASSERT_EQ(why.size(), 1u);
  EXPECT_EQ(why[0].Integer("data-invalid-rows"), page.json["nothing_fits"]["invalid_rows"].get<int64_t>());
}

TEST(HtmlPage, CheckDrawsEveryRecipeAsFitDoes) {
  REQUIRE_CHROMIUM();
  TempDir dir;
  const std::vector<std::string> recipes = {SourcePath("recipes/nam56r-h200.yaml"),
                                            SourcePath("recipes/deepseek-v3-h200.yaml")};
  const Loaded page = RunAndOpen(dir, {"check", recipes[0], recipes[1]});
  ASSERT_EQ(page.status, "ok");
  const json& check = page.json;
  const std::vector<Element> rows = ElementsOfClass(page.dom, "check-row");
  ASSERT_EQ(rows.size(), 2u);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].Attr("data-file"), check["recipes"][i]["file"]);
    EXPECT_EQ(rows[i].Attr("data-status"), check["recipes"][i]["status"]);
    EXPECT_EQ(rows[i].Integer("data-worst-total-bytes"), check["recipes"][i]["worst_total_bytes"].get<int64_t>());
  }
  // Each recipe's section holds its memory geometry, as `fit` has it.
  for (size_t k = 0; k < recipes.size(); ++k) {
    const size_t from = page.dom.find("id=\"recipe-" + std::to_string(k) + "\"");
    const size_t to = page.dom.find("id=\"recipe-" + std::to_string(k + 1) + "\"");
    ASSERT_NE(from, std::string::npos);
    SCOPED_TRACE(recipes[k]);
    ExpectMemoryMatches(page.dom.substr(from, to == std::string::npos ? std::string::npos : to - from),
                        JsonOf({"fit", recipes[k], "--format", "json"}));
  }
}

TEST(HtmlPage, MarkupInARecipeNameStaysText) {
  REQUIRE_CHROMIUM();
  TempDir dir;
  const std::string name = "x</script><script>document.title='pwned'</script><!--";
  const Loaded page = RunAndOpen(dir, {"fit", SourcePath("recipes/llama3-8b-h200.yaml"), "--set", "name=" + name});
  EXPECT_EQ(page.dom.find("<title>pwned</title>"), std::string::npos);
  EXPECT_NE(page.dom.find("<title>preflight fit: x&lt;/script&gt;"), std::string::npos);
}

// --html's write rules need no browser.

TEST(HtmlCli, DashWritesThePageToStdoutInPlaceOfTheReport) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"fit", SourcePath("recipes/nam56r-h200.yaml"), "--html", "-"},
        std::vector<std::string>{"plan", SourcePath("recipes/nam56r-h200.yaml"), "--html", "-"},
        std::vector<std::string>{"check", SourcePath("recipes/nam56r-h200.yaml"), "--html", "-"}}) {
    const testing::CommandResult r = RunPreflight(args);
    EXPECT_EQ(r.exit_code, 0) << args[0] << ": " << r.err;
    EXPECT_EQ(r.out.rfind("<!DOCTYPE html>\n", 0), 0u) << args[0];
    EXPECT_EQ(testing::CountOccurrences(r.out, "<!DOCTYPE html>"), 1) << args[0];
    EXPECT_EQ(r.out.substr(r.out.size() - 8), "</html>\n") << args[0];
  }
}

TEST(HtmlCli, DashNextToAnotherOutputOnStdoutIsRefused) {
  const std::string recipe = SourcePath("recipes/nam56r-h200.yaml");
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"fit", recipe, "--html", "-", "--format", "json"},
        std::vector<std::string>{"plan", recipe, "--html", "-", "--emit", "megatron"},
        std::vector<std::string>{"check", recipe, "--html", "-", "--format", "md"}}) {
    const testing::CommandResult r = RunPreflight(args);
    EXPECT_EQ(r.exit_code, 2) << args[0];
    EXPECT_TRUE(r.out.empty()) << args[0];
    EXPECT_NE(r.err.find("--html -: the page takes stdout"), std::string::npos) << r.err;
  }
}

TEST(HtmlCli, ARecipesDegreesThatDoNotDivideTheSweptGpusAreNotItsRow) {
  // pp 16 on 8 GPUs: the recipe's own layout is not in the space (its
  // data-parallel degree would be 0), and the charts say so instead of dividing by it.
  TempDir dir;
  const testing::CommandResult r = RunPreflight({"sweep", SourcePath("recipes/deepseek-v3-h200.yaml"), "--gpus", "8",
                                                 "--svg", dir / "s.svg", "--html", dir / "s.html"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(ReadFile(dir / "s.svg").find("layout: not in the swept space"), std::string::npos);
  EXPECT_NE(ReadFile(dir / "s.html").find("\"own\":null"), std::string::npos);
}

TEST(HtmlCli, NeverWrittenOntoTheRecipeAndAFailedWriteIsExit2) {
  TempDir dir;
  const std::string copy = dir / "r.yaml";
  fs::copy_file(SourcePath("recipes/nam56r-h200.yaml"), copy);
  const std::string before = ReadFile(copy);
  for (const char* verb : {"fit", "plan", "check"}) {
    const testing::CommandResult r = RunPreflight({verb, copy, "--html", copy});
    EXPECT_EQ(r.exit_code, 2) << verb;
    EXPECT_NE(r.err.find("is an input of this run"), std::string::npos) << r.err;
  }
  const testing::CommandResult sweep =
      RunPreflight({"sweep", copy, "--gpus", "64", "--tp", "4", "--pp", "4", "--html", copy});
  EXPECT_EQ(sweep.exit_code, 2);
  EXPECT_EQ(ReadFile(copy), before);
  const testing::CommandResult missing = RunPreflight({"fit", copy, "--html", dir / "no/such/dir/p.html"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("cannot write"), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace preflight::html_page_test
