#!/usr/bin/env bash
# keepab (issue 6, lead, session 13): kept v_new off vs on in deltabench's configuration, one process
# (tools/gpu-extra/keepab.py says why).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-extra/lib/job_lib.sh
timeout -k 3 "$(cap 120)" python3 tools/gpu-extra/keepab.py > "$OUT/extra/keepab.log" 2>&1
rc=$?
grep "^ROW" "$OUT/extra/keepab.log"; [ $rc -eq 0 ] || tail -5 "$OUT/extra/keepab.log"
while IFS= read -r l; do summary+=("${l#ROW }"); done < <(grep "^ROW" "$OUT/extra/keepab.log")
summary+=("keepab rc=$rc")
job_summary keepab
