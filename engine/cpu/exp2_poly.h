// The polynomial of the vectorized 2^r, r in [-1/2, 1/2]: its Taylor series in r ln2 to degree
// 7, ln2^k / k! from k = 7 down to 0. exp2_ps (engine/cpu/vector_math.h, AVX2) and its AVX-512
// twin (engine/cpu/attention_gemm_avx512.cpp) both evaluate this one table, by FMAs in this
// order, so they give the same bits. It includes nothing, so the AVX-512 file may include it.
#pragma once

namespace remat::cpu {

inline constexpr int kExp2PolyTerms = 8;
inline constexpr float kExp2Poly[kExp2PolyTerms] = {
    1.5252733804059841e-05f,  // ln2^7 / 7!
    1.5403530393381609e-04f,  // ln2^6 / 6!
    1.3333558146428443e-03f,  // ln2^5 / 5!
    9.6181291076284772e-03f,  // ln2^4 / 4!
    5.5504108664821580e-02f,  // ln2^3 / 3!
    2.4022650695910071e-01f,  // ln2^2 / 2!
    6.9314718055994531e-01f,  // ln2
    1.0f,
};

}  // namespace remat::cpu
