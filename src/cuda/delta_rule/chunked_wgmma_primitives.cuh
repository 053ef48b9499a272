// The Hopper primitives the delta rule's wgmma chains use (chunked_state_wgmma.cuh,
// chunked_state_backward_wgmma.cuh): the attention's wgmma_primitives.cuh (raw PTX), or under
// FLASHGRAD_CHUNKED_HOST_EMULATION the host models of the same names and signatures
// (chunked_emulation/emulator_sm90.h, included by the emulation harness before any kernel source).
#pragma once

#ifndef FLASHGRAD_CHUNKED_HOST_EMULATION
#include "cuda/attention/wgmma_primitives.cuh"
#endif
