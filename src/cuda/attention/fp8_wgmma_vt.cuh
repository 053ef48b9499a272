// The transposed V copy of the FP8 wgmma forward: vt8, V^T with keys contiguous, because the e4m3
// wgmma reads its B operand K-major only (P V reduces over keys). Same key order as the mma.sync FP8
// forward's copy (fp8_fragments.cuh: inside each group of 16 keys, position p holds key
// key_at_position(p)), so that P goes from the S accumulators to the A registers of P V without
// shuffles: the wgmma accumulator and 8-bit A register layouts per warp are those of mma.sync
// m16n8(k32), where that order was derived.
//
// What differs from fp8_fragments.cuh's copy is the padding: the wgmma forward loads V^T in TMA
// boxes of 128 keys (128 bytes, the SWIZZLE_128B row), so every sequence's columns are zero-filled
// to a multiple of 128 and sequences start on multiples of 128:
//   padded (B sequences of Sk keys): col0(n) = n * round_up(Sk, 128), columns B * round_up(Sk, 128)
//   varlen (cu_seqlens_k):           col0(n) = round_up(cu[n], 128) + 128 n,
//                                    columns round_up(Tk, 128) + 128 N
// Varlen: col0(n + 1) - col0(n) = round_up(cu[n+1], 128) - round_up(cu[n], 128) + 128 is a multiple
// of 128 and >= len_n - 127 + 128 > len_n, hence >= round_up(len_n, 128): a box of 128 columns at
// col0(n) + 128 b (b < ceil(len_n / 128)) only reads sequence n's keys or its zeros -- never another
// sequence's columns, nor the uninitialized gap between sequences (0 * NaN would poison P V).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "fp8_fragments.cuh"
#include "fp8_kernel_params.h"

namespace flashgrad::cuda_attn::fp8w {

constexpr int kVtBoxKeys = 128;  // keys per V^T box and per transpose CTA

FLASHGRAD_FP8_HD int64_t round_up_box(int64_t x) { return (x + kVtBoxKeys - 1) / kVtBoxKeys * kVtBoxKeys; }
FLASHGRAD_FP8_HD int64_t vt_col0(bool varlen, int64_t n, int64_t seqlen_k, int64_t cu_k_n) {
  return varlen ? round_up_box(cu_k_n) + kVtBoxKeys * n : n * round_up_box(seqlen_k);
}
FLASHGRAD_FP8_HD int64_t vt_columns(bool varlen, int64_t num_seqs, int64_t seqlen_k, int64_t total_k) {
  return varlen ? round_up_box(total_k) + kVtBoxKeys * num_seqs : num_seqs * round_up_box(seqlen_k);
}

template <int D>
constexpr int vt_transpose_smem_bytes() {
  return kVtBoxKeys * (D + 4);  // +4: the rows do not all start in the same bank
}

// One CTA per (128 keys of a sequence, kv head): vt[hk][d][col0(n) + j0 + 16 (j / 16) +
// position_of_key(j % 16)] = v8[n, j0 + j, hk, d], zeros for keys past the sequence.
template <int D>
__global__ void fp8w_transpose_v_kernel(const Fp8KernelParams fp, int key_blocks) {
  const AttentionKernelParams& p = fp.base;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto tile = reinterpret_cast<uint8_t(*)[D + 4]>(smem_raw);
  const int seq = blockIdx.x / key_blocks, kb = blockIdx.x % key_blocks, hk = blockIdx.y;
  const bool varlen = p.cu_seqlens_k != nullptr;
  const int64_t k_row0 = varlen ? p.cu_seqlens_k[seq] : 0;
  const int len_k = varlen ? p.cu_seqlens_k[seq + 1] - static_cast<int>(k_row0) : p.seqlen_k;
  const int j0 = kb * kVtBoxKeys;
  if (j0 >= len_k) return;  // boxes past round_up(len_k, 128) are never read
  const int64_t batch = varlen ? 0 : seq;
  const uint8_t* v = static_cast<const uint8_t*>(p.v) + batch * p.v_st.batch + hk * p.v_st.head;
  for (int w = threadIdx.x; w < kVtBoxKeys * D / 4; w += blockDim.x) {
    const int j = w / (D / 4), c = (w % (D / 4)) * 4;
    uint32_t x = 0;
    if (j0 + j < len_k) x = *reinterpret_cast<const uint32_t*>(v + (k_row0 + j0 + j) * p.v_st.row + c);
    *reinterpret_cast<uint32_t*>(&tile[j][c]) = x;
  }
  __syncthreads();
  uint8_t* out = fp.vt + static_cast<int64_t>(hk) * D * fp.vt_cols + vt_col0(varlen, seq, p.seqlen_k, k_row0) + j0;
  constexpr int kGroups = kVtBoxKeys / 16;
  for (int w = threadIdx.x; w < D * kGroups; w += blockDim.x) {
    const int d = w / kGroups, grp = w % kGroups;
    uint32_t words[4];
#pragma unroll
    for (int q4 = 0; q4 < 4; ++q4) {
      uint32_t word = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b)
        word |= static_cast<uint32_t>(tile[16 * grp + fp8::key_at_position(4 * q4 + b)][d]) << (8 * b);
      words[q4] = word;
    }
    *reinterpret_cast<uint4*>(out + static_cast<int64_t>(d) * fp.vt_cols + 16 * grp) =
        make_uint4(words[0], words[1], words[2], words[3]);
  }
}

}  // namespace flashgrad::cuda_attn::fp8w
