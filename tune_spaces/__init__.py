"""Search spaces for `dpsynth tune`, one module per pipeline.

Each module exposes ``SPACES: dict[str, Callable[[], dict]]``: a name -> a function building a
Ray Tune param space whose keys are dotted paths into the pipeline's YAML config
(``rl.gamma0``, ``plms.0.temperature``).
"""
