#!/usr/bin/env bash
# Packs the built delta-rule test and benchmark (tools/dev/delta_rule_build.sh) into
# build-cuda-delta/pack/bins.tgz (stripped and compressed: the unstripped binaries together exceed
# the device tool's 64 MiB carry limit). On the GPU machine, with carry=["build-cuda-delta/pack"]:
#   mkdir -p /tmp/b && tar xzf build-cuda-delta/pack/bins.tgz -C /tmp/b && cd /tmp/b &&
#   ./delta_rule_gpu_test && ./delta_rule_bench --reps 5
set -euo pipefail
cd "$(dirname "$0")/../../build-cuda-delta"
rm -rf carry pack && mkdir carry pack
for f in delta_rule_gpu_test delta_rule_bench; do strip -o "carry/$f" "$f"; done
tar czf pack/bins.tgz -C carry .
ls -la pack/bins.tgz
