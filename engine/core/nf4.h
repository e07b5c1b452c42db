// A frozen base weight stored below f32 (docs/lora.md, lora.base): bf16, or bitsandbytes' 4-bit
// NormalFloat (NF4, QLoRA). Host-side encoding (at load) and decoding (the CPU GEMM's per-op copy,
// the tests); the CUDA decoder is engine/cuda/nf4.cu, which reads the same layout.
//
// NF4, as bitsandbytes' quantize_4bit(quant_type="nf4", blocksize=64) defines it: the weight,
// flattened row-major, is cut into blocks of 64 (the last may be shorter); each block keeps its
// absmax = max |x|, each value the index of the nearest of the 16 NF4 values to x * (1 / absmax)
// clamped to [-1, 1] (nearest by the midpoints of neighbouring values, a value on a midpoint taking
// the lower index, as torch.bucketize), two indices a byte with the first in the high nibble (an
// odd count pads the index of 0.0). Decoded: nf4[q] * absmax, in f32.
// With double quantisation (lora.double_quant, bitsandbytes' compress_statistics) the absmaxes are
// themselves quantised: offset = their mean, and absmax - offset is quantised in blocks of 256 to
// the index of the nearest of the 256 values of bitsandbytes' signed 8-bit dynamic map, with an f32
// absmax per 256 (quantize_blockwise). Decoded: dyn[qa] * absmax2 + offset.
// The offset is the mean computed in double and rounded once; torch's f32 mean can differ by an ulp
// (in tests/golden/nf4/golden.json, made by scripts/nf4_golden.py, it agrees).
//
// Layout of n values in one buffer (DType::NF4 / NF4DQ, engine/core/tensor.h): the packed codes
// (ceil(n/2) bytes), padded to 4 bytes; then NF4: absmax f32[nb]; NF4DQ: qabsmax u8[nb], padded to
// 4, offset f32, absmax2 f32[ceil(nb/256)]. nb = ceil(n/64).
#pragma once

#include <bit>
#include <cstdint>

#include "engine/core/tensor.h"

namespace remat::nf4 {

inline constexpr int64_t kBlock = 64;         // values per absmax
inline constexpr int64_t kNestedBlock = 256;  // absmaxes per nested absmax (double quant)

/// bitsandbytes' NF4 values (functional.get_4bit_type("nf4")), ascending.
extern const float kCode[16];
/// bitsandbytes' signed 8-bit dynamic map (functional.create_dynamic_map()), ascending.
extern const float kDynamic[256];

/// Where the parts of an n-value buffer lie (byte offsets into it).
struct Layout {
  int64_t n = 0, blocks = 0, nested_blocks = 0;
  int64_t codes = 0;    // ceil(n/2) bytes
  int64_t absmax = 0;   // f32[blocks] (NF4) or u8[blocks] (NF4DQ)
  int64_t offset = 0;   // NF4DQ: f32
  int64_t absmax2 = 0;  // NF4DQ: f32[nested_blocks]
  int64_t bytes = 0;
};
Layout layout(int64_t n, bool double_quant);

/// Quantises n f32 values into `out` (layout(n, double_quant).bytes bytes).
void quantize(const float* x, int64_t n, bool double_quant, uint8_t* out);

/// The f32 absmax of block `block`: stored (NF4), or decoded from the nested state (NF4DQ).
float block_absmax(const uint8_t* packed, const Layout& l, bool double_quant, int64_t block);

/// Decodes values [first, first + count) of the n values in `packed` into out[0, count); `first`
/// is a multiple of kBlock. Parallel over blocks (OpenMP); each value depends on its block alone.
void dequantize(const uint8_t* packed, int64_t n, bool double_quant, int64_t first, int64_t count,
                float* out);

}  // namespace remat::nf4

namespace remat {

/// f32 -> bf16, rounded to nearest even (a NaN stays a NaN).
uint16_t bf16_bits(float x);
inline float bf16_value(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

/// Stores n f32 values as `dtype` (F32, BF16, NF4, NF4DQ) into host bytes of Tensor::bytes().
void encode_weight(DType dtype, const float* x, int64_t n, void* out);
/// Decodes values [first, first + count) of a stored weight of n values into f32 (first a
/// multiple of 64 for NF4).
void decode_weight(DType dtype, const void* stored, int64_t n, int64_t first, int64_t count,
                   float* out);

}  // namespace remat
