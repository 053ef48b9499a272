// Hopper (sm_90a) warpgroup MMA on e4m3 operands (QGMMA), as raw PTX: the products of the FP8
// wgmma forward (fp8_wgmma_forward_kernel.cuh). The mbarrier / TMA / setmaxnreg / descriptor helpers
// are the bf16 forward's (wgmma_primitives.cuh).
//
// wgmma.m64nNk32.f32.e4m3.e4m3 has no transpose bits: both operands are K-major (the reduction dim
// contiguous). With SWIZZLE_128B a shared-memory row is 128 bytes = 128 e4m3 values, so a k32 step
// is 32 bytes inside the row, exactly as a k16 step of 16-bit data: the bf16 kernel's K-major
// descriptors (start + 32 B per step, SBO = 1024 = 8 rows x 128 B) apply unchanged.
//
// Register A operand (8-bit), per warp w of the warpgroup, g = lane / 4, t = lane % 4 (PTX ISA,
// "Register fragment for matrix A", .m64nNk32): register r holds 4 e4m3 values, byte b at
//   row 16 w + g + 8 (r & 1), k column 4 t + b + 16 (r >> 1)
// i.e. the A fragment of mma.sync m16n8k32 per warp (fp8_fragments.cuh, a_element).
// Accumulator (fp32, as every wgmma with .f32 D): d[4 i + 2 r + c] = row 16 w + g + 8 r, column
// 8 i + 2 t + c.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace flashgrad::cuda_attn::sm90 {

#define FG8_ACC8(d, i)                                                                          \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define FG8_ACC32(d) FG8_ACC8(d, 0), FG8_ACC8(d, 8), FG8_ACC8(d, 16), FG8_ACC8(d, 24)
#define FG8_ACC64(d) FG8_ACC32(d), FG8_ACC8(d, 32), FG8_ACC8(d, 40), FG8_ACC8(d, 48), FG8_ACC8(d, 56)
#define FG8_ACC128(d)                                                                            \
  FG8_ACC64(d), FG8_ACC8(d, 64), FG8_ACC8(d, 72), FG8_ACC8(d, 80), FG8_ACC8(d, 88), FG8_ACC8(d, 96), \
      FG8_ACC8(d, 104), FG8_ACC8(d, 112), FG8_ACC8(d, 120)
#define FG8_REGS128                                                                              \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "     \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "      \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "      \
  "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "      \
  "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "      \
  "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, "  \
  "%109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, "      \
  "%124, %125, %126, %127}"
#define FG8_REGS32                                                                                \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FG8_REGS64                                                                                \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "   \
  "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "   \
  "%59, %60, %61, %62, %63}"

// D[64 x 128] (=|+=) A[64 x 32] B[32 x 128], A and B e4m3 in shared memory, both K-major.
// scale_d = 0 overwrites D (first k step), 1 accumulates.
__device__ __forceinline__ void wgmma_e4m3_ss_n128(float (&d)[64], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " FG8_REGS64
      ", %64, %65, p, 1, 1;\n}\n"
      : FG8_ACC64(d)
      : "l"(a_desc), "l"(b_desc), "r"(scale_d));
}

// D[64 x 64] (=|+=) A[64 x 32] B[32 x 64], both from shared memory, K-major.
__device__ __forceinline__ void wgmma_e4m3_ss_n64(float (&d)[32], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " FG8_REGS32
      ", %32, %33, p, 1, 1;\n}\n"
      : FG8_ACC32(d)
      : "l"(a_desc), "l"(b_desc), "r"(scale_d));
}

// S = Q K^T over BN (64 or 128) keys, one k32 step.
template <int BN>
__device__ __forceinline__ void wgmma_e4m3_ss(float (&d)[BN / 2], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  if constexpr (BN == 128)
    wgmma_e4m3_ss_n128(d, a_desc, b_desc, scale_d);
  else
    wgmma_e4m3_ss_n64(d, a_desc, b_desc, scale_d);
}

// D[64 x 128] (=|+=) A[64 x 32] B[32 x 128], A e4m3 in registers (layout above), B K-major in
// shared memory.
__device__ __forceinline__ void wgmma_e4m3_rs_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t b_desc,
                                                   int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " FG8_REGS64
      ", {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
      : FG8_ACC64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d));
}

// D[64 x 256] (=|+=) A[64 x 32] B[32 x 256], A e4m3 in registers, B K-major in shared memory.
__device__ __forceinline__ void wgmma_e4m3_rs_n256(float (&d)[128], const uint32_t (&a)[4], uint64_t b_desc,
                                                   int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 " FG8_REGS128
      ", {%128, %129, %130, %131}, %132, p, 1, 1;\n}\n"
      : FG8_ACC128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d));
}

// D[64 x 64] (=|+=) A[64 x 32] B[32 x 64], A in registers, B K-major in shared memory.
__device__ __forceinline__ void wgmma_e4m3_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc,
                                                  int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " FG8_REGS32
      ", {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
      : FG8_ACC32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d));
}

// D[64 x 32] (=|+=) A[64 x 32] B[32 x 32], A in registers, B K-major in shared memory.
__device__ __forceinline__ void wgmma_e4m3_rs_n32(float (&d)[16], const uint32_t (&a)[4], uint64_t b_desc,
                                                  int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
      ", {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
      : FG8_ACC8(d, 0), FG8_ACC8(d, 8)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d));
}

// One N chunk (32, 64, 128 or 256 head-dim columns) of O += P V, one k32 step.
template <int NC>
__device__ __forceinline__ void wgmma_e4m3_rs(float (&d)[NC / 2], const uint32_t (&a)[4], uint64_t b_desc,
                                              int scale_d) {
  if constexpr (NC == 256)
    wgmma_e4m3_rs_n256(d, a, b_desc, scale_d);
  else if constexpr (NC == 128)
    wgmma_e4m3_rs_n128(d, a, b_desc, scale_d);
  else if constexpr (NC == 64)
    wgmma_e4m3_rs_n64(d, a, b_desc, scale_d);
  else
    wgmma_e4m3_rs_n32(d, a, b_desc, scale_d);
}

// mbarrier wait for the FP8 forward's producer thread: try_wait with a suspend-time hint (10^7 ns,
// as CUTLASS's ClusterBarrier::wait), so the warp sleeps in the instruction until the phase
// completes instead of returning after the short system default and spinning. Without the hint
// the producer, which waits on the ring's empty slots most of the time, ran ~70 try_wait loop
// rounds (6 instructions each) per key block on scheduler 0, beside that scheduler's two consumer
// warps (ncu, session 5). No deadlock trap: were the consumers stuck, they trap at their own waits.
__device__ __forceinline__ void mbar_wait_suspend(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1, %2;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity), "r"(10000000u)
      : "memory");
}

// Whether the phase with parity `parity` has completed, without waiting (test_wait: never suspends;
// acquire semantics as try_wait, so reads after a true answer see what the phase's arrivals wrote).
// The FP8 forward's kEarlyTest asks it a block ahead, so that the loop top's data waits do not put
// the SYNCS round trip on the warp's path when the data is long there.
__device__ __forceinline__ bool mbar_test(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// The largest of three floats' bit patterns read as signed 32-bit integers (the FP8 forward's kIntMax
// row max): two max.s32, which ptxas fuses into one 3-input VIMNMX3 (sm_90's integer ALU has no
// 3-input float max). The floats enter as "f" operands and are moved to .b32 registers inside the
// asm: with __float_as_int outside it, ptxas wrote the block's exponentials into fresh registers
// instead of over the scores and spilled 172 bytes of O (session 13).
__device__ __forceinline__ int max3_bits(float a, float b, float c) {
  int d;
  asm("{\n"
      ".reg .b32 x, y, z;\n"
      "mov.b32 x, %1;\n"
      "mov.b32 y, %2;\n"
      "mov.b32 z, %3;\n"
      "max.s32 x, x, y;\n"
      "max.s32 %0, x, z;\n"
      "}\n"
      : "=r"(d)
      : "f"(a), "f"(b), "f"(c));
  return d;
}

// The same with a first operand that already is such a bit pattern (an int).
__device__ __forceinline__ int max3_bits(int a, float b, float c) {
  int d;
  asm("{\n"
      ".reg .b32 y, z;\n"
      "mov.b32 y, %2;\n"
      "mov.b32 z, %3;\n"
      "max.s32 y, y, z;\n"
      "max.s32 %0, %1, y;\n"
      "}\n"
      : "=r"(d)
      : "r"(a), "f"(b), "f"(c));
  return d;
}

// One box of a 3-D tensor map into shared memory; completion is counted on `bar` in bytes.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                            int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// Named barriers with the id as an immediate (ids 1..15; 0 is __syncthreads): with a register id
// ptxas reserves all 16 barriers and keeps the id live.
template <int kId>
__device__ __forceinline__ void named_barrier_sync_id(int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "r"(threads) : "memory");
}
template <int kId>
__device__ __forceinline__ void named_barrier_arrive_id(int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"n"(kId), "r"(threads) : "memory");
}

#undef FG8_ACC8
#undef FG8_ACC32
#undef FG8_ACC64
#undef FG8_REGS32
#undef FG8_REGS64
#undef FG8_REGS128
#undef FG8_ACC128

}  // namespace flashgrad::cuda_attn::sm90
