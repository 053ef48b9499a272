// Test cases the FP8 emulation harnesses share (each harness names them and picks sizes that
// exercise its kernel's tiles).
#pragma once

#include <cstdint>

#include "attention_fp8_recipe.h"

namespace flashgrad::fp8_emulation {

using fp8_test::Fp8Config;

// One sequence (batch 1) of sq queries and sk keys, mask m.
inline Fp8Config one_sequence(int d, MaskKind m, int sq, int sk) {
  Fp8Config c;
  c.d = d;
  c.mask = m;
  c.batch = 1;
  c.sq = sq;
  c.sk = sk;
  return c;
}

// Varlen with empty sequences (q lengths 37, 0, 80, 5; k lengths 53, 0, 80, 0), GQA 4 query heads
// on 2 key heads, causal.
inline Fp8Config varlen_gqa_with_empty_sequences(int d) {
  Fp8Config c;
  c.d = d;
  c.lens_q = {37, 0, 80, 5};
  c.lens_k = {53, 0, 80, 0};
  c.hq = 4;
  c.hk = 2;
  c.mask = MaskKind::causal;
  return c;
}

// Two sequences (q lengths 150, 70; k lengths 150, 270) under a sliding window of 20 keys left, 3
// right.
inline Fp8Config varlen_window_20_3(int d) {
  Fp8Config c;
  c.d = d;
  c.lens_q = {150, 70};
  c.lens_k = {150, 270};
  c.mask = MaskKind::sliding_window;
  c.wl = 20;
  c.wr = 3;
  return c;
}

// Causal with Sq = 90 > Sk = 60 (the diagonal shifted left: the first rows see no key), tanh
// softcap 5 on inputs of std 2, dlse and z-loss, fp16 outputs; d = 128.
inline Fp8Config causal_softcap_dlse_zloss_fp16() {
  Fp8Config c = one_sequence(128, MaskKind::causal, 90, 60);
  c.softcap = 5.f;
  c.input_std = 2.f;
  c.with_dlse = true;
  c.z_loss = 0.5f;
  c.out_dtype = DType::f16;
  return c;
}

// Three sequences of s tokens, prefix_lm with prefixes 0, 40 and s.
inline Fp8Config prefix_lm_three_sequences(int d, int s) {
  Fp8Config c;
  c.d = d;
  c.batch = 3;
  c.sq = c.sk = s;
  c.mask = MaskKind::prefix_lm;
  c.prefix = {0, 40, s};
  return c;
}

// The same three sequences with candidate isolation, (h0, h1, c0, c1) per sequence: history
// [0, 60) and candidates [60, s); history [10, 40) and candidates [70, s - 5); no history.
inline Fp8Config candidate_isolation_three_sequences(int d, int s) {
  Fp8Config c = prefix_lm_three_sequences(d, s);
  c.mask = MaskKind::candidate_isolation;
  c.prefix.clear();
  c.bounds = {0, 60, 60, s, 10, 40, 70, s - 5, 0, 0, 0, s};
  return c;
}

// Long rows (the accumulators' drift): one sequence, one head, 40 queries on sk keys, no mask.
inline Fp8Config long_rows(int d, int sk) {
  Fp8Config c = one_sequence(d, MaskKind::none, 40, sk);
  c.hq = c.hk = 1;
  return c;
}

}  // namespace flashgrad::fp8_emulation
