// CPU kernels (see cpu_ops.py): the attention of a CPU step's few query tokens over each
// request's KV slots, argmax, and RMSNorm.
//
// Attention: one work item per (token, KV head): the item's query heads (GQA group) are held in registers,
// each key row is read once for all of them (scores into a float buffer), softmax over the
// buffer, then each value row is read once for all of them. Items run on torch's intra-op
// pool (at::parallel_for), so the step's thread count applies.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "avx2_math.h"
#include "avx512_math.h"
#include "flash_attention.h"

namespace {

using bf16 = at::BFloat16;
#if defined(__AVX512F__)
using radixlm::exp16;
using radixlm::load16;
using radixlm::tail_mask;
#elif defined(__AVX2__) && defined(__FMA__)
#define RADIXLM_AVX2 1
using radixlm::exp8;
using radixlm::hmax8;
using radixlm::hsum8;
using radixlm::load8;
using radixlm::tail_mask8;
#endif

// Where an item reads and writes; the scores buffer holds G rows of n floats.
template <typename T>
struct Item {
  const T* q;            // [G, D] the group's query heads
  const T* k;            // pool layer [S, Hkv, D], at this KV head
  const T* v;            // same
  int64_t row;           // elements from one slot to the next (Hkv * D)
  const int64_t* slots;  // [n] the slots attended to
  int64_t n;
  float scale;
  float* scores;         // [G, n]
  float* out;            // [G, D]
  float* lse;            // [G]
};

template <typename T>
void attend_scalar(const Item<T>& it, int64_t G, int64_t D) {
  for (int64_t j = 0; j < G; ++j) {
    float* s = it.scores + j * it.n;
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t l = 0; l < it.n; ++l) {
      const T* key = it.k + it.slots[l] * it.row;
      float dot = 0.f;
      for (int64_t d = 0; d < D; ++d) dot += static_cast<float>(it.q[j * D + d]) * static_cast<float>(key[d]);
      s[l] = dot * it.scale;
      top = std::max(top, s[l]);
    }
    float total = 0.f;
    for (int64_t l = 0; l < it.n; ++l) total += (s[l] = std::exp(s[l] - top));
    std::vector<float> acc(D, 0.f);
    for (int64_t l = 0; l < it.n; ++l) {
      const T* value = it.v + it.slots[l] * it.row;
      for (int64_t d = 0; d < D; ++d) acc[d] += s[l] * static_cast<float>(value[d]);
    }
    for (int64_t d = 0; d < D; ++d) it.out[j * D + d] = acc[d] / total;
    it.lse[j] = top + std::log(total);
  }
}

#if defined(__AVX512F__)
// Calls fn(l, row) with each attended slot's row of `base` as DC float vectors, in slot order;
// slots are scattered, so each row is fetched a few slots before it is read
template <typename T, int DC, typename Fn>
inline void for_each_row(const Item<T>& it, const T* base, Fn&& fn) {
  constexpr int64_t ahead = 4;
  auto prefetch = [&](int64_t l) {
    const char* row = reinterpret_cast<const char*>(base + it.slots[l] * it.row);
    for (int64_t b = 0; b < int64_t(DC * 16 * sizeof(T)); b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
  };
  for (int64_t l = 0; l < std::min(ahead, it.n); ++l) prefetch(l);
  for (int64_t l = 0; l < it.n; ++l) {
    if (l + ahead < it.n) prefetch(l + ahead);
    const T* row = base + it.slots[l] * it.row;
    __m512 x[DC];
    for (int c = 0; c < DC; ++c) x[c] = load16(row + c * 16);
    fn(l, x);
  }
}

// D = 16 * DC inputs per head, G query heads per KV head
template <typename T, int DC, int G>
void attend_avx512(const Item<T>& it) {
  constexpr int D = DC * 16;
  __m512 q[G][DC];
  for (int j = 0; j < G; ++j)
    for (int c = 0; c < DC; ++c) q[j][c] = _mm512_mul_ps(load16(it.q + j * D + c * 16), _mm512_set1_ps(it.scale));
  for_each_row<T, DC>(it, it.k, [&](int64_t l, const __m512 (&k)[DC]) {
    for (int j = 0; j < G; ++j) {
      __m512 acc = _mm512_mul_ps(q[j][0], k[0]);
      for (int c = 1; c < DC; ++c) acc = _mm512_fmadd_ps(q[j][c], k[c], acc);
      it.scores[j * it.n + l] = _mm512_reduce_add_ps(acc);
    }
  });
  float inv[G];
  for (int j = 0; j < G; ++j) {
    float* s = it.scores + j * it.n;
    __m512 top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t l = 0; l < it.n; l += 16) {
      __mmask16 m = tail_mask(it.n - l);
      top = _mm512_mask_max_ps(top, m, top, _mm512_maskz_loadu_ps(m, s + l));
    }
    const float max = _mm512_reduce_max_ps(top);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t l = 0; l < it.n; l += 16) {
      __mmask16 m = tail_mask(it.n - l);
      __m512 p = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + l), _mm512_set1_ps(max)));
      sum = _mm512_mask_add_ps(sum, m, sum, p);
      _mm512_mask_storeu_ps(s + l, m, p);
    }
    const float total = _mm512_reduce_add_ps(sum);
    inv[j] = 1.f / total;
    it.lse[j] = max + std::log(total);
  }
  __m512 acc[G][DC];
  for (int j = 0; j < G; ++j)
    for (int c = 0; c < DC; ++c) acc[j][c] = _mm512_setzero_ps();
  for_each_row<T, DC>(it, it.v, [&](int64_t l, const __m512 (&v)[DC]) {
    for (int j = 0; j < G; ++j) {
      __m512 p = _mm512_set1_ps(it.scores[j * it.n + l]);
      for (int c = 0; c < DC; ++c) acc[j][c] = _mm512_fmadd_ps(p, v[c], acc[j][c]);
    }
  });
  for (int j = 0; j < G; ++j)
    for (int c = 0; c < DC; ++c) _mm512_storeu_ps(it.out + j * D + c * 16, _mm512_mul_ps(acc[j][c], _mm512_set1_ps(inv[j])));
}

#define RADIXLM_ATTEND attend_avx512
constexpr int kLanes = 16;
#elif RADIXLM_AVX2
// Fetches row l + 4's bytes [from, from + bytes) of `base`, for a walk over scattered slots
template <typename T>
inline void prefetch_ahead(const Item<T>& it, const T* base, int64_t l, int64_t from, int64_t bytes) {
  if (l + 4 >= it.n) return;
  const char* row = reinterpret_cast<const char*>(base + it.slots[l + 4] * it.row + from);
  for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
}

constexpr int pow2_floor(int x) { return x < 2 ? 1 : 2 * pow2_floor(x / 2); }

// The AVX-512 kernel's walk in 8-float vectors. AVX2 has 16 registers: the scaled query heads
// stay in an L1 buffer, and the value pass goes over the head's dimensions in blocks of CB
// vectors (G * CB accumulators, G probabilities and a value row in registers), each pass
// reading its own cache lines of each value row.
template <typename T, int DC, int G>
void attend_avx2(const Item<T>& it) {
  constexpr int D = DC * 8, CB = std::min(DC, pow2_floor(std::max(1, 15 / G - 1)));
  const float inf = std::numeric_limits<float>::infinity();
  alignas(32) float q[G][D];
  for (int j = 0; j < G; ++j)
    for (int c = 0; c < DC; ++c)
      _mm256_store_ps(q[j] + c * 8, _mm256_mul_ps(load8(it.q + j * D + c * 8), _mm256_set1_ps(it.scale)));
  for (int64_t l = 0; l < it.n; ++l) {
    prefetch_ahead(it, it.k, l, 0, D * sizeof(T));
    const T* key = it.k + it.slots[l] * it.row;
    __m256 acc[G];
    for (int j = 0; j < G; ++j) acc[j] = _mm256_setzero_ps();
    for (int c = 0; c < DC; ++c) {
      const __m256 k = load8(key + c * 8);
      for (int j = 0; j < G; ++j) acc[j] = _mm256_fmadd_ps(_mm256_load_ps(q[j] + c * 8), k, acc[j]);
    }
    for (int j = 0; j < G; ++j) it.scores[j * it.n + l] = hsum8(acc[j]);
  }
  float inv[G];
  for (int j = 0; j < G; ++j) {
    float* s = it.scores + j * it.n;
    __m256 top = _mm256_set1_ps(-inf);
    for (int64_t l = 0; l < it.n; l += 8) {
      const __m256i m = tail_mask8(it.n - l);
      const __m256 x = _mm256_maskload_ps(s + l, m);
      top = _mm256_max_ps(top, _mm256_blendv_ps(_mm256_set1_ps(-inf), x, _mm256_castsi256_ps(m)));
    }
    const float max = hmax8(top);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t l = 0; l < it.n; l += 8) {
      const __m256i m = tail_mask8(it.n - l);
      __m256 p = exp8(_mm256_sub_ps(_mm256_maskload_ps(s + l, m), _mm256_set1_ps(max)));
      p = _mm256_blendv_ps(_mm256_setzero_ps(), p, _mm256_castsi256_ps(m));
      sum = _mm256_add_ps(sum, p);
      _mm256_maskstore_ps(s + l, m, p);
    }
    const float total = hsum8(sum);
    inv[j] = 1.f / total;
    it.lse[j] = max + std::log(total);
  }
  for (int c0 = 0; c0 < DC; c0 += CB) {
    __m256 acc[G][CB];
    for (int j = 0; j < G; ++j)
      for (int c = 0; c < CB; ++c) acc[j][c] = _mm256_setzero_ps();
    for (int64_t l = 0; l < it.n; ++l) {
      prefetch_ahead(it, it.v, l, c0 * 8, CB * 8 * sizeof(T));
      const T* value = it.v + it.slots[l] * it.row + c0 * 8;
      __m256 p[G];
      for (int j = 0; j < G; ++j) p[j] = _mm256_set1_ps(it.scores[j * it.n + l]);
      for (int c = 0; c < CB; ++c) {
        const __m256 v = load8(value + c * 8);
        for (int j = 0; j < G; ++j) acc[j][c] = _mm256_fmadd_ps(p[j], v, acc[j][c]);
      }
    }
    for (int j = 0; j < G; ++j)
      for (int c = 0; c < CB; ++c)
        _mm256_storeu_ps(it.out + j * D + (c0 + c) * 8, _mm256_mul_ps(acc[j][c], _mm256_set1_ps(inv[j])));
  }
}
#define RADIXLM_ATTEND attend_avx2
constexpr int kLanes = 8;
#endif

#if defined(RADIXLM_ATTEND)
// The vector kernel of this ISA for DC vectors a head, by the GQA group size
template <typename T, int DC>
bool attend_group(const Item<T>& it, int64_t G) {
  switch (G) {
    case 1: RADIXLM_ATTEND<T, DC, 1>(it); return true;
    case 2: RADIXLM_ATTEND<T, DC, 2>(it); return true;
    case 3: RADIXLM_ATTEND<T, DC, 3>(it); return true;
    case 4: RADIXLM_ATTEND<T, DC, 4>(it); return true;
    case 5: RADIXLM_ATTEND<T, DC, 5>(it); return true;
    case 6: RADIXLM_ATTEND<T, DC, 6>(it); return true;
    case 7: RADIXLM_ATTEND<T, DC, 7>(it); return true;
    case 8: RADIXLM_ATTEND<T, DC, 8>(it); return true;
    default: return false;
  }
}
#endif

// Whether a vector kernel served the item (else the scalar one does)
template <typename T>
bool attend_vector(const Item<T>& it, int64_t G, int64_t D) {
#if defined(RADIXLM_ATTEND)
  switch (D) {  // NOTE: DC = D / kLanes vectors a head
    case 16: return attend_group<T, 16 / kLanes>(it, G);
    case 32: return attend_group<T, 32 / kLanes>(it, G);
    case 64: return attend_group<T, 64 / kLanes>(it, G);
    case 128: return attend_group<T, 128 / kLanes>(it, G);
    default: return false;
  }
#else
  return false;
#endif
}

template <typename T>
void run(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf, const at::Tensor& kv_index,
         const at::Tensor& token_slot, const at::Tensor& key_mask, double scale, at::Tensor& out, at::Tensor& lse) {
  const int64_t tokens = q.size(0), heads = q.size(1), D = q.size(2);
  const int64_t kv_heads = k_buf.size(1), G = heads / kv_heads;
  const int64_t per_req = key_mask.size(1), length = key_mask.size(2);
  const T* qp = q.data_ptr<T>();
  const T* kp = k_buf.data_ptr<T>();
  const T* vp = v_buf.data_ptr<T>();
  const int64_t* index = kv_index.data_ptr<int64_t>();
  const int64_t* place = token_slot.data_ptr<int64_t>();
  const bool* mask = key_mask.data_ptr<bool>();
  float* op = out.data_ptr<float>();
  float* lp = lse.data_ptr<float>();
  at::parallel_for(0, tokens * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(G * std::max<int64_t>(length, 1));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / kv_heads, g = item % kv_heads;
      const int64_t req = place[t] / per_req, entry = place[t] % per_req;
      // NOTE: the grid's mask is causal, a prefix of the request's slots: count it
      const bool* row_mask = mask + (req * per_req + entry) * length;
      int64_t n = 0;
      for (int64_t l = 0; l < length; ++l) n += row_mask[l];
      Item<T> it{qp + (t * heads + g * G) * D, kp + g * D, vp + g * D, kv_heads * D, index + req * length, n,
                 static_cast<float>(scale), scores.data(), op + (t * heads + g * G) * D, lp + t * heads + g * G};
      if (n == 0) {  // NOTE: nothing to attend to (a cascade's request with no own slot): weight 0
        for (int64_t i = 0; i < G * D; ++i) it.out[i] = 0.f;
        for (int64_t j = 0; j < G; ++j) it.lse[j] = -std::numeric_limits<float>::infinity();
      } else if (!attend_vector(it, G, D)) {
        attend_scalar(it, G, D);
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor> decode_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                                                    const at::Tensor& kv_index, const at::Tensor& token_slot,
                                                    const at::Tensor& key_mask, double scale) {
  TORCH_CHECK(q.dim() == 3 && k_buf.dim() == 3 && v_buf.sizes() == k_buf.sizes(), "q [T, H, D], k/v [S, Hkv, D]");
  TORCH_CHECK(q.size(2) == k_buf.size(2) && q.size(1) % k_buf.size(1) == 0, "heads and head size must match the KV's");
  TORCH_CHECK(q.scalar_type() == k_buf.scalar_type() && v_buf.scalar_type() == k_buf.scalar_type(), "one dtype");
  TORCH_CHECK(k_buf.is_contiguous() && v_buf.is_contiguous(), "the KV pool's layers are contiguous");
  TORCH_CHECK(kv_index.scalar_type() == at::kLong && token_slot.scalar_type() == at::kLong, "int64 indices");
  TORCH_CHECK(key_mask.scalar_type() == at::kBool && key_mask.dim() == 3, "key_mask [R, E, L] bool");
  TORCH_CHECK(kv_index.size(0) == key_mask.size(0) && kv_index.size(1) == key_mask.size(2), "kv_index [R, L]");
  const at::Tensor qc = q.contiguous(), index = kv_index.contiguous(), place = token_slot.contiguous();
  const at::Tensor mask = key_mask.contiguous();
  at::Tensor out = at::empty(qc.sizes(), q.options().dtype(at::kFloat));
  at::Tensor lse = at::empty({q.size(0), q.size(1)}, q.options().dtype(at::kFloat));
  if (q.scalar_type() == at::kBFloat16) {
    run<bf16>(qc, k_buf, v_buf, index, place, mask, scale, out, lse);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kFloat, "bf16 or float32");
    run<float>(qc, k_buf, v_buf, index, place, mask, scale, out, lse);
  }
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor> flash_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                                                   const at::Tensor& slots, const std::optional<at::Tensor>& q_starts,
                                                   const std::optional<at::Tensor>& kv_starts, bool causal,
                                                   double scale, int64_t window) {
  TORCH_CHECK(q.dim() == 3 && k_buf.dim() == 3 && v_buf.sizes() == k_buf.sizes(), "q [T, H, D], k/v [S, Hkv, D]");
  TORCH_CHECK(q.size(2) == k_buf.size(2) && k_buf.size(1) > 0 && q.size(1) % k_buf.size(1) == 0,
              "heads and head size must match the KV's");
  TORCH_CHECK(q.scalar_type() == k_buf.scalar_type() && v_buf.scalar_type() == k_buf.scalar_type(), "one dtype");
  TORCH_CHECK(k_buf.is_contiguous() && v_buf.is_contiguous(), "the KV pool's layers are contiguous");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.dim() == 1, "slots [N] int64");
  TORCH_CHECK(q_starts.has_value() == kv_starts.has_value(), "q_starts and kv_starts together");
  TORCH_CHECK(window >= 0 && (window == 0 || causal), "a sliding window (> 0) is causal");
  at::Tensor qs, ks;
  if (q_starts) {
    qs = q_starts->contiguous(), ks = kv_starts->contiguous();
    TORCH_CHECK(qs.scalar_type() == at::kLong && ks.scalar_type() == at::kLong && qs.dim() == 1 &&
                qs.sizes() == ks.sizes() && qs.size(0) >= 1, "q_starts, kv_starts [B + 1] int64");
  } else {  // NOTE: one sequence: every query over every slot
    qs = at::tensor({int64_t{0}, q.size(0)}), ks = at::tensor({int64_t{0}, slots.size(0)});
  }
  const int64_t B = qs.size(0) - 1, *qp = qs.data_ptr<int64_t>(), *kp = ks.data_ptr<int64_t>();
  TORCH_CHECK(qp[0] == 0 && qp[B] == q.size(0) && kp[0] == 0 && kp[B] == slots.size(0), "starts span q and slots");
  for (int64_t b = 0; b < B; ++b) TORCH_CHECK(qp[b] <= qp[b + 1] && kp[b] <= kp[b + 1], "starts ascend");
  const at::Tensor qc = q.contiguous(), sc = slots.contiguous();
  const int64_t* sp = sc.data_ptr<int64_t>();
  const bool in_pool = std::all_of(sp, sp + sc.numel(), [&](int64_t s) { return s >= 0 && s < k_buf.size(0); });
  TORCH_CHECK(in_pool, "slots lie in the pool");
  at::Tensor out = at::empty(qc.sizes(), q.options().dtype(at::kFloat));
  at::Tensor lse = at::empty({q.size(0), q.size(1)}, q.options().dtype(at::kFloat));
  auto run_flash = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    radixlm::FlashArgs<T> args{qc.data_ptr<T>(), k_buf.data_ptr<T>(), v_buf.data_ptr<T>(), sc.data_ptr<int64_t>(),
                               qp, kp, B, q.size(1), k_buf.size(1), q.size(2), causal, window, static_cast<float>(scale),
                               out.data_ptr<float>(), lse.data_ptr<float>()};
    radixlm::flash_attention(args);
  };
  if (q.scalar_type() == at::kBFloat16) {
    run_flash(static_cast<bf16*>(nullptr));
  } else {
    TORCH_CHECK(q.scalar_type() == at::kFloat, "bf16 or float32");
    run_flash(static_cast<float*>(nullptr));
  }
  return {out, lse};
}

bool flash_vectorized(int64_t head_dim) { return radixlm::flash_vectorized(head_dim); }

// The first index of each row's largest value (a NaN counts as largest), as torch's argmax
int64_t row_argmax(const float* x, int64_t n) {
  int64_t start = 0, best_at = 0;
  float best = -std::numeric_limits<float>::infinity();
#if defined(__AVX512F__)
  if (n >= 16) {
    const __m512i step = _mm512_set1_epi32(16);
    __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), at = lane;
    __m512 top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    __mmask16 nan = 0;
    for (; start + 16 <= n && start + 16 <= (int64_t{1} << 31); start += 16) {
      __m512 v = _mm512_loadu_ps(x + start);
      nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      __mmask16 up = _mm512_cmp_ps_mask(v, top, _CMP_GT_OQ);  // NOTE: strict: a lane keeps its first
      top = _mm512_mask_mov_ps(top, up, v);
      at = _mm512_mask_mov_epi32(at, up, lane);
      lane = _mm512_add_epi32(lane, step);
    }
    if (nan) start = 0;  // NOTE: the scalar loop below finds the first NaN
    else {
      best = _mm512_reduce_max_ps(top);
      __mmask16 tied = _mm512_cmp_ps_mask(top, _mm512_set1_ps(best), _CMP_EQ_OQ);
      best_at = _mm512_mask_reduce_min_epi32(tied, at);
    }
  }
#endif
  for (int64_t i = start; i < n; ++i) {
    if (std::isnan(x[i])) return i;
    if (x[i] > best || (i == 0 && start == 0)) best = x[i], best_at = i;
  }
  return best_at;
}

at::Tensor argmax(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat, "logits [B, V] float32");
  const at::Tensor x = logits.contiguous();
  at::Tensor out = at::empty({x.size(0)}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  const int64_t n = x.size(1);
  at::parallel_for(0, x.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) op[r] = row_argmax(xp + r * n, n);
  });
  return out;
}

// RMSNorm of bf16 or float32 rows as torch's composite computes it: float32 throughout (the
// weight widened too), rounded once; the sum of squares in 16 lanes (vectorised) added in order.
template <typename T>
void rms_norm_rows(const T* xp, const T* wp, T* op, int64_t rows, int64_t h, float eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = xp + r * h;
      float lanes[16] = {0.f};
      int64_t i = 0;
      for (; i + 16 <= h; i += 16)
        for (int j = 0; j < 16; ++j) lanes[j] += float(xr[i + j]) * float(xr[i + j]);
      float sum = 0.f;
      for (int j = 0; j < 16; ++j) sum += lanes[j];
      for (; i < h; ++i) sum += float(xr[i]) * float(xr[i]);
      const float inv = 1.f / std::sqrt(sum / static_cast<float>(h) + eps);
      for (int64_t k = 0; k < h; ++k) op[r * h + k] = T(float(xr[k]) * inv * float(wp[k]));
    }
  });
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK((dtype == at::kBFloat16 || dtype == at::kFloat) && weight.scalar_type() == dtype,
              "rms_norm: x and weight bfloat16 or float32, the same");
  const int64_t h = x.size(-1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == h, "rms_norm: weight [x.size(-1)]");
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  at::Tensor out = at::empty_like(xc);
  const int64_t rows = h ? xc.numel() / h : 0;
  if (dtype == at::kBFloat16) {
    rms_norm_rows(xc.data_ptr<bf16>(), wc.data_ptr<bf16>(), out.data_ptr<bf16>(), rows, h, float(eps));
  } else {
    rms_norm_rows(xc.data_ptr<float>(), wc.data_ptr<float>(), out.data_ptr<float>(), rows, h, float(eps));
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(radixlm_cpu, m) {
  m.def("argmax(Tensor logits) -> Tensor");
  m.def("decode_attention(Tensor q, Tensor k_buf, Tensor v_buf, Tensor kv_index, Tensor token_slot, "
        "Tensor key_mask, float scale) -> (Tensor, Tensor)");
  m.def("flash_attention(Tensor q, Tensor k_buf, Tensor v_buf, Tensor slots, Tensor? q_starts, Tensor? kv_starts, "
        "bool causal, float scale, int window=0) -> (Tensor, Tensor)");
  m.def("flash_vectorized(int head_dim) -> bool", &flash_vectorized);
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm_cpu, CPU, m) {
  m.impl("decode_attention", &decode_attention);
  m.impl("argmax", &argmax);
  m.impl("flash_attention", &flash_attention);
  m.impl("rms_norm", &rms_norm);
}
