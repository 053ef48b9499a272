#!/usr/bin/env bash
# final13 (issue 6, lead, session 13): with v_new kept wherever the chunked path takes it (the PyTorch
# default since this commit), the Python GPU tests of the delta rule and keepab.py (deltabench's
# configuration, kept off vs on, one process).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
timeout -k 3 "$(cap 60)" python3 -m pytest -q -m gpu tests/python/test_torch_delta_rule.py -p no:cacheprovider \
  > "$OUT/extra/final13_pytest.log" 2>&1
l="pytest -m gpu test_torch_delta_rule.py rc=$?: $(tail -1 "$OUT/extra/final13_pytest.log")"; echo "$l"; summary+=("$l")
timeout -k 3 "$(cap 60)" python3 tools/gpu-extra/keepab.py > "$OUT/extra/final13_keepab.log" 2>&1
while IFS= read -r l; do summary+=("${l#ROW }"); done < <(grep "^ROW" "$OUT/extra/final13_keepab.log")
job_summary final13
