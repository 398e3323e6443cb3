"""`dpsynth release RUN_DIR DEST`: copy what a run may publish, and nothing else."""

from __future__ import annotations

from pathlib import Path

import typer


def release(
    run_dir: Path = typer.Argument(..., help="A finished run directory."),
    dest: Path = typer.Argument(..., help="Where to copy the release (must not exist, or be empty)."),
) -> None:
    """Copy RUN_DIR/release/ (synthetic data, DP adapter, ledger, manifest) to DEST after checking its hashes.

    Example: dpsynth release runs/actg_demo /tmp/actg_demo_release
    """
    from dpsynth_core.privacy.release_check import copy_release

    manifest = copy_release(run_dir, dest)
    # a reference or test run states no epsilon (its manifest's is null): never a DP guarantee
    guarantee = ("NOT PRIVATE (test/reference run): no DP guarantee" if manifest.get("not_private")
                 else f"epsilon {manifest['epsilon']:.4f} at delta {manifest['delta']:.3g}")
    typer.echo(f"released {len(manifest['files'])} files to {dest.resolve()}: {manifest['method']}, {guarantee}")
