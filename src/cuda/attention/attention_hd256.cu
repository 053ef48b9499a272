// Attention kernels (forward, backward, deterministic dq) for head dim 256, bf16 and fp16.
#include "attention_launch_impl.cuh"

FLASHGRAD_ATTENTION_LAUNCHERS(256)
