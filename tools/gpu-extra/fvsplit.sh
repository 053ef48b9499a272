#!/usr/bin/env bash
# fvsplit (issue 6, lead, session 15): the rebuild of the states from v_new with hi + lo products (the
# default since this run's tree: the host emulation showed single products' rounding adding up where
# the states grow; chunked_state_from_vnew.cu) against single products (FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS=single),
# wide kernels, per-kernel times and gradients at B8 T4096 and B1 T32768 (gpu-check's suites run the default).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
E=FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS
job_compare fvsplit_b8 25 --kind gdn --shape 8,4096,16,128 --env $E --variants single=single,split=- \
  --focus 'from_vnew' --reps 3,3,1 --note "(run 15.2: single 0.207 ms)"
job_compare fvsplit_t32k 25 --kind gdn --shape 1,32768,16,128 --env $E --variants single=single,split=- \
  --focus 'from_vnew' --reps 3,3,1 --note "(run 15.2: single 0.097 + 0.217 ms)"
job_summary fvsplit
