// NF4 and bf16 storage of frozen weights (see engine/core/nf4.h).
#include "engine/core/nf4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/core/error.h"

namespace remat::nf4 {

const float kCode[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

// create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8) as bitsandbytes builds it
// in f32 (torch.linspace's fused multiply-add included): scripts/nf4_golden.py computes it from
// the definition and checks it against bitsandbytes; tests/test_nf4.cpp checks this table
// against the golden's.
const float kDynamic[256] = {
    -0x1.fc6666p-1f,  -0x1.f53334p-1f,  -0x1.eep-1f,      -0x1.e6ccccp-1f,
    -0x1.df999ap-1f,  -0x1.d86666p-1f,  -0x1.d13334p-1f,  -0x1.cap-1f,
    -0x1.c2ccccp-1f,  -0x1.bb999ap-1f,  -0x1.b46666p-1f,  -0x1.ad3334p-1f,
    -0x1.a6p-1f,      -0x1.9eccccp-1f,  -0x1.97999ap-1f,  -0x1.906666p-1f,
    -0x1.893334p-1f,  -0x1.82p-1f,      -0x1.7accccp-1f,  -0x1.73999ap-1f,
    -0x1.6c6668p-1f,  -0x1.653334p-1f,  -0x1.5ep-1f,      -0x1.56ccccp-1f,
    -0x1.4f999ap-1f,  -0x1.486668p-1f,  -0x1.413334p-1f,  -0x1.3ap-1f,
    -0x1.32ccccp-1f,  -0x1.2b999ap-1f,  -0x1.246668p-1f,  -0x1.1d3334p-1f,
    -0x1.16p-1f,      -0x1.0eccccp-1f,  -0x1.079998p-1f,  -0x1.006666p-1f,
    -0x1.f26664p-2f,  -0x1.e4p-2f,      -0x1.d59998p-2f,  -0x1.c73334p-2f,
    -0x1.b8ccccp-2f,  -0x1.aa6666p-2f,  -0x1.9cp-2f,      -0x1.8d9998p-2f,
    -0x1.7f3334p-2f,  -0x1.70ccccp-2f,  -0x1.626666p-2f,  -0x1.54p-2f,
    -0x1.459998p-2f,  -0x1.373334p-2f,  -0x1.28ccccp-2f,  -0x1.1a6668p-2f,
    -0x1.0cp-2f,      -0x1.fb3332p-3f,  -0x1.de6666p-3f,  -0x1.c1999ap-3f,
    -0x1.a4ccccp-3f,  -0x1.88p-3f,      -0x1.6b3334p-3f,  -0x1.4e6666p-3f,
    -0x1.31999ap-3f,  -0x1.14ccccp-3f,  -0x1.fp-4f,       -0x1.b66668p-4f,
    -0x1.93d70ap-4f,  -0x1.8851eep-4f,  -0x1.7ccccep-4f,  -0x1.7147aep-4f,
    -0x1.65c29p-4f,   -0x1.5a3d7p-4f,   -0x1.4eb854p-4f,  -0x1.433334p-4f,
    -0x1.37ae14p-4f,  -0x1.2c28f6p-4f,  -0x1.20a3d6p-4f,  -0x1.151ebap-4f,
    -0x1.09999ap-4f,  -0x1.fc28f6p-5f,  -0x1.e51ebap-5f,  -0x1.ce147ap-5f,
    -0x1.b70a3ep-5f,  -0x1.ap-5f,       -0x1.88f5c2p-5f,  -0x1.71eb86p-5f,
    -0x1.5ae146p-5f,  -0x1.43d70ap-5f,  -0x1.2ccccep-5f,  -0x1.15c29p-5f,
    -0x1.fd70a4p-6f,  -0x1.cf5c2ap-6f,  -0x1.a147aep-6f,  -0x1.733334p-6f,
    -0x1.451ebap-6f,  -0x1.170a3ep-6f,  -0x1.d1eb86p-7f,  -0x1.75c29p-7f,
    -0x1.3e76c8p-7f,  -0x1.2c083p-7f,   -0x1.19999ap-7f,  -0x1.072b02p-7f,
    -0x1.e978d4p-8f,  -0x1.c49ba6p-8f,  -0x1.9fbe76p-8f,  -0x1.7ae148p-8f,
    -0x1.56041ap-8f,  -0x1.3126e8p-8f,  -0x1.0c49bap-8f,  -0x1.ced914p-9f,
    -0x1.851eb8p-9f,  -0x1.3b645ap-9f,  -0x1.e353f8p-10f, -0x1.4fdf3ap-10f,
    -0x1.eecbfep-11f, -0x1.b3d07cp-11f, -0x1.78d5p-11f,   -0x1.3dd982p-11f,
    -0x1.02de02p-11f, -0x1.8fc506p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f,
    -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f,
    -0x1.040bfep-17f, -0x1.b43528p-19f, -0x1.27476ep-21f, 0.0f,
    0x1.27476ep-21f,  0x1.b43528p-19f,  0x1.040bfep-17f,  0x1.64840cp-16f,
    0x1.6f0068p-15f,  0x1.15df66p-14f,  0x1.743e96p-14f,  0x1.47ae16p-13f,
    0x1.19ce0ap-12f,  0x1.8fc506p-12f,  0x1.02de02p-11f,  0x1.3dd982p-11f,
    0x1.78d5p-11f,    0x1.b3d07cp-11f,  0x1.eecbfep-11f,  0x1.4fdf3ap-10f,
    0x1.e353f8p-10f,  0x1.3b645ap-9f,   0x1.851eb8p-9f,   0x1.ced914p-9f,
    0x1.0c49bap-8f,   0x1.3126e8p-8f,   0x1.56041ap-8f,   0x1.7ae148p-8f,
    0x1.9fbe76p-8f,   0x1.c49ba6p-8f,   0x1.e978d4p-8f,   0x1.072b02p-7f,
    0x1.19999ap-7f,   0x1.2c083p-7f,    0x1.3e76c8p-7f,   0x1.75c29p-7f,
    0x1.d1eb86p-7f,   0x1.170a3ep-6f,   0x1.451ebap-6f,   0x1.733334p-6f,
    0x1.a147aep-6f,   0x1.cf5c2ap-6f,   0x1.fd70a4p-6f,   0x1.15c29p-5f,
    0x1.2ccccep-5f,   0x1.43d70ap-5f,   0x1.5ae146p-5f,   0x1.71eb86p-5f,
    0x1.88f5c2p-5f,   0x1.ap-5f,        0x1.b70a3ep-5f,   0x1.ce147ap-5f,
    0x1.e51ebap-5f,   0x1.fc28f6p-5f,   0x1.09999ap-4f,   0x1.151ebap-4f,
    0x1.20a3d6p-4f,   0x1.2c28f6p-4f,   0x1.37ae14p-4f,   0x1.433334p-4f,
    0x1.4eb854p-4f,   0x1.5a3d7p-4f,    0x1.65c29p-4f,    0x1.7147aep-4f,
    0x1.7ccccep-4f,   0x1.8851eep-4f,   0x1.93d70ap-4f,   0x1.b66668p-4f,
    0x1.fp-4f,        0x1.14ccccp-3f,   0x1.31999ap-3f,   0x1.4e6666p-3f,
    0x1.6b3334p-3f,   0x1.88p-3f,       0x1.a4ccccp-3f,   0x1.c1999ap-3f,
    0x1.de6666p-3f,   0x1.fb3332p-3f,   0x1.0cp-2f,       0x1.1a6668p-2f,
    0x1.28ccccp-2f,   0x1.373334p-2f,   0x1.459998p-2f,   0x1.54p-2f,
    0x1.626666p-2f,   0x1.70ccccp-2f,   0x1.7f3334p-2f,   0x1.8d9998p-2f,
    0x1.9cp-2f,       0x1.aa6666p-2f,   0x1.b8ccccp-2f,   0x1.c73334p-2f,
    0x1.d59998p-2f,   0x1.e4p-2f,       0x1.f26664p-2f,   0x1.006666p-1f,
    0x1.079998p-1f,   0x1.0eccccp-1f,   0x1.16p-1f,       0x1.1d3334p-1f,
    0x1.246668p-1f,   0x1.2b999ap-1f,   0x1.32ccccp-1f,   0x1.3ap-1f,
    0x1.413334p-1f,   0x1.486668p-1f,   0x1.4f999ap-1f,   0x1.56ccccp-1f,
    0x1.5ep-1f,       0x1.653334p-1f,   0x1.6c6668p-1f,   0x1.73999ap-1f,
    0x1.7accccp-1f,   0x1.82p-1f,       0x1.893334p-1f,   0x1.906666p-1f,
    0x1.97999ap-1f,   0x1.9eccccp-1f,   0x1.a6p-1f,       0x1.ad3334p-1f,
    0x1.b46666p-1f,   0x1.bb999ap-1f,   0x1.c2ccccp-1f,   0x1.cap-1f,
    0x1.d13334p-1f,   0x1.d86666p-1f,   0x1.df999ap-1f,   0x1.e6ccccp-1f,
    0x1.eep-1f,       0x1.f53334p-1f,   0x1.fc6666p-1f,   0x1.0p+0f,
};

namespace {

constexpr int64_t pad4(int64_t b) {
  return (b + 3) / 4 * 4;
}

// The index of the nearest of `table`'s values to x: how many midpoints of neighbouring values
// lie below x (torch.bucketize, right=False: a value on a midpoint takes the lower index).
template <size_t N>
uint8_t nearest(const float (&table)[N], float x) {
  size_t lo = 0, hi = N - 1;  // binary search over the N - 1 midpoints
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    const float bound = (table[mid] + table[mid + 1]) / 2.0f;
    if (bound < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return static_cast<uint8_t>(lo);
}

// bitsandbytes' blockwise step: per block of `block` values its absmax, and each value's index in
// `table` of x * (1 / absmax) clamped to [-1, 1] (an absmax of 0 divides by 1e-38).
template <size_t N>
void quantize_blocks(const float* x, int64_t n, int64_t block, const float (&table)[N],
                     uint8_t* codes, float* absmax) {
  const int64_t blocks = (n + block - 1) / block;
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16))
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * block, i1 = std::min(n, i0 + block);
    float am = 0;
    for (int64_t i = i0; i < i1; ++i) am = std::max(am, std::fabs(x[i]));
    absmax[b] = am;
    const float inv = 1.0f / std::max(am, 1e-38f);
    for (int64_t i = i0; i < i1; ++i)
      codes[i] = nearest(table, std::clamp(x[i] * inv, -1.0f, 1.0f));
  }
}

}  // namespace

Layout layout(int64_t n, bool double_quant) {
  Layout l;
  l.n = n;
  l.blocks = (n + kBlock - 1) / kBlock;
  l.codes = 0;
  l.absmax = pad4((n + 1) / 2);
  if (double_quant) {
    l.nested_blocks = (l.blocks + kNestedBlock - 1) / kNestedBlock;
    l.offset = pad4(l.absmax + l.blocks);
    l.absmax2 = l.offset + 4;
    l.bytes = l.absmax2 + 4 * l.nested_blocks;
  } else {
    l.bytes = l.absmax + 4 * l.blocks;
  }
  REMAT_ASSERT(l.bytes == nf4_bytes(n, double_quant), "nf4 layout of {} values: {} vs {} bytes", n,
               l.bytes, nf4_bytes(n, double_quant));
  return l;
}

void quantize(const float* x, int64_t n, bool double_quant, uint8_t* out) {
  const Layout l = layout(n, double_quant);
  std::memset(out, 0, static_cast<size_t>(l.bytes));
  std::vector<uint8_t> codes(static_cast<size_t>(n + 1), nearest(kCode, 0.0f));  // odd n: pad 0.0
  std::vector<float> absmax(static_cast<size_t>(l.blocks));
  quantize_blocks(x, n, kBlock, kCode, codes.data(), absmax.data());
  for (int64_t i = 0; i < (n + 1) / 2; ++i)
    out[l.codes + i] = static_cast<uint8_t>(codes[static_cast<size_t>(2 * i)] << 4 |
                                            codes[static_cast<size_t>(2 * i + 1)]);
  if (!double_quant) {
    std::memcpy(out + l.absmax, absmax.data(), absmax.size() * 4);
    return;
  }
  double sum = 0;
  for (float a : absmax) sum += a;
  const auto offset = static_cast<float>(sum / static_cast<double>(l.blocks));
  std::vector<float> centred(absmax.size()), absmax2(static_cast<size_t>(l.nested_blocks));
  for (size_t b = 0; b < absmax.size(); ++b) centred[b] = absmax[b] - offset;
  quantize_blocks(centred.data(), l.blocks, kNestedBlock, kDynamic, out + l.absmax, absmax2.data());
  std::memcpy(out + l.offset, &offset, 4);
  std::memcpy(out + l.absmax2, absmax2.data(), absmax2.size() * 4);
}

float block_absmax(const uint8_t* packed, const Layout& l, bool double_quant, int64_t block) {
  float a;
  if (!double_quant) {
    std::memcpy(&a, packed + l.absmax + 4 * block, 4);
    return a;
  }
  float offset, absmax2;
  std::memcpy(&offset, packed + l.offset, 4);
  std::memcpy(&absmax2, packed + l.absmax2 + 4 * (block / kNestedBlock), 4);
  return kDynamic[packed[l.absmax + block]] * absmax2 + offset;
}

void dequantize(const uint8_t* packed, int64_t n, bool double_quant, int64_t first, int64_t count,
                float* out) {
  REMAT_ASSERT(first % kBlock == 0 && first >= 0 && first + count <= n,
               "nf4::dequantize: values [{}, {}) of {}, not from a block's first", first,
               first + count, n);
  const Layout l = layout(n, double_quant);
  const int64_t b0 = first / kBlock, b1 = (first + count + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (count >= (int64_t{1} << 16))
  for (int64_t b = b0; b < b1; ++b) {
    const float absmax = block_absmax(packed, l, double_quant, b);
    const int64_t i1 = std::min(first + count, (b + 1) * kBlock);
    for (int64_t k = b * kBlock; k < i1; ++k) {
      const uint8_t byte = packed[l.codes + k / 2];
      out[k - first] = kCode[k % 2 == 0 ? byte >> 4 : byte & 15] * absmax;
    }
  }
}

}  // namespace remat::nf4

namespace remat {

uint16_t bf16_bits(float x) {
  auto u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

void encode_weight(DType dtype, const float* x, int64_t n, void* out) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(out, x, static_cast<size_t>(n) * 4);
      return;
    case DType::BF16: {
      auto* o = static_cast<uint16_t*>(out);
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16))
      for (int64_t i = 0; i < n; ++i) o[i] = bf16_bits(x[i]);
      return;
    }
    case DType::NF4:
    case DType::NF4DQ:
      nf4::quantize(x, n, dtype == DType::NF4DQ, static_cast<uint8_t*>(out));
      return;
    case DType::I32:
      break;
  }
  REMAT_ASSERT(false, "encode_weight: a weight is not {}", dtype_name(dtype));
}

void decode_weight(DType dtype, const void* stored, int64_t n, int64_t first, int64_t count,
                   float* out) {
  REMAT_ASSERT(first >= 0 && first + count <= n, "decode_weight: values [{}, {}) of {}", first,
               first + count, n);
  switch (dtype) {
    case DType::F32:
      std::memcpy(out, static_cast<const float*>(stored) + first, static_cast<size_t>(count) * 4);
      return;
    case DType::BF16: {
      const uint16_t* s = static_cast<const uint16_t*>(stored) + first;
#pragma omp parallel for schedule(static) if (count >= (int64_t{1} << 16))
      for (int64_t i = 0; i < count; ++i) out[i] = bf16_value(s[i]);
      return;
    }
    case DType::NF4:
    case DType::NF4DQ:
      nf4::dequantize(static_cast<const uint8_t*>(stored), n, dtype == DType::NF4DQ, first, count,
                      out);
      return;
    case DType::I32:
      break;
  }
  REMAT_ASSERT(false, "decode_weight: a weight is not {}", dtype_name(dtype));
}

}  // namespace remat
