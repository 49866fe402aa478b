// AVX2 + FMA kernels (8 lanes). Compiled with -mavx2 -mfma; called only when CPUID reports both.

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tandem/kernels/bf16_rounding.h"
#include "tandem/optim/cpu_update.h"
#include "tandem/optim/q8_codes.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace tandem::detail {
namespace {

#include "tandem/optim/cpu_update_kernels.inc"

struct Avx2Lanes {
  static constexpr int W = 8;
  using F = __m256;
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static F load_bf16(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  // bf16 bits in the low half of each 32-bit lane; `bias` is added to finite normal values.
  static __m256i bf16_lanes(F x, __m256i bias) {
    const __m256i b = _mm256_castps_si256(x);
    const __m256i hi = _mm256_srli_epi32(b, 16);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, bias), 16);
    const __m256i nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
    const __m256i tiny = _mm256_cmpeq_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7F800000)), _mm256_setzero_si256());
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x0040)), nan);
    return _mm256_blendv_epi8(r, _mm256_and_si256(hi, _mm256_set1_epi32(0x8000)), tiny);
  }
  static __m256i rne_bias(F x) {
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 16), _mm256_set1_epi32(1));
    return _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF));
  }
  static __m128i pack(__m256i r) {
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8));
  }
  static void store_bf16(uint16_t* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), pack(bf16_lanes(x, rne_bias(x))));
  }
  static void stream_bf16(uint16_t* p, F x) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), pack(bf16_lanes(x, rne_bias(x))));
  }
  static __m256i mul32(__m256i a, uint32_t k) { return _mm256_mullo_epi32(a, _mm256_set1_epi32(static_cast<int>(k))); }
  static __m256i random(uint32_t idx, uint32_t seed) {
    __m256i x = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(idx)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    x = _mm256_xor_si256(mul32(x, 0x9E3779B1u), _mm256_set1_epi32(static_cast<int>(seed)));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = mul32(x, 0x7FEB352Du);
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = mul32(x, 0x846CA68Bu);
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  }
  static void store_bf16_sr(uint16_t* p, F x, uint32_t idx, uint32_t seed) {
    const __m256i bias = _mm256_and_si256(random(idx, seed), _mm256_set1_epi32(0xFFFF));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), pack(bf16_lanes(x, bias)));
  }
  static void store_bf16_rz(uint16_t* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), pack(bf16_lanes(x, _mm256_setzero_si256())));
  }
  static F select_eq(F a, F b, F x, F y) { return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_EQ_OQ)); }
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F sign(F x) {
    const F zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
    return _mm256_sub_ps(_mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_GT_OQ), one),
                         _mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_LT_OQ), one));
  }
  static int nonfinite(F x) {
    return __builtin_popcount(static_cast<unsigned>(
        _mm256_movemask_ps(_mm256_cmp_ps(_mm256_sub_ps(x, x), _mm256_setzero_ps(), _CMP_NEQ_UQ))));
  }
  using B = __m256i;
  static B bad_init() { return _mm256_setzero_si256(); }
  static B bad_acc(B a, const float* g) {
    const __m256i exp = _mm256_set1_epi32(0x7F800000);
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g));
    return _mm256_or_si256(a, _mm256_cmpeq_epi32(_mm256_and_si256(b, exp), exp));
  }
  static B bad_acc(B a, const uint16_t* g) {
    const __m128i exp = _mm_set1_epi16(0x7F80);
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g));
    return _mm256_or_si256(a, _mm256_zextsi128_si256(_mm_cmpeq_epi16(_mm_and_si128(b, exp), exp)));
  }
  static bool bad_any(B a) { return !_mm256_testz_si256(a, a); }
  static void sfence() { _mm_sfence(); }
  // Note [8-bit states]: the codes of q8_codes.h, 8 at a time, in the same integer steps.
  static F decode_m8(const int8_t* q, F scale) {
    const __m256i s = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
    const __m256i c = _mm256_abs_epi32(s);
    const __m256i nz = _mm256_cmpgt_epi32(c, _mm256_setzero_si256());
    const __m256i r = _mm256_and_si256(nz, _mm256_slli_epi32(_mm256_add_epi32(c, _mm256_set1_epi32(q8::kMBase)), 20));
    const __m256i x = _mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(r), scale));
    return _mm256_castsi256_ps(_mm256_xor_si256(x, _mm256_and_si256(s, _mm256_set1_epi32(INT32_MIN))));
  }
  static F decode_u8(const uint8_t* q, F scale) {
    const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
    return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(c, _mm256_set1_epi32(q8::kVBase)), 19)),
                         scale);
  }
  // The code of each lane's value / scale: its top bits, `bias` added, less the base.
  static __m256i code_with(__m256i b, int shift, __m256i bias, uint32_t base, int top) {
    const __m128i n = _mm_cvtsi32_si128(shift);
    b = _mm256_add_epi32(b, bias);
    const __m256i c = _mm256_sub_epi32(_mm256_srl_epi32(b, n), _mm256_set1_epi32(static_cast<int>(base)));
    return _mm256_min_epi32(_mm256_max_epi32(c, _mm256_setzero_si256()), _mm256_set1_epi32(top));
  }
  // Rounded to nearest even.
  static __m256i code(__m256i b, int shift, uint32_t half, uint32_t base, int top) {
    const __m256i odd = _mm256_and_si256(_mm256_srl_epi32(b, _mm_cvtsi32_si128(shift)), _mm256_set1_epi32(1));
    return code_with(b, shift, _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(half)), odd), base, top);
  }
  // Eight 32-bit lanes of byte values, in order, as eight bytes at q.
  static void store_bytes(void* q, __m256i c) {
    const __m256i order = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                                           -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i b = _mm256_shuffle_epi8(c, order);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q),
                     _mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
  }
  // m's codes from the codes of |m| / scale: negated where m is negative.
  static void store_m8(int8_t* q, F m, __m256i c) {
    const __m256i bits = _mm256_castps_si256(m);
    store_bytes(q, _mm256_blendv_epi8(c, _mm256_sub_epi32(_mm256_setzero_si256(), c), _mm256_srai_epi32(bits, 31)));
  }
  static __m256i abs_scaled(F m, F inv) {
    const F a = _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(m), _mm256_set1_epi32(0x7FFFFFFF)));
    return _mm256_castps_si256(_mm256_mul_ps(a, inv));
  }
  static void encode_m8(int8_t* q, F m, F inv) { store_m8(q, m, code(abs_scaled(m, inv), 20, 0x7FFFFu, q8::kMBase, 127)); }
  static void encode_u8(uint8_t* q, F u, F inv) {
    store_bytes(q, code(_mm256_castps_si256(_mm256_mul_ps(u, inv)), 19, 0x3FFFFu, q8::kVBase, 255));
  }
  // Note [8-bit stochastic codes]: q8::m_random_addend and u_random_addend of one hash a lane.
  static void encode8_sr(int8_t* mq, uint8_t* vq, F m, F u, F m_inv, F u_inv, uint32_t idx, uint32_t seed) {
    const __m256i r = random(idx, seed);
    const __m256i m_add = _mm256_slli_epi32(_mm256_and_si256(r, _mm256_set1_epi32(0xFFFF)), 4);
    const __m256i u_add = _mm256_slli_epi32(_mm256_srli_epi32(r, 16), 3);
    store_m8(mq, m, code_with(abs_scaled(m, m_inv), 20, m_add, q8::kMBase, 127));
    store_bytes(vq, code_with(_mm256_castps_si256(_mm256_mul_ps(u, u_inv)), 19, u_add, q8::kVBase, 255));
  }
  // The largest |x| of each lane so far, compared as the integers of the bits (q8::max_abs).
  static F max_abs(F acc, F x) {
    const __m256i a = _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7FFFFFFF));
    return _mm256_castsi256_ps(_mm256_max_epu32(_mm256_castps_si256(acc), a));
  }
  static float lanes_max(F acc) {
    alignas(32) uint32_t l[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(l), _mm256_castps_si256(acc));
    uint32_t mx = 0;
    for (uint32_t x : l) mx = x > mx ? x : mx;
    return q8::float_of(mx);
  }
};

}  // namespace

KernelTable avx2_kernels() {
  return {&update_entry<Avx2Lanes>, &to_bf16_entry<Avx2Lanes>, &split_bf16_entry<Avx2Lanes>};
}

}  // namespace tandem::detail

#else

namespace tandem::detail {
KernelTable avx2_kernels() { return {nullptr, nullptr, nullptr}; }
}  // namespace tandem::detail

#endif
