// Flash attention over contiguous K/V for CPU prefill (see flash_attention.cpp).
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace radixlm {

// Variable-length attention over KV pool slots: sequence b's query tokens
// q[q_starts[b] .. q_starts[b+1]) attend to the keys and values at pool slots
// slots[kv_starts[b] .. kv_starts[b+1]) (H query heads over Hkv KV heads). Causal: a
// sequence's last query sits at its last key, each one before it a key earlier; else every
// query sees every key of its sequence. q [T, H, D] and the pool's k/v [S, Hkv, D] are
// contiguous; out [T, H, D] and lse [T, H] (each row's log-sum-exp of scaled scores) float32.
// window > 0 (causal only): a query sees only the last `window` of its visible keys (itself
// included), a sliding-window layer's.
template <typename T>
struct FlashArgs {
  const T* q;
  const T* k;
  const T* v;
  const int64_t* slots;
  const int64_t* q_starts;   // [B + 1]
  const int64_t* kv_starts;  // [B + 1]
  int64_t B, H, Hkv, D;
  bool causal;
  int64_t window;
  float scale;
  float* out;
  float* lse;
};

// Whether the AVX-512 BF16 path serves bf16 inputs of head size D (else the plain C++ loop)
bool flash_vectorized(int64_t D);

void flash_attention(const FlashArgs<c10::BFloat16>& a);
void flash_attention(const FlashArgs<float>& a);

}  // namespace radixlm
