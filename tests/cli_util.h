// Runs the real remat-train binary for the CLI tests (tagged [smoke]): exit code and output.
#pragma once

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

namespace remat::test {

struct CliResult {
  int code = -1;
  std::string out;  // stdout, plus stderr when asked for
};

/// Runs `cmd` with /bin/sh: exit code and stdout, plus stderr when asked for.
inline CliResult run_command(const std::string& cmd, bool with_stderr = true) {
  CliResult r;
  FILE* p =
      popen(fmt::format("{{ {} ; }} {}", cmd, with_stderr ? "2>&1" : "2>/dev/null").c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

/// A shell command run from the source folder (so configs/ and scripts/ paths work).
inline CliResult run_in_source(const std::string& cmd, bool with_stderr = true) {
  return run_command(fmt::format("cd {} && {}", REMAT_SOURCE_DIR, cmd), with_stderr);
}

/// `remat-train ARGS` from the source folder, with `env` (shell assignments, "NAME=value ...",
/// or `env` options such as "-u NAME") in its environment.
inline CliResult run_binary(const std::string& args, bool with_stderr,
                            const std::string& env = "") {
  return run_in_source(
      fmt::format("{}{} {}", env.empty() ? "" : "env " + env + " ", REMAT_BINARY, args),
      with_stderr);
}

}  // namespace remat::test
