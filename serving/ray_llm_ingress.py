"""Ray's OpenAI ingress (ray.serve.llm) with the dpsynth app's key, limits and /ready in front.

``build_openai_app`` turns the ingress methods into FastAPI routes in the process that builds the
app: Serve's class-based view gives each method's ``self`` a dependency by setting ``__signature__``
on the shared function objects. Replicas unpickle those functions by reference, without that
attribute, so FastAPI takes ``self`` for a required query parameter and every request is a 400
("Field required at ('query', 'self')"; Ray 2.60, FastAPI 0.165). Importing this module (the replica
does, to unpickle the class below) runs the same transformation in that process too.

Ray's routes have no API key, caps, timeout, back-pressure answer or ``/ready``: the replica's ASGI
app is wrapped in :class:`serving.ray_llm_guard.RayLLMGuard` when Serve hands it over
(``_set_asgi_app``, Serve's one hook between the frozen FastAPI app and the replica; Ray 2.60).
"""

from __future__ import annotations

from ray.llm._internal.serve.core.ingress.ingress import OpenAiIngress, make_fastapi_ingress

from serving.config import ServeConfig
from serving.ray_llm_guard import RayLLMGuard


def _known_fields() -> dict[str, frozenset[str]]:
    """The body fields (names and aliases) of Ray's completion and chat request schemas."""
    from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest, CompletionRequest

    def names(schema) -> frozenset[str]:
        return frozenset(n for name, f in schema.model_fields.items() for n in (name, f.alias) if n)

    return {"/v1/completions": names(CompletionRequest), "/v1/chat/completions": names(ChatCompletionRequest)}


class RayLLMIngress(OpenAiIngress):
    """Ray's OpenAI ingress; ``serve_config`` / ``api_key_sha256`` come as ``ingress_extra_kwargs``."""

    def __init__(self, llm_deployments, model_cards, *, serve_config: dict | None = None,
                 api_key_sha256: str | None = None, **kwargs) -> None:
        super().__init__(llm_deployments, model_cards, **kwargs)
        self._serve_config = ServeConfig.model_validate(serve_config) if serve_config is not None else None
        self._api_key_sha256 = api_key_sha256

    def _set_asgi_app(self, app) -> None:
        # runs after __init__ (Serve's wrapper calls the user constructor first, then hands over the app)
        if getattr(self, "_serve_config", None) is not None:
            app = RayLLMGuard(app, self._serve_config, self._api_key_sha256, self._ping, _known_fields())
        super()._set_asgi_app(app)

    async def _ping(self, model: str) -> None:
        await self._default_serve_handles[model].check_health.remote()


make_fastapi_ingress(RayLLMIngress)  # import-time side effect: the routes' `self` dependency, in this process
