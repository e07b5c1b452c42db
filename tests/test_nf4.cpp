// NF4 (engine/core/nf4.h), the storage of a QLoRA base, against bitsandbytes' definition:
// tests/golden/nf4/golden.json (scripts/nf4_golden.py, which implements quantize_4bit /
// dequantize_4bit with compress_statistics from bitsandbytes' definition in numpy and compared
// its results with bitsandbytes 0.50.2) holds the packed codes, the f32 or nested 8-bit absmaxes
// and the dequantised values of weights both sides build from the same integers. Our quantiser
// must give the same bytes, our decoder the same floats; the code tables are bitsandbytes'.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/nf4.h"

using namespace remat;

namespace {

nlohmann::json golden() {
  std::ifstream in(std::string(REMAT_SOURCE_DIR) + "/tests/golden/nf4/golden.json");
  REQUIRE(in);
  return nlohmann::json::parse(in);
}

std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

// scripts/nf4_golden.py's weights(): integers k / 4096 times a per-block factor, from a 64-bit LCG.
std::vector<float> weights(int64_t n, uint64_t seed) {
  std::vector<float> out(static_cast<size_t>(n));
  uint64_t state = seed;
  for (int64_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const int64_t k = static_cast<int64_t>((state >> 33) % 24001) - 12000;
    const double factor = static_cast<double>((i / 64) % 13 + 1) / 8;
    out[static_cast<size_t>(i)] = static_cast<float>(static_cast<double>(k) / 4096 * factor);
  }
  const auto zero_from = std::min<int64_t>(128, n), zero_to = std::min<int64_t>(192, n);
  std::fill(out.begin() + zero_from, out.begin() + zero_to, 0.0f);  // numpy's out[128:192] = 0
  return out;
}

template <class T>
std::vector<uint8_t> bytes_of(const T* p, size_t n) {
  const auto* b = reinterpret_cast<const uint8_t*>(p);
  return {b, b + n * sizeof(T)};
}

}  // namespace

TEST_CASE("nf4: the code tables are bitsandbytes'", "[nf4]") {
  const nlohmann::json g = golden();
  REQUIRE(g["nf4"].size() == 16);
  for (size_t i = 0; i < 16; ++i) CHECK(nf4::kCode[i] == g["nf4"][i].get<float>());
  CHECK(bytes_of(nf4::kDynamic, 256) == from_hex(g["dynamic_map_f32_hex"].get<std::string>()));
  for (size_t i = 1; i < 256; ++i) CHECK(nf4::kDynamic[i - 1] <= nf4::kDynamic[i]);
}

TEST_CASE("nf4: quantised bytes and dequantised values equal bitsandbytes' definition", "[nf4]") {
  const nlohmann::json g = golden();
  REQUIRE(g["cases"].size() == 5);
  for (const nlohmann::json& c : g["cases"]) {
    const std::string name = c["name"];
    INFO(name);
    const int64_t n = c["rows"].get<int64_t>() * c["cols"].get<int64_t>();
    const bool dq = c["double_quant"];
    const std::vector<float> x = weights(n, c["seed"].get<uint64_t>());
    const nf4::Layout l = nf4::layout(n, dq);
    std::vector<uint8_t> packed(static_cast<size_t>(l.bytes));
    encode_weight(dq ? DType::NF4DQ : DType::NF4, x.data(), n, packed.data());
    const auto part = [&](int64_t at, int64_t size) {
      return std::vector<uint8_t>(packed.begin() + at, packed.begin() + at + size);
    };
    CHECK(part(l.codes, (n + 1) / 2) == from_hex(c["packed_hex"]));
    if (dq) {
      CHECK(part(l.absmax, l.blocks) == from_hex(c["qabsmax_hex"]));
      CHECK(part(l.absmax2, 4 * l.nested_blocks) == from_hex(c["absmax2_f32_hex"]));
      CHECK(part(l.offset, 4) == from_hex(c["offset_f32_hex"]));
    } else {
      CHECK(part(l.absmax, 4 * l.blocks) == from_hex(c["absmax_f32_hex"]));
    }
    std::vector<float> back(static_cast<size_t>(n));
    decode_weight(dq ? DType::NF4DQ : DType::NF4, packed.data(), n, 0, n, back.data());
    int64_t checked = 0;
    for (const nlohmann::json& iv : c["dequantized"]) {
      const auto i = iv[0].get<size_t>();
      const auto bits = iv[1].get<uint32_t>();
      uint32_t ours;
      std::memcpy(&ours, &back[i], 4);
      if (ours != bits)
        FAIL(fmt::format("value {}: {} vs bitsandbytes' definition {}", i, back[i],
                         std::bit_cast<float>(bits)));
      ++checked;
    }
    CHECK(checked >= 77);
    // A range decoded alone (the CPU GEMM decodes whole weights; the CUDA kernel, every pair):
    // the same values.
    if (n > 3 * 64) {
      std::vector<float> mid(70);
      decode_weight(dq ? DType::NF4DQ : DType::NF4, packed.data(), n, 128, 70, mid.data());
      CHECK(std::memcmp(mid.data(), back.data() + 128, 70 * 4) == 0);
    }
  }
}

TEST_CASE("nf4: the error of a round trip is within half a code step of each block's absmax",
          "[nf4]") {
  // The largest gap between neighbouring NF4 values is -0.6961928 - -1 = 0.304: a value is at most
  // half of that, times its block's absmax, from its decoded value; with double quant the decoded
  // absmax is off by at most half a step of the 8-bit dynamic map (< 0.4% of the largest
  // |absmax - mean|, bounded here by 1% of the largest absmax).
  const int64_t n = 64 * 300 + 5;
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x[static_cast<size_t>(i)] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)) *
                                                   (1.0 + static_cast<double>(i % 911) / 100));
  for (DType t : {DType::NF4, DType::NF4DQ}) {
    INFO(dtype_name(t));
    std::vector<uint8_t> packed(static_cast<size_t>(nf4_bytes(n, t == DType::NF4DQ)));
    encode_weight(t, x.data(), n, packed.data());
    std::vector<float> back(static_cast<size_t>(n));
    decode_weight(t, packed.data(), n, 0, n, back.data());
    const double nested = t == DType::NF4DQ ? 0.01 * 10.1 : 0.0;  // |x| < 10.1
    for (int64_t b = 0; b * 64 < n; ++b) {
      float am = 0;
      for (int64_t i = b * 64; i < std::min(n, b * 64 + 64); ++i)
        am = std::max(am, std::fabs(x[static_cast<size_t>(i)]));
      for (int64_t i = b * 64; i < std::min(n, b * 64 + 64); ++i)
        REQUIRE(std::fabs(back[static_cast<size_t>(i)] - x[static_cast<size_t>(i)]) <=
                0.1520 * am + nested + 1e-6);
    }
  }
  CHECK(nf4_bytes(n, true) < nf4_bytes(n, false));
  // 0.5 byte a weight, 1/64 of a byte for its block's 8-bit absmax (4/64 in f32).
  CHECK(nf4_bytes(4096LL * 4096, true) * 1.0 / (4096.0 * 4096) < 0.516);
  CHECK(nf4_bytes(4096LL * 4096, false) * 1.0 / (4096.0 * 4096) == 0.5625);
}

TEST_CASE("bf16 storage rounds to nearest even and decodes exactly", "[nf4]") {
  const float x[4] = {1.0f, 1.00390625f, 1.01171875f, -3.14159274f};  // 1 + 2^-8: a tie, to even
  std::vector<uint16_t> b(4);
  encode_weight(DType::BF16, x, 4, b.data());
  std::vector<float> back(4);
  decode_weight(DType::BF16, b.data(), 4, 0, 4, back.data());
  CHECK(back[0] == 1.0f);
  CHECK(back[1] == 1.0f);
  CHECK(back[2] == 1.015625f);
  CHECK(back[3] == -3.140625f);
}
