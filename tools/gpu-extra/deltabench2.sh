#!/usr/bin/env bash
# deltabench2: a second deltabench job (other rows, other GPU's queue, or other settings) in the same call:
# FLASHGRAD_DELTABENCH2_CASES picks its rows, FLASHGRAD_DELTABENCH2_ENV ("NAME=value ...", optional) sets
# launcher switches for it alone; outputs delta_rule2.{md,json}, deltabench2.log.
FLASHGRAD_DELTABENCH_TAG=2 FLASHGRAD_DELTABENCH_CASES="${FLASHGRAD_DELTABENCH2_CASES:-}" \
  exec env ${FLASHGRAD_DELTABENCH2_ENV:-} bash "$(dirname "$0")/deltabench.sh"
