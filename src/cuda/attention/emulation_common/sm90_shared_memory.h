// The Hopper kernel's (wgmma / TMA) dynamic shared memory, which the emulated TMA, wgmma and
// shared stores of tma.h / wgmma.h address. Its array must be the smem_raw of the kernel's own
// namespace (the kernel declares `extern __shared__ unsigned char smem_raw[]` at block scope), so
// the harness defines it there and points sm90_smem at it:
//   namespace flashgrad::cuda_attn_emulated::fp8w {
//   alignas(1024) unsigned char smem_raw[kSm90SmemBytes];
//   }
//   unsigned char* const sm90_smem = flashgrad::cuda_attn_emulated::fp8w::smem_raw;
#pragma once

// The opt-in maximum of an H100 / H200 block plus the 1 KB a kernel may skip to align its tiles to
// 1024 bytes (SWIZZLE_128B).
constexpr int kSm90SmemBytes = 232448 + 1024;
extern unsigned char* const sm90_smem;
