#!/usr/bin/env bash
# deltabench2: a second deltabench job (other rows, other GPU's queue) in the same call:
# FLASHGRAD_DELTABENCH2_CASES picks its rows; outputs delta_rule2.{md,json}, deltabench2.log.
FLASHGRAD_DELTABENCH_TAG=2 FLASHGRAD_DELTABENCH_CASES="${FLASHGRAD_DELTABENCH2_CASES:-}" \
  exec bash "$(dirname "$0")/deltabench.sh"
