// Runs the real remat-train binary for the CLI tests (tagged [smoke]): exit code and output.
#pragma once

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace remat::test {

struct CliResult {
  int code = -1;
  std::string out;  // stdout, plus stderr when asked for
};

/// `remat-train ARGS` from the source folder (so configs/ paths work), with `env` (shell
/// assignments, "NAME=value ...") in its environment.
inline CliResult run_binary(const std::string& args, bool with_stderr,
                            const std::string& env = "") {
  const std::string cmd =
      fmt::format("cd {} && {} {} {} {}", REMAT_SOURCE_DIR, env.empty() ? "" : "env " + env,
                  REMAT_BINARY, args, with_stderr ? "2>&1" : "2>/dev/null");
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace remat::test
