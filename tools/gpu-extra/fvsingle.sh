#!/usr/bin/env bash
# fvsingle (issue 6, lead, session 14): the states rebuilt from v_new with single-fragment products
# (FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS=single in run 14.3, when hi + lo was the default: half the mmas,
# no lo split; chunked_state_from_vnew.cuh). Single is the default since; "split" selects hi + lo.
#   1. the kept-path GPU tests with it (C++ ChunkedKeptVNew* + past 2^31, pytest keep_v_new and the JAX
#      chunked test), so that a default flip after this run rests on tests that ran it;
#   2. per-kernel times and the gradients against hi + lo (variant_compare) at B1 T32768 and B8 T4096;
#   3. fvsingle.py: off / kept hi + lo / kept single in deltabench's configuration, one process;
#   4. compute-sanitizer of a small kept case with it.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
job_tests fvsingle_tests 50 'DeltaRuleGpu.ChunkedKeptVNew*:DeltaRuleGpu.PastTwoToThe31Elements' \
  FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS=single
FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS=single timeout -k 3 "$(cap 40)" python3 -m pytest -q -m gpu \
  tests/python/test_torch_delta_rule.py tests/python/test_jax.py -k "keep_v_new or chunked_delta_rule" \
  -p no:cacheprovider > "$OUT/extra/fvsingle_pytest.log" 2>&1
l="pytest (single) -k 'keep_v_new or chunked_delta_rule' rc=$?: $(tail -1 "$OUT/extra/fvsingle_pytest.log")"; echo "$l"; summary+=("$l")
job_compare fvsingle_t32k 30 --kind gdn --shape 1,32768,16,128 --env FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS \
  --variants hilo=split,single=single --focus 'chunk_state' --reps 3,3,1 --note "(run 13.5: 0.313 per pass)"
job_compare fvsingle_b8 30 --kind gdn --shape 8,4096,16,128 --env FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS \
  --variants hilo=split,single=single --focus 'chunk_state' --reps 3,3,1 --note "(run 13.5: 0.348)"
timeout -k 3 "$(cap 60)" python3 tools/gpu-extra/fvsingle.py > "$OUT/extra/fvsingle_ab.log" 2>&1
grep "^ROW" "$OUT/extra/fvsingle_ab.log"
while IFS= read -r l; do summary+=("${l#ROW }"); done < <(grep "^ROW" "$OUT/extra/fvsingle_ab.log")
job_sanitize fvsingle 20 'DeltaRuleGpu.ChunkedKeptVNewMatches' 'DeltaRuleGpu.ChunkedKeptVNewMatches' \
  FLASHGRAD_CHUNKED_FROM_VNEW_PRODUCTS=single
job_summary fvsingle
