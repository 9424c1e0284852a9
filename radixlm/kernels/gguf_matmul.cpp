// GGUF's block formats computed as they are stored (see gguf_quant.py for the Python side).
//
// A weight matrix [N, K] is N rows of K / QK blocks, each block the bytes ggml writes for QK
// weights (QK 32 for Q4_0..Q8_0, 256 for the K-quants), decoded with the formulas of ggml's
// dequantize_row_* (bit for bit), in groups of 32 codes (AVX2) or by a scalar loop:
// - few activation rows (decode): each weight row's codes become floats in registers and meet
//   the float32 activation rows in FMAs, the weights read once for all rows; work is split over
//   output rows;
// - many rows (prefill, big batches): tiles of weight rows are decoded to float and multiplied
//   with at::mm, the decode paid once per tile.
// Both are the float product of the activations with the decoded weights, so a row's result
// depends on its step's row count only by float32 rounding. (llama.cpp rounds activations to
// int8 per 32 values for integer dots: a rounding that flips on a 1e-6 difference, so the same
// row computed in a step of 1 and of 40 rows, or after a cached prefix, drifted by ~0.1 in its
// logprobs and changed greedy text.)
// AVX2 (and so AVX-512) CPUs take the vector code; others a plain loop over decoded rows.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

// ggml's type ids
enum : int64_t { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

struct Format {
  int64_t block;  // weights per block
  int64_t bytes;  // bytes per block
};

Format format_of(int64_t type) {
  switch (type) {
    case Q4_0: return {32, 18};
    case Q4_1: return {32, 20};
    case Q5_0: return {32, 22};
    case Q5_1: return {32, 24};
    case Q8_0: return {32, 34};
    case Q4_K: return {256, 144};
    case Q5_K: return {256, 176};
    case Q6_K: return {256, 210};
    default: TORCH_CHECK(false, "gguf kernels: no kernel for ggml type ", type);
  }
}

inline float half(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return c10::detail::fp16_ieee_to_fp32_value(bits);
}

inline void scale_min_k4(int j, const uint8_t* q, int& d, int& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

#if defined(__AVX2__)
// byte j of the result is 0xFF where bit j of the 32 bits at `x` is set (ggml's trick)
inline __m256i bits_to_bytes(const uint8_t* x) {
  uint32_t bits;
  std::memcpy(&bits, x, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(int(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
  return _mm256_cmpeq_epi8(_mm256_or_si256(spread, mask), _mm256_set1_epi64x(-1));
}

// 16 bytes of nibbles -> 32 codes: the low nibbles, then the high ones
inline __m256i nibbles(const uint8_t* qs) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i low = _mm_set1_epi8(0xF);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), low), _mm_and_si128(b, low));
}

// A block's weights as groups of 32 codes: `emit(q, sub, s_lo, s_hi, m, j)` for the codes `q`
// (32 bytes; signed for Q8_0) of weights j..j+31, which are s * (q - sub) + m with s_lo for
// the first 16 and s_hi for the rest. The vector form of decode_block's formulas.
template <int64_t T, typename Emit>
inline void groups_avx2(const uint8_t* b, Emit&& emit) {
  const __m256i low = _mm256_set1_epi8(0xF);
  if constexpr (T == Q4_0 || T == Q4_1) {
    const float d = half(b);
    if constexpr (T == Q4_1) emit(nibbles(b + 4), 0, d, d, half(b + 2), 0);
    else emit(nibbles(b + 2), 8, d, d, 0.f, 0);
  } else if constexpr (T == Q5_0 || T == Q5_1) {
    const uint8_t* p = b + (T == Q5_1 ? 4 : 2);
    const __m256i high = _mm256_and_si256(bits_to_bytes(p), _mm256_set1_epi8(0x10));
    const float d = half(b);
    emit(_mm256_or_si256(nibbles(p + 4), high), T == Q5_1 ? 0 : 16, d, d,
         T == Q5_1 ? half(b + 2) : 0.f, 0);
  } else if constexpr (T == Q8_0) {
    const float d = half(b);
    emit(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), 0, d, d, 0.f, 0);
  } else if constexpr (T == Q4_K || T == Q5_K) {
    const float d = half(b), dmin = half(b + 2);
    const uint8_t* scales = b + 4;
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
    const uint8_t* ql = b + (T == Q5_K ? 48 : 16);
    for (int j = 0, is = 0; j < 256; j += 64, is += 2, ql += 32) {
      int sc, m;
      scale_min_k4(is, scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(is + 1, scales, sc, m);
      const float d2 = d * sc, m2 = dmin * m;
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      __m256i lo = _mm256_and_si256(bytes, low);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
      if constexpr (T == Q5_K) {
        const __m256i u1 = _mm256_set1_epi8(char(1 << (j / 32)));
        const __m256i u2 = _mm256_set1_epi8(char(2 << (j / 32)));
        const __m256i sixteen = _mm256_set1_epi8(16);
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, u1), u1), sixteen));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, u2), u2), sixteen));
      }
      emit(lo, 0, d1, d1, -m1, j);
      emit(hi, 0, d2, d2, -m2, j + 32);
    }
  } else if constexpr (T == Q6_K) {
    const uint8_t* ql = b;
    const uint8_t* qhp = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = half(b + 208);
    const __m256i two = _mm256_set1_epi8(0x30);
    for (int n = 0; n < 256; n += 128, ql += 64, qhp += 32, sc += 8) {
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qhp));
      // NOTE: 16-bit shifts move bits across bytes; the masks keep each byte's own
      emit(_mm256_or_si256(_mm256_and_si256(l0, low), _mm256_and_si256(_mm256_slli_epi16(qh, 4), two)),
           32, d * sc[0], d * sc[1], 0.f, n);
      emit(_mm256_or_si256(_mm256_and_si256(l1, low), _mm256_and_si256(_mm256_slli_epi16(qh, 2), two)),
           32, d * sc[2], d * sc[3], 0.f, n + 32);
      emit(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low), _mm256_and_si256(qh, two)),
           32, d * sc[4], d * sc[5], 0.f, n + 64);
      emit(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), two)),
           32, d * sc[6], d * sc[7], 0.f, n + 96);
    }
  }
}

// 32 codes -> 4 x 8 floats (the codes themselves; Q8_0's signed)
template <int64_t T>
inline void code_floats(__m256i q, __m256* f) {
  const __m128i parts[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
  for (int h = 0; h < 2; ++h)
    for (int e = 0; e < 2; ++e) {
      const __m128i eight = e == 0 ? parts[h] : _mm_srli_si128(parts[h], 8);
      f[2 * h + e] = _mm256_cvtepi32_ps(T == Q8_0 ? _mm256_cvtepi8_epi32(eight) : _mm256_cvtepu8_epi32(eight));
    }
}

template <int64_t T>
inline void decode_avx2(const uint8_t* b, float* __restrict y) {
  groups_avx2<T>(b, [&](__m256i q, int sub, float s_lo, float s_hi, float m, int j) {
    __m256 f[4];
    code_floats<T>(q, f);
    const __m256 offset = _mm256_set1_ps(float(sub)), add = _mm256_set1_ps(m);
    for (int i = 0; i < 4; ++i) {
      // NOTE: float(q - sub) exactly, then multiply and add: the scalar formulas' rounding
      const __m256 scale = _mm256_set1_ps(i < 2 ? s_lo : s_hi);
      const __m256 w = _mm256_mul_ps(_mm256_sub_ps(f[i], offset), scale);
      _mm256_storeu_ps(y + j + 8 * i, _mm256_add_ps(w, add));
    }
  });
}

// res[m] = row . x[m] for `rows` float32 activation rows (kRows: their number, 0 when not
// fixed): per group of 32 codes q (weights s (q - sub) + m), s_lo times the sum of (q - sub) x
// over its first 16, s_hi times that over the rest, plus m times the sum of x (`xsums`, per 32
// values of each row).
template <int64_t T, int kRows>
inline void dot_avx2(const uint8_t* row, int64_t k, const float* x, const float* xsums, int rows,
                     float* res) {
  constexpr int64_t QK = (T == Q4_K || T == Q5_K || T == Q6_K) ? 256 : 32;
  const int64_t bytes = format_of(T).bytes;
  const int n = kRows > 0 ? kRows : rows;
  __m256 acc[8];
  float fixed[8];
  for (int m = 0; m < n; ++m) acc[m] = _mm256_setzero_ps(), fixed[m] = 0.f;
  for (int64_t i = 0; i < k / QK; ++i) {
    groups_avx2<T>(row + i * bytes, [&](__m256i q, int sub, float s_lo, float s_hi, float mm, int j) {
      const int64_t base = i * QK + j;
      __m256 w[4];
      code_floats<T>(q, w);
      if (sub != 0) {
        const __m256 offset = _mm256_set1_ps(float(sub));
        for (int e = 0; e < 4; ++e) w[e] = _mm256_sub_ps(w[e], offset);
      }
      const __m256 lo_scale = _mm256_set1_ps(s_lo), hi_scale = _mm256_set1_ps(s_hi);
      for (int m = 0; m < n; ++m) {
        const float* xs = x + m * k + base;
        __m256 lo = _mm256_mul_ps(w[0], _mm256_loadu_ps(xs));
        lo = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xs + 8), lo);
        __m256 hi = _mm256_mul_ps(w[2], _mm256_loadu_ps(xs + 16));
        hi = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xs + 24), hi);
        acc[m] = _mm256_fmadd_ps(hi, hi_scale, _mm256_fmadd_ps(lo, lo_scale, acc[m]));
        if (mm != 0.f) fixed[m] += mm * xsums[(m * k + base) / 32];
      }
    });
  }
  for (int m = 0; m < n; ++m) {
    const __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc[m]), _mm256_extractf128_ps(acc[m], 1));
    const __m128 p = _mm_add_ps(v, _mm_movehl_ps(v, v));
    res[m] = _mm_cvtss_f32(_mm_add_ss(p, _mm_shuffle_ps(p, p, 1))) + fixed[m];
  }
}

// dot_avx2 for the packed-nibble formats (Q4_0, Q4_1, Q4_K) and Q8_0, without groups_avx2's
// byte shuffles: 8 bytes widened to 8 int32 lanes give 8 weights in their low nibbles and the
// 8 weights 16 (32 for Q4_K) further in their high ones, one shuffle for 16 weights (Q8_0:
// 8 signed codes a shuffle).
template <int64_t T, int kRows>
inline void dot_nibbles_avx2(const uint8_t* row, int64_t k, const float* x, const float* xsums,
                             int rows, float* res) {
  constexpr int64_t QK = T == Q4_K ? 256 : 32;
  const int64_t bytes = format_of(T).bytes;
  const int n = kRows > 0 ? kRows : rows;
  const __m256i low = _mm256_set1_epi32(0xF);
  __m256 acc[8];
  float fixed[8];
  for (int m = 0; m < n; ++m) acc[m] = _mm256_setzero_ps(), fixed[m] = 0.f;
  // 32 packed bytes at `q` (Q4_K) or 16 (Q4_0/1, `chunks` 2): low nibbles are the weights at
  // `base`, high ones those `far` further, scaled by d_lo and d_hi; mins by m_lo and m_hi
  auto run = [&](const uint8_t* q, int chunks, int64_t base, int64_t far, float d_lo, float d_hi,
                 float m_lo, float m_hi) {
    __m256 t_lo[8], t_hi[8];
    for (int m = 0; m < n; ++m) t_lo[m] = _mm256_setzero_ps(), t_hi[m] = _mm256_setzero_ps();
    for (int c = 0; c < chunks; ++c) {
      const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * c)));
      const __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(b, low));
      const __m256 hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
      for (int m = 0; m < n; ++m) {
        const float* xs = x + m * k + base + 8 * c;
        t_lo[m] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(xs), t_lo[m]);
        t_hi[m] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(xs + far), t_hi[m]);
      }
    }
    const __m256 dl = _mm256_set1_ps(d_lo), dh = _mm256_set1_ps(d_hi);
    for (int m = 0; m < n; ++m) {
      acc[m] = _mm256_fmadd_ps(t_hi[m], dh, _mm256_fmadd_ps(t_lo[m], dl, acc[m]));
      const float* sums = xsums + (m * k + base) / 32;
      fixed[m] += T == Q4_K ? m_lo * sums[0] + m_hi * sums[far / 32] : m_lo * sums[0];
    }
  };
  for (int64_t i = 0; i < k / QK; ++i) {
    const uint8_t* b = row + i * bytes;
    const float d = half(b);
    if constexpr (T == Q8_0) {  // NOTE: signed codes, widened 8 at a time; no minimum
      __m256 t[8];
      for (int m = 0; m < n; ++m) t[m] = _mm256_setzero_ps();
      for (int c = 0; c < 4; ++c) {
        const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * c));
        const __m256 w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
        for (int m = 0; m < n; ++m)
          t[m] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + m * k + i * QK + 8 * c), t[m]);
      }
      const __m256 dv = _mm256_set1_ps(d);
      for (int m = 0; m < n; ++m) acc[m] = _mm256_fmadd_ps(t[m], dv, acc[m]);
    } else if constexpr (T == Q4_0) {
      run(b + 2, 2, i * QK, 16, d, d, -8.f * d, 0.f);
    } else if constexpr (T == Q4_1) {
      run(b + 4, 2, i * QK, 16, d, d, half(b + 2), 0.f);
    } else {
      const float dmin = half(b + 2);
      const uint8_t* ql = b + 16;
      for (int j = 0, is = 0; j < 256; j += 64, is += 2, ql += 32) {
        int sc, mn;
        scale_min_k4(is, b + 4, sc, mn);
        const float d1 = d * sc, m1 = dmin * mn;
        scale_min_k4(is + 1, b + 4, sc, mn);
        run(ql, 4, i * QK + j, 32, d1, d * sc, -m1, -dmin * mn);
      }
    }
  }
  for (int m = 0; m < n; ++m) {
    const __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc[m]), _mm256_extractf128_ps(acc[m], 1));
    const __m128 p = _mm_add_ps(v, _mm_movehl_ps(v, v));
    res[m] = _mm_cvtss_f32(_mm_add_ss(p, _mm_shuffle_ps(p, p, 1))) + fixed[m];
  }
}
#endif

// One block at `b` -> `y[block]` float32.
template <int64_t T>
inline void decode_block(const uint8_t* b, float* __restrict y) {
#if defined(__AVX2__)
  return decode_avx2<T>(b, y);
#endif
  if constexpr (T == Q4_0 || T == Q4_1) {
    const float d = half(b);
    const uint8_t* qs = b + (T == Q4_1 ? 4 : 2);
    if constexpr (T == Q4_1) {
      const float m = half(b + 2);
      for (int j = 0; j < 16; ++j) y[j] = d * float(qs[j] & 0xF) + m;
      for (int j = 0; j < 16; ++j) y[j + 16] = d * float(qs[j] >> 4) + m;
    } else {
      for (int j = 0; j < 16; ++j) y[j] = d * float((qs[j] & 0xF) - 8);
      for (int j = 0; j < 16; ++j) y[j + 16] = d * float((qs[j] >> 4) - 8);
    }
  } else if constexpr (T == Q5_0 || T == Q5_1) {
    const float d = half(b);
    const float m = T == Q5_1 ? half(b + 2) : 0.f;
    const int offset = T == Q5_1 ? 0 : 16;
    const uint8_t* p = b + (T == Q5_1 ? 4 : 2);
    uint32_t qh;
    std::memcpy(&qh, p, 4);
    const uint8_t* qs = p + 4;
    for (int j = 0; j < 16; ++j)
      y[j] = d * float(int((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10)) - offset) + m;
    for (int j = 0; j < 16; ++j)
      y[j + 16] = d * float(int((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - offset) + m;
  } else if constexpr (T == Q8_0) {
    const float d = half(b);
    const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
    for (int j = 0; j < 32; ++j) y[j] = d * float(qs[j]);
  } else if constexpr (T == Q4_K || T == Q5_K) {
    const float d = half(b), dmin = half(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* qh = b + 16;                             // Q5_K only
    const uint8_t* ql = b + (T == Q5_K ? 48 : 16);
    for (int j = 0, is = 0; j < 256; j += 64, is += 2, ql += 32) {
      int sc, m;
      scale_min_k4(is, scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(is + 1, scales, sc, m);
      const float d2 = d * sc, m2 = dmin * m;
      const int u1 = 1 << (j / 32), u2 = 2 << (j / 32);
      for (int l = 0; l < 32; ++l) {
        int lo = ql[l] & 0xF, hi = ql[l] >> 4;
        if constexpr (T == Q5_K) {
          lo += (qh[l] & u1) ? 16 : 0;
          hi += (qh[l] & u2) ? 16 : 0;
        }
        y[j + l] = d1 * float(lo) - m1;
        y[j + 32 + l] = d2 * float(hi) - m2;
      }
    }
  } else if constexpr (T == Q6_K) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = half(b + 208);
    for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, sc += 8) {
      // NOTE: 16 weights share a scale: loops of 16 with it fixed vectorise
      for (int half16 = 0; half16 < 2; ++half16) {
        const int o = 16 * half16;
        const float s1 = d * sc[half16], s2 = d * sc[half16 + 2];
        const float s3 = d * sc[half16 + 4], s4 = d * sc[half16 + 6];
        for (int l = o; l < o + 16; ++l)
          y[n + l] = s1 * float(int((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
        for (int l = o; l < o + 16; ++l)
          y[n + l + 32] = s2 * float(int((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
        for (int l = o; l < o + 16; ++l)
          y[n + l + 64] = s3 * float(int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        for (int l = o; l < o + 16; ++l)
          y[n + l + 96] = s4 * float(int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      }
    }
  }
}

template <int64_t T>
void decode_rows(const uint8_t* raw, int64_t row_bytes, int64_t rows, int64_t k, float* out) {
  constexpr int64_t QK = (T == Q4_K || T == Q5_K || T == Q6_K) ? 256 : 32;
  const int64_t bytes = format_of(T).bytes;
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t i = 0; i < k / QK; ++i)
        decode_block<T>(raw + r * row_bytes + i * bytes, out + r * k + i * QK);
  });
}

// out[m, n] = sum_k x[m, k] w[n, k] for M <= kFewRows rows of float32 x.
constexpr int64_t kFewRows = 8;

template <typename F>
inline void with_rows(int64_t rows, F&& f) {
  switch (rows) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default: TORCH_CHECK(false, "gguf kernels: ", rows, " rows is not a few-rows step");
  }
}

template <int64_t T>
void few_rows(const float* x, int64_t m_rows, int64_t k, const uint8_t* raw, int64_t row_bytes,
              int64_t n_rows, float* out) {
  constexpr int64_t QK = (T == Q4_K || T == Q5_K || T == Q6_K) ? 256 : 32;
  const int64_t bytes = format_of(T).bytes;
#if defined(__AVX2__)
  std::vector<float> xsums(m_rows * k / 32, 0.f);
  for (int64_t b = 0; b < m_rows * k / 32; ++b)
    for (int j = 0; j < 32; ++j) xsums[b] += x[b * 32 + j];
  at::parallel_for(0, n_rows, 8, [&](int64_t begin, int64_t end) {
    float res[kFewRows];
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* row = raw + n * row_bytes;
      // NOTE: the row count fixed at compile time keeps each row's accumulators in registers
      with_rows(m_rows, [&](auto rows) {
        constexpr int kRows = decltype(rows)::value;
        if constexpr (T == Q4_0 || T == Q4_1 || T == Q4_K || T == Q8_0)
          dot_nibbles_avx2<T, kRows>(row, k, x, xsums.data(), kRows, res);
        else
          dot_avx2<T, kRows>(row, k, x, xsums.data(), kRows, res);
      });
      for (int64_t m = 0; m < m_rows; ++m) out[m * n_rows + n] = res[m];
    }
  });
#else
  at::parallel_for(0, n_rows, 8, [&](int64_t begin, int64_t end) {
    // NOTE: a whole row decoded, then one long dot per activation row (a short dot per
    // block pays a horizontal sum every 32 weights)
    std::vector<float> buffer(k);
    float* __restrict w = buffer.data();
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* row = raw + n * row_bytes;
      for (int64_t i = 0; i < k / QK; ++i) decode_block<T>(row + i * bytes, w + i * QK);
      for (int64_t m = 0; m < m_rows; ++m) {
        const float* xs = x + m * k;
        float s = 0.f;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < k; ++j) s += w[j] * xs[j];
        out[m * n_rows + n] = s;
      }
    }
  });
#endif
}

template <typename F>
void dispatch(int64_t type, F&& f) {
  switch (type) {
    case Q4_0: return f(std::integral_constant<int64_t, Q4_0>{});
    case Q4_1: return f(std::integral_constant<int64_t, Q4_1>{});
    case Q5_0: return f(std::integral_constant<int64_t, Q5_0>{});
    case Q5_1: return f(std::integral_constant<int64_t, Q5_1>{});
    case Q8_0: return f(std::integral_constant<int64_t, Q8_0>{});
    case Q4_K: return f(std::integral_constant<int64_t, Q4_K>{});
    case Q5_K: return f(std::integral_constant<int64_t, Q5_K>{});
    case Q6_K: return f(std::integral_constant<int64_t, Q6_K>{});
    default: format_of(type);  // raises
  }
}

void check_raw(const at::Tensor& raw, int64_t type, int64_t k) {
  TORCH_CHECK(raw.dim() == 2 && raw.scalar_type() == at::kByte && raw.is_contiguous(),
              "gguf kernels: raw blocks must be contiguous uint8 [N, row bytes]");
  const Format f = format_of(type);
  TORCH_CHECK(k % f.block == 0 && raw.size(1) == k / f.block * f.bytes, "gguf kernels: rows of ",
              raw.size(1), " bytes do not hold ", k, " weights of type ", type);
}

// raw [N, row bytes] of ggml type `type` -> [N, cols] in `dtype`.
at::Tensor gguf_dequantize(const at::Tensor& raw, int64_t type, int64_t cols, at::ScalarType dtype) {
  check_raw(raw, type, cols);
  auto out = at::empty({raw.size(0), cols}, raw.options().dtype(at::kFloat));
  dispatch(type, [&](auto t) {
    decode_rows<decltype(t)::value>(raw.data_ptr<uint8_t>(), raw.size(1), raw.size(0), cols,
                                    out.data_ptr<float>());
  });
  return dtype == at::kFloat ? out : out.to(dtype);
}

// x [M, K] @ w.T, w the raw blocks [N, row bytes] -> [M, N] in x's dtype (float32 inside).
at::Tensor gguf_matmul(const at::Tensor& x, const at::Tensor& raw, int64_t type) {
  TORCH_CHECK(x.dim() == 2, "gguf_matmul: x must be [M, K]");
  const int64_t m_rows = x.size(0), k = x.size(1), n_rows = raw.size(0);
  check_raw(raw, type, k);
  const auto xf = x.to(at::kFloat).contiguous();
  auto out = at::empty({m_rows, n_rows}, x.options().dtype(at::kFloat));
  if (m_rows == 0) {  // NOTE: e.g. the head of a step whose prompt chunk needs no logits
  } else if (m_rows <= kFewRows) {
    dispatch(type, [&](auto t) {
      few_rows<decltype(t)::value>(xf.data_ptr<float>(), m_rows, k, raw.data_ptr<uint8_t>(),
                                   raw.size(1), n_rows, out.data_ptr<float>());
    });
  } else {
    // NOTE: ~4 MB of float32 weights a tile: decoded once, out of the GEMM's way in L2/L3
    const int64_t tile = std::max<int64_t>(16, (int64_t(1) << 20) / k);
    auto weights = at::empty({std::min(tile, n_rows), k}, xf.options());
    for (int64_t n0 = 0; n0 < n_rows; n0 += tile) {
      const int64_t n = std::min(tile, n_rows - n0);
      auto w = weights.narrow(0, 0, n);
      dispatch(type, [&](auto t) {
        decode_rows<decltype(t)::value>(raw.data_ptr<uint8_t>() + n0 * raw.size(1), raw.size(1),
                                        n, k, w.data_ptr<float>());
      });
      out.narrow(1, n0, n).copy_(at::mm(xf, w.t()));
    }
  }
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixlm_cpu, m) {
  m.def("gguf_dequantize(Tensor raw, int type, int cols, ScalarType dtype) -> Tensor");
  m.def("gguf_matmul(Tensor x, Tensor raw, int type) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm_cpu, CPU, m) {
  m.impl("gguf_dequantize", &gguf_dequantize);
  m.impl("gguf_matmul", &gguf_matmul);
}
