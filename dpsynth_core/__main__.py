"""`python -m dpsynth_core ...` == `dpsynth ...` (used as the entrypoint of submitted jobs)."""

from dpsynth_core.cli.main import app

if __name__ == "__main__":
    app()
