// Where `--config PATH` is read from: the working folder first, then the configs `make install`
// put in <exe folder>/../share/remat-train (tests/install_check.sh runs the installed binary).
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "engine/config/config.h"
#include "engine/config/config_path.h"
#include "engine/core/error.h"
#include "tests/cli_util.h"
#include "tests/temp_dir.h"

using Catch::Matchers::Contains;
namespace fs = std::filesystem;

TEST_CASE("a relative config missing here is read from the installed share/remat-train",
          "[config]") {
  // A fake prefix: bin/ (the executable's folder) and share/remat-train/configs/only-here.toml.
  remat::test::TempDir prefix("config-lookup");
  fs::create_directories(prefix.path / "bin");
  fs::create_directories(prefix.path / "share/remat-train/configs");
  const std::string installed = prefix / "share/remat-train/configs/only-here.toml";
  std::ofstream(installed) << "[model]\nkind = \"gpt\"\n";
  const std::string bin = prefix / "bin";

  CHECK(remat::resolve_config_path("configs/only-here.toml", bin) == installed);
  // The working folder wins: a path that exists here is kept as given, relative or absolute.
  const std::string here = fs::relative(installed).string();
  CHECK(remat::resolve_config_path(here, bin) == here);
  CHECK(remat::resolve_config_path(installed, bin) == installed);
  // Found in neither (or absolute): unchanged, so the error names what was given.
  CHECK(remat::resolve_config_path("configs/nowhere.toml", bin) == "configs/nowhere.toml");
  CHECK(remat::resolve_config_path("/nonexistent/x.toml", bin) == "/nonexistent/x.toml");
}

TEST_CASE("a relative config found nowhere is one error naming both places looked", "[config]") {
  try {
    remat::load_config("configs/nowhere.toml");
    FAIL("no error");
  } catch (const remat::ConfigError& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Contains("configs/nowhere.toml: [config] cannot open the config file") &&
                        Contains((fs::current_path() / "configs/nowhere.toml").string()) &&
                        Contains("share/remat-train/configs/nowhere.toml") && Contains("Fix:"));
    CHECK(msg.find('\n') == std::string::npos);
  }
}

TEST_CASE("the binary reads a relative --config from the working folder or says where it looked",
          "[smoke]") {
  auto r = remat::test::run_binary("plan --config configs/nowhere.toml", true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("error: configs/nowhere.toml: [config] cannot open the config file") &&
                        Contains(std::string(REMAT_SOURCE_DIR) + "/configs/nowhere.toml") &&
                        Contains("share/remat-train/configs/nowhere.toml") && Contains("Fix:"));
  CHECK(remat::test::run_binary("plan --config configs/tiny.toml", true).code == 0);
}
