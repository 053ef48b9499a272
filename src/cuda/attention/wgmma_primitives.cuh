// Hopper (sm_90a) building blocks of the wgmma attention forward and backward, as raw PTX: mbarriers, TMA tile
// loads (cp.async.bulk.tensor), warpgroup MMA (wgmma.mma_async) with shared-memory descriptors,
// and register reallocation between warpgroups (setmaxnreg).
//
// Shared-memory tiles are what a TMA box with SWIZZLE_128B writes: rows of 64 16-bit elements
// (128 bytes), the 16-byte chunk c of row r stored at chunk c ^ (r % 8), boxes 1024-byte aligned.
// A tile of R rows x D columns is D / 64 such boxes ("column panels") of R x 128 bytes, one after
// the other. wgmma reads the same layout through a descriptor (PTX ISA "Matrix Descriptor Format"):
//   K-major operand (Q, K: the reduction dim is the contiguous one): start at the panel holding
//     k, plus 32 bytes per 16-element k step inside the 128-byte row; stride byte offset (SBO) =
//     1024 = 8 rows x 128 B between groups of 8 rows; leading byte offset unused (1).
//   MN-major operand (V in P V: the reduction dim, keys, is the row dim): start at key row k0;
//     SBO = 1024 between groups of 8 keys, LBO = panel bytes between the 64-column panels of N.
// Accumulator layout of m64nNk16 (fp32), thread (warp w of the warpgroup, g = lane / 4,
// t = lane % 4): d[4i + 2r + c] = row 16w + g + 8r, column 8i + 2t + c, i.e. the mma.sync m16n8
// C layout per 8-column chunk; the register A operand has the mma.sync m16n8k16 A layout per warp.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/attention/wgmma_descriptor.h"

namespace flashgrad::cuda_attn::sm90 {

// ---- mbarrier ------------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialized barriers visible to the async proxy (TMA) and the other threads.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival that also announces `bytes` of TMA traffic the phase must wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Blocks until the phase with parity `parity` has completed. A fresh barrier is in phase 0, so
// waiting on parity 1 returns at once (the producer's first pass over the empty slots).
// Watchdog: 2^24 failed tries (each try_wait may suspend up to a hardware time limit: a second
// or more in all; a real wait takes microseconds) means a pipeline bug; trapping turns that hang into a
// launch error the caller sees. Written as one asm loop: a C++ loop around try_wait costs the
// consumers registers they do not have.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      ".reg .u32 tries;\n"
      "mov.u32 tries, 0;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@done bra DONE_%=;\n"
      "add.u32 tries, tries, 1;\n"
      "setp.lt.u32 done, tries, 16777216;\n"
      "@done bra WAIT_%=;\n"
      "trap;\n"
      "DONE_%=:\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// ---- TMA -----------------------------------------------------------------------------------------
// One box of a 4-D tensor map into shared memory; completion is counted on `bar` in bytes.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0,
                                            int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global memory to shared memory at
// `dst` in one bulk copy without a tensor map (cp.async.bulk); completion counted on `bar` in bytes. The
// delta rule's planned row loads (docs/perf/delta_rule.md, session 22; probed by DeltaRuleWgmmaProbe).
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Two floats to shared memory at a 32-bit shared address (8-byte aligned): the dQ staging stores,
// kept on 32-bit addresses (a generic pointer costs the consumer registers it does not have).
__device__ __forceinline__ void st_shared_v2_f32(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

// Orders this thread's ordinary shared-memory stores before later reads by the async proxy (wgmma
// operands, bulk copies): the backward writes dS^T and the dQ tile with st.shared, then wgmma / a
// bulk reduction reads them.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// global box at (c0, c1, c2) of a 3-D tensor map += the box in shared memory at `src` (laid out as
// the map's swizzle says), fp32 adds done in L2, element-wise atomic (cp.reduce.async.bulk.tensor).
// One instruction for a whole box: the backward's dQ tile goes out in D / 32 of them instead of one
// bulk op per row, each of which the compiler issues lane by lane. Coordinates past the map's
// extent are skipped. Tracked by this thread's bulk async-group: commit, then wait before reusing
// the source.
__device__ __forceinline__ void tma_reduce_add_3d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until this thread's committed bulk groups have finished reading their shared-memory source.
__device__ __forceinline__ void bulk_wait_read_all() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// Waits until they have completed entirely (the global writes done), before the thread exits.
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// ---- named barriers (ids 1..15; 0 is __syncthreads) ---------------------------------------------
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- register reallocation -----------------------------------------------------------------------
template <int N>
__device__ __forceinline__ void regs_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// ---- wgmma ---------------------------------------------------------------------------------------
// Descriptor of a 128-byte-swizzled operand (layout type 1 in bits 62-63); addresses in 16 bytes.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return ::flashgrad::wgmma_descriptor::swizzle128_desc(addr, lbo_bytes, sbo_bytes);
}

// Orders this thread's earlier register writes (accumulators, A fragments) before the next wgmma.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads / writes across an in-flight wgmma.
template <int N>
__device__ __forceinline__ void pin_registers(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Keeps A-fragment registers (P, dS as wgmma's register operand) alive and unmodified until here:
// the tensor cores read them asynchronously until the wait that precedes the call.
__device__ __forceinline__ void pin_words(uint32_t (&a)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[i])::"memory");
}
template <int KK>
__device__ __forceinline__ void pin_fragments(uint32_t (&a)[KK][4], uint32_t (&b)[KK][4]) {
#pragma unroll
  for (int kk = 0; kk < KK; ++kk) {
    pin_words(a[kk]);
    pin_words(b[kk]);
  }
}

#define FG_ACC8(d, i)                                                                          \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define FG_ACC32(d) FG_ACC8(d, 0), FG_ACC8(d, 8), FG_ACC8(d, 16), FG_ACC8(d, 24)
#define FG_ACC64(d) FG_ACC32(d), FG_ACC8(d, 32), FG_ACC8(d, 40), FG_ACC8(d, 48), FG_ACC8(d, 56)
#define FG_REGS32                                                                                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FG_REGS64                                                                                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "   \
  "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "   \
  "%59, %60, %61, %62, %63}"

#define FG_REGS128 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, " \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, " \
  "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, " \
  "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, " \
  "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, " \
  "%109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, " \
  "%124, %125, %126, %127}"
#define FG_ACC128(d)                                                                              \
  FG_ACC64(d), FG_ACC8(d, 64), FG_ACC8(d, 72), FG_ACC8(d, 80), FG_ACC8(d, 88), FG_ACC8(d, 96),     \
      FG_ACC8(d, 104), FG_ACC8(d, 112), FG_ACC8(d, 120)

template <typename T>
struct WgmmaName;
template <>
struct WgmmaName<__nv_bfloat16> {
  static constexpr bool kBf16 = true;
};
template <>
struct WgmmaName<__half> {
  static constexpr bool kBf16 = false;
};

// D[64 x 128] (=|+=) A[64 x 16] B[16 x 128], A and B from shared memory, both K-major.
// scale_d = 0 overwrites D (first k step), 1 accumulates.
template <typename T>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  if constexpr (WgmmaName<T>::kBf16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " FG_REGS64
        ", %64, %65, p, 1, 1, 0, 0;\n}\n"
        : FG_ACC64(d)
        : "l"(a_desc), "l"(b_desc), "r"(scale_d));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " FG_REGS64
        ", %64, %65, p, 1, 1, 0, 0;\n}\n"
        : FG_ACC64(d)
        : "l"(a_desc), "l"(b_desc), "r"(scale_d));
  }
}

// D[64 x 64] (=|+=) A[64 x 16] B[16 x 64], A and B from shared memory, both K-major.
template <typename T>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  if constexpr (WgmmaName<T>::kBf16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FG_REGS32
        ", %32, %33, p, 1, 1, 0, 0;\n}\n"
        : FG_ACC32(d)
        : "l"(a_desc), "l"(b_desc), "r"(scale_d));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FG_REGS32
        ", %32, %33, p, 1, 1, 0, 0;\n}\n"
        : FG_ACC32(d)
        : "l"(a_desc), "l"(b_desc), "r"(scale_d));
  }
}

// S = Q K^T for a key block of BN (64 or 128) keys.
template <typename T, int BN>
__device__ __forceinline__ void wgmma_ss(float (&d)[BN / 2], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  if constexpr (BN == 128)
    wgmma_ss_n128<T>(d, a_desc, b_desc, scale_d);
  else
    wgmma_ss_n64<T>(d, a_desc, b_desc, scale_d);
}

// D[64 x 256] (=|+=) A[64 x 16] B[16 x 256], A in registers, B MN-major in shared memory.
template <typename T>
__device__ __forceinline__ void wgmma_rs_n256(float (&d)[128], const uint32_t (&a)[4], uint64_t b_desc,
                                              int scale_d) {
  if constexpr (WgmmaName<T>::kBf16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " FG_REGS128
        ", {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
        : FG_ACC128(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " FG_REGS128
        ", {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
        : FG_ACC128(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d));
  }
}

// D[64 x 128] (=|+=) A[64 x 16] B[16 x 128], A in registers, B MN-major in shared memory (transposed).
template <typename T>
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t b_desc,
                                              int scale_d) {
  if constexpr (WgmmaName<T>::kBf16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " FG_REGS64
        ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : FG_ACC64(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " FG_REGS64
        ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : FG_ACC64(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d));
  }
}

// D[64 x 64] (=|+=) A[64 x 16] B[16 x 64], A in registers, B in shared memory: MN-major (kTransB = 1, as
// the attention's O += P V) or K-major (0).
template <typename T, int kTransB = 1>
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc,
                                             int scale_d) {
  static_assert(kTransB == 0 || kTransB == 1, "B K-major (0) or MN-major (1)");
  if constexpr (WgmmaName<T>::kBf16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FG_REGS32
        ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : FG_ACC32(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d), "n"(kTransB));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FG_REGS32
        ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : FG_ACC32(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d), "n"(kTransB));
  }
}

// D[64 x 64] (=|+=) A[64 x 16] B[16 x 64], A in registers, B K-major: the delta rule's tmp = dA A^T in
// docs/perf/delta_rule_b2_wgmma_plan.md (B = A^T read from A stored [m][j], the contraction j contiguous).
template <typename T>
__device__ __forceinline__ void wgmma_rs_kmajor_b_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc,
                                                      int scale_d) {
  wgmma_rs_n64<T, 0>(d, a, b_desc, scale_d);
}

// O += P V for a head dim of D columns (64, 128 or 256).
template <typename T, int D>
__device__ __forceinline__ void wgmma_rs(float (&d)[D / 2], const uint32_t (&a)[4], uint64_t b_desc, int scale_d) {
  if constexpr (D == 256)
    wgmma_rs_n256<T>(d, a, b_desc, scale_d);
  else if constexpr (D == 128)
    wgmma_rs_n128<T>(d, a, b_desc, scale_d);
  else
    wgmma_rs_n64<T>(d, a, b_desc, scale_d);
}

// D[64 x N] (=|+=) A[64 x 16] B[16 x N], both from shared memory, B MN-major (the N dim contiguous),
// A MN-major (kTransA = 1: the M dim contiguous) or K-major (0). N = 16, 32, 64 or 128.
#define FG_REGS8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define FG_REGS16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define FG_ACC16(d) FG_ACC8(d, 0), FG_ACC8(d, 8)
template <typename T, int N, int kTransA>
__device__ __forceinline__ void wgmma_ss_bt(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 128, "16, 32, 64 or 128 columns");
  static_assert(kTransA == 0 || kTransA == 1, "A K-major (0) or MN-major (1)");
  if constexpr (N == 128) {
    if constexpr (WgmmaName<T>::kBf16)
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " FG_REGS64
          ", %64, %65, p, 1, 1, %67, 1;\n}\n"
          : FG_ACC64(d)
          : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(kTransA));
    else
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " FG_REGS64
          ", %64, %65, p, 1, 1, %67, 1;\n}\n"
          : FG_ACC64(d)
          : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(kTransA));
  } else if constexpr (N == 64) {
    if constexpr (WgmmaName<T>::kBf16)
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FG_REGS32
          ", %32, %33, p, 1, 1, %35, 1;\n}\n"
          : FG_ACC32(d)
          : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(kTransA));
    else
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FG_REGS32
          ", %32, %33, p, 1, 1, %35, 1;\n}\n"
          : FG_ACC32(d)
          : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(kTransA));
  } else if constexpr (N == 16) {
    if constexpr (WgmmaName<T>::kBf16)
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 " FG_REGS8
          ", %8, %9, p, 1, 1, %11, 1;\n}\n"
          : FG_ACC8(d, 0)
          : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(kTransA));
    else
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 " FG_REGS8
          ", %8, %9, p, 1, 1, %11, 1;\n}\n"
          : FG_ACC8(d, 0)
          : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(kTransA));
  } else {
    if constexpr (WgmmaName<T>::kBf16)
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " FG_REGS16
          ", %16, %17, p, 1, 1, %19, 1;\n}\n"
          : FG_ACC16(d)
          : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(kTransA));
    else
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " FG_REGS16
          ", %16, %17, p, 1, 1, %19, 1;\n}\n"
          : FG_ACC16(d)
          : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(kTransA));
  }
}
// Both MN-major: the attention backward's dQ = dS K, where dS sits in shared memory as dS^T
// [keys][queries] (queries, the M dim, contiguous) and K as [keys][d] (d, the N dim, contiguous).
template <typename T, int N>
__device__ __forceinline__ void wgmma_ss_tt(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  wgmma_ss_bt<T, N, 1>(d, a_desc, b_desc, scale_d);
}
// A K-major, B MN-major: the delta rule's chunk state (chunked_state_wgmma.cuh), v_new = w h with w
// [rows][K] and h [K][values] (the values, the N dim, contiguous).
template <typename T, int N>
__device__ __forceinline__ void wgmma_ss_kt(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  wgmma_ss_bt<T, N, 0>(d, a_desc, b_desc, scale_d);
}
#undef FG_REGS8
#undef FG_REGS16
#undef FG_ACC16

#undef FG_ACC8
#undef FG_ACC32
#undef FG_ACC64
#undef FG_REGS32
#undef FG_REGS64
#undef FG_REGS128
#undef FG_ACC128

}  // namespace flashgrad::cuda_attn::sm90
