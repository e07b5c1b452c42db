// Times the tokenizer.json tokenizer (data/hf_tokenizer.h): loading the file, encoding a text
// (first with a cold word cache, then warm), decoding the ids. A report, never pass/fail.
//
//   build/tests/bench/remat_bench_tokenizer tokenizer.json text.txt [rounds]
//
// CPU time (this thread) is reported beside wall time: on a shared machine the wall time says
// more about the neighbours than about the code.
#include <fmt/format.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "data/hf_tokenizer.h"
#include "engine/core/error.h"

namespace {

struct Clock {
  std::chrono::steady_clock::time_point wall = std::chrono::steady_clock::now();
  std::clock_t cpu = std::clock();
  // (wall ms, cpu ms) since construction.
  std::pair<double, double> ms() const {
    return {
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall).count(),
        1000.0 * static_cast<double>(std::clock() - cpu) / CLOCKS_PER_SEC};
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    fmt::print(stderr, "usage: {} tokenizer.json text.txt [rounds]\n", argv[0]);
    return 2;
  }
  const int rounds = argc > 3 ? std::max(1, std::atoi(argv[3])) : 3;
  std::ifstream f(argv[2], std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  try {
    Clock load;
    remat::HfTokenizer tok(argv[1]);
    auto [load_wall, load_cpu] = load.ms();
    fmt::print("load    {:8.1f} ms wall {:8.1f} ms cpu  ({})\n", load_wall, load_cpu, argv[1]);
    const double mb = static_cast<double>(text.size()) / (1 << 20);
    std::vector<int32_t> ids;
    for (int r = 0; r < rounds; ++r) {
      Clock enc;
      ids = tok.encode(text);
      auto [wall, cpu] = enc.ms();
      fmt::print("encode  {:8.1f} ms wall {:8.1f} ms cpu  {:.2f} MiB -> {} ids ({})\n", wall, cpu,
                 mb, ids.size(), r == 0 ? "cold word cache" : "warm");
    }
    Clock dec;
    const std::string back = tok.decode(ids);
    auto [wall, cpu] = dec.ms();
    fmt::print("decode  {:8.1f} ms wall {:8.1f} ms cpu  {} bytes{}\n", wall, cpu, back.size(),
               back == text ? ", the text again" : "");
  } catch (const remat::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  return 0;
}
