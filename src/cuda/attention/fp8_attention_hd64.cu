// FP8 (e4m3) attention kernels for head dim 64: forward, backward main pass (bf16 / fp16 gradients).
#include "fp8_launch_impl.cuh"

FLASHGRAD_FP8_ATTENTION_LAUNCHERS(64)
