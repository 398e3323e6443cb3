#!/usr/bin/env bash
# The GPU check in one command (issue 40): the product's DP-SGD engine on a Llama-7B-shaped model,
# correctness on the device, DP vs non-DP tokens/s and peak memory, HF generation with the DP adapter.
#
#   bash scripts/gpu_check.sh              # on the lent GPU machine: figures into $OUT (default ./gpu_check_out)
#   bash scripts/gpu_check.sh --profile    # on the GPU: where one logical step's time goes, per mode
#   bash scripts/gpu_check.sh --rehearse   # here, on CPU: the same script at the tiny shape, in a venv that
#                                          # holds only what the GPU image has (Python 3.12, torch 2.11,
#                                          # transformers 5.17, peft, accelerate) plus the carried wheels
#
# The wheels come from scripts/gpu_wheels.sh (run it here first; the device call carries .whl).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
mode=gpu
case "${1:-}" in --rehearse) mode=rehearse ;; --profile) mode=profile ;; esac
OUT=${OUT:-$REPO/gpu_check_out}
mkdir -p "$OUT"
ls .whl/*.whl >/dev/null 2>&1 || { echo "gpu_check: no wheels in .whl/: run scripts/gpu_wheels.sh first"; exit 3; }

if [ "$mode" = rehearse ]; then
  # Outside the repo: a torch 2.11 CUDA build and its CUDA libraries are gigabytes.
  RDIR=${DPSYNTH_REHEARSAL_DIR:-$HOME/.cache/dpsynth/gpu-rehearsal}
  PY312=${PY312:-$(command -v python3.12 || ls "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | head -1)}
  [ -x "$PY312" ] || { echo "gpu_check: the rehearsal needs Python 3.12 (the GPU image's); set PY312"; exit 3; }
  if [ ! -f "$RDIR/venv/.ready" ]; then
    echo "gpu_check: building the rehearsal venv in $RDIR (first time: a few GB of downloads)"
    mkdir -p "$RDIR" && "$PY312" -m venv "$RDIR/venv" || exit 3
    PIP_CACHE_DIR=$RDIR/pip "$RDIR/venv/bin/python" -m pip install -q --disable-pip-version-check \
      torch==2.11.0 transformers==5.17.0 peft accelerate==1.15.0 numpy scipy pyyaml tokenizers safetensors \
      opt_einsum 2>&1 | grep -v "is ignored" || true
    # What the GPU image lacks must come from the carried wheels, as it will there.
    "$RDIR/venv/bin/python" -m pip uninstall -q -y pydantic pydantic_core annotated-types typing-inspection opacus \
      2>/dev/null
    "$RDIR/venv/bin/python" -c "import torch, transformers, peft, accelerate" || exit 3
    touch "$RDIR/venv/.ready"
  fi
  PY=$RDIR/venv/bin/python
  SHAPE=tiny
  export CUDA_VISIBLE_DEVICES=""
else
  PY=python3
  SHAPE=7b
fi

SITE=$(mktemp -d /tmp/gpu_check_site.XXXX)
"$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" .whl/*.whl || { echo "gpu_check: the carried wheels did not install"; exit 3; }
export PYTHONPATH=$SITE:$REPO PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ "$mode" = profile ]; then
  timeout 300 "$PY" benchmarks/gpu_check_parts.py profile --shape "$SHAPE" --modes "${PROFILE_MODES:-nondp,hooks,ghost,fsdp2}" \
    --json "$OUT/gpu_profile.json" 2>&1 | grep -v -e "USDT" -e "ActivityProfiler" | tee "$OUT/gpu_profile.log"
else
  "$PY" benchmarks/gpu_check.py --shape "$SHAPE" --out "$OUT" 2>&1 | tee "$OUT/gpu_check.log"
fi
rc=${PIPESTATUS[0]}
rm -rf "$SITE"
exit "$rc"
