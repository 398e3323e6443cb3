#!/usr/bin/env bash
# The wheels the GPU check carries to the lent GPU machine (Python 3.12, manylinux x86-64, no network
# there): what the DP-SGD engine imports beyond that machine's image (torch, transformers, peft,
# accelerate, numpy, scipy, pyyaml, tokenizers are already there). Versions are the project lock's.
# Downloads into .whl/ (git-ignored; the device call carries it) and prints the sizes against the
# 64 MiB that the working tree and the carried paths share.
set -euo pipefail
cd "$(dirname "$0")/.."
LOCK=requirements/constraints.txt
WHEELS=(opacus pydantic pydantic_core annotated-types typing-inspection typing_extensions)
pin() {  # the lock's "name==version" for a package, whatever its spelling (- _ .)
  local re; re=$(printf '%s' "$1" | sed -e 's/[-_.]/[-_.]/g')
  grep -iE "^${re}==" "$LOCK" | head -1
}
specs=()
for name in "${WHEELS[@]}"; do
  spec=$(pin "$name")
  [ -n "$spec" ] || { echo "gpu_wheels: $name is not in $LOCK" >&2; exit 2; }
  specs+=("$spec")
done
rm -rf .whl && mkdir -p .whl
log=$(mktemp)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${specs[@]}" 2>"$log" \
  || { cat "$log" >&2; exit 1; }
rm -f "$log"
ls -l .whl | awk 'NR > 1 {printf "  %-60s %7.1f KiB\n", $9, $5 / 1024}'
wheels=$(du -sb .whl | cut -f1)
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 -r du -cb 2>/dev/null | tail -1 | cut -f1)
total=$((wheels + tree))
printf 'gpu_wheels: %.1f MiB of wheels + %.1f MiB of working tree = %.1f MiB (limit 64 MiB)\n' \
  "$(echo "$wheels / 1048576" | bc -l)" "$(echo "$tree / 1048576" | bc -l)" "$(echo "$total / 1048576" | bc -l)"
[ "$total" -le $((64 * 1048576)) ] || { echo "gpu_wheels: over the 64 MiB the device call carries" >&2; exit 1; }
