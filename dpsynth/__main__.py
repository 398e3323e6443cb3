"""`python -m dpsynth ...` == `dpsynth ...` (the entrypoint of submitted Ray jobs)."""

from dpsynth.cli.main import app

if __name__ == "__main__":
    app()
