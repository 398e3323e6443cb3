"""dpsynth: the product's top package, above the Ray drivers and Serve.

    dpsynth (CLI; the Python API later)  >  ray_jobs, serving  >  dpsynth_core (the Ray-free library)

The layers are contracts (``[tool.importlinter]`` in pyproject.toml), checked first by ``make test``.
"""
