"""One runnable example per command, shown at the end of its ``--help`` (click's epilog).

Kept in one table so that a new command without an example is caught by tests/test_help_examples.py.
Paths are those of this repository (run from its root); configs/ holds more.
"""

from __future__ import annotations

EXAMPLES: dict[str, list[str]] = {
    "": ["dpsynth run actg --config configs/actg_demo.yaml", "dpsynth ledger show runs/actg_demo"],
    "privacy": ["dpsynth privacy epsilon -q 0.01 -s 1.0 -T 1000 --delta 1e-5"],
    "privacy epsilon": ["dpsynth privacy epsilon --sampling-rate 0.01 --noise-multiplier 1.0 --steps 1000 --delta 1e-5"],
    "privacy calibrate": ["dpsynth privacy calibrate --epsilon 2 --delta 1e-5 --sampling-rate 0.01 --steps 1000"],
    "privacy zcdp": ["dpsynth privacy zcdp --rho 0.1 --delta 1e-5", "dpsynth privacy zcdp --epsilon 1 --delta 1e-5"],
    "ledger": ["dpsynth ledger show runs/actg_demo"],
    "ledger show": ["dpsynth ledger show runs/actg_demo", "dpsynth ledger show runs/actg_demo --json"],
    "models": ["dpsynth models list"],
    "models list": ["dpsynth models list"],
    "models pull": ["dpsynth models pull smollm2-135m-instruct"],
    "data": ["dpsynth data check my_texts.csv --text-col abstract --label-col category"],
    "data check": ["dpsynth data check my_texts.csv --text-col abstract --label-col category",
                   "dpsynth data check my_table.csv --columns age:numeric,sex:categorical,income:categorical"],
    "train": ["dpsynth train --config configs/train_demo.yaml"],
    "run": ["dpsynth run augpe --config configs/augpe_demo.yaml"],
    "run actg": ["dpsynth run actg --config configs/actg_demo.yaml", "dpsynth run actg --config configs/actg_demo.yaml --fresh"],
    "run wasp": ["dpsynth run wasp --config configs/wasp_demo.yaml"],
    "run augpe": ["dpsynth run augpe --config configs/augpe_demo.yaml"],
    "run dpfair": ["dpsynth run dpfair --config configs/dpfair_demo.yaml"],
    "run aim": ["dpsynth run aim --config configs/aim_eps1.yaml"],
    "serve": ["dpsynth serve start --config configs/serve_smollm2.yaml --detach"],
    "serve start": ["dpsynth serve start --config configs/serve_smollm2.yaml --detach"],
    "serve status": ["dpsynth serve status"],
    "serve stop": ["dpsynth serve stop"],
    "eval": ["dpsynth eval tabular --run runs/dpfair_demo --real-train train.csv --real-test test.csv"],
    "eval tabular": ["dpsynth eval tabular --run runs/dpfair_demo --real-train train.csv --real-test test.csv --out eval_demo"],
    "report": ["dpsynth report runs/actg_demo",
               "dpsynth report runs/dpfair/dpfair_eps4_1000 --baseline runs/aim/aim_eps4"],
    "jobs": ["dpsynth jobs list"],
    "jobs list": ["dpsynth jobs list --address http://127.0.0.1:8265"],
    "jobs status": ["dpsynth jobs status raysubmit_XXXX"],
    "jobs logs": ["dpsynth jobs logs raysubmit_XXXX --follow"],
    "jobs stop": ["dpsynth jobs stop raysubmit_XXXX"],
    "audit": ["dpsynth audit dpsgd --config configs/audit_tiny.yaml"],
    "audit dpsgd": ["dpsynth audit dpsgd --config configs/audit_tiny.yaml"],
    "audit release": ["dpsynth audit release --config configs/audit_release_aim_eps1.yaml",
                      "dpsynth audit release --config configs/audit_release_dpfair.yaml"],
    "submit": ["dpsynth submit -- run actg --config configs/actg_demo.yaml"],
    "tune": ["dpsynth tune --config configs/sweep_actg_tiny.yaml"],
    "generate": ["dpsynth generate --config configs/batch_generate_demo.yaml"],
    "config": ["dpsynth config resolve --config configs/dpfair_eps4_1000.yaml"],
    "config resolve": ["dpsynth config resolve --config configs/dpfair_eps4_1000.yaml",
                       "dpsynth config resolve --config configs/dpfair_eps4_1000.yaml --run runs/dpfair/dpfair_eps4_1000"],
    "release": ["dpsynth release runs/actg_demo published/actg_demo"],
}


def epilog(lines: list[str]) -> str:
    # "\b" keeps click from re-wrapping the command lines into one paragraph
    return "\b\nExample:\n" + "\n".join(f"  {line}" for line in lines)


def walk(command, path: tuple[str, ...] = ()):
    """(path, command) for a click command and every command and group below it."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from walk(sub, (*path, name))


def add_examples(root) -> None:
    """Set each command's epilog from EXAMPLES (a command missing there keeps none)."""
    for path, command in walk(root):
        lines = EXAMPLES.get(" ".join(path))
        if lines:
            command.epilog = epilog(lines)
