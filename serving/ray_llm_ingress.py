"""Ray's OpenAI ingress (ray.serve.llm), made to work when its replica is in another process.

``build_openai_app`` turns the ingress methods into FastAPI routes in the process that builds the
app: Serve's class-based view gives each method's ``self`` a dependency by setting ``__signature__``
on the shared function objects. Replicas unpickle those functions by reference, without that
attribute, so FastAPI takes ``self`` for a required query parameter and every request is a 400
("Field required at ('query', 'self')"; Ray 2.60, FastAPI 0.165). Importing this module (the replica
does, to unpickle the class below) runs the same transformation in that process too.
"""

from __future__ import annotations

from ray.llm._internal.serve.core.ingress.ingress import OpenAiIngress, make_fastapi_ingress


class RayLLMIngress(OpenAiIngress):
    """Ray's OpenAI ingress, unchanged; the class exists so replicas import this module."""


make_fastapi_ingress(RayLLMIngress)  # import-time side effect: the routes' `self` dependency, in this process
