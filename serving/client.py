"""Client helpers for pipelines (ACTG Best-of-N, WASP multi-PLM): Serve handles or plain HTTP.

    client = GenerationClient("dpsynth-generation")        # the app deployed by serving.app.deploy
    rows = client.generate(["prompt"], n=2, max_new_tokens=64)         # list[list[str]]
    best = client.best_of_n(["prompt"], n=8, metadata=[{"keywords": ["mouse"]}])
    tagged = client.generate_multi(["prompt"])                          # {plm: list[list[str]]}

Sync methods block (use them from drivers / Ray tasks); ``a``-prefixed ones are coroutines.
"""

from __future__ import annotations

from typing import Any

from serving.schemas import BestOfNRequest, BestOfNResult, GenerationRequest


class GenerationClient:
    """Wraps the ingress handle of a deployed generation app."""

    def __init__(self, app_name: str = "dpsynth-generation", handle: Any = None) -> None:
        if handle is None:
            from ray import serve

            handle = serve.get_app_handle(app_name)
        self.handle = handle

    # -- requests ---------------------------------------------------------------------------
    @staticmethod
    def _request(prompts: list[str], **kwargs) -> GenerationRequest:
        return GenerationRequest(prompts=list(prompts), **{k: v for k, v in kwargs.items() if v is not None})

    def generate(self, prompts: list[str], *, model: str | None = None, max_new_tokens: int = 64,
                 temperature: float = 1.0, top_p: float = 1.0, n: int = 1, seed: int | None = None,
                 stop: list[str] | None = None) -> list[list[str]]:
        """``n`` completions per prompt."""
        req = self._request(prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, n=n,
                            seed=seed, stop=stop)
        return self.handle.generate.remote(req, model).result()

    async def agenerate(self, prompts: list[str], *, model: str | None = None, **kwargs) -> list[list[str]]:
        return await self.handle.generate.remote(self._request(prompts, **kwargs), model)

    def best_of_n(self, prompts: list[str], *, n: int = 4, metadata: list[dict] | None = None, **kwargs
                  ) -> list[BestOfNResult]:
        """Best of ``n`` candidates per prompt under the configured (or an allowed) scorer."""
        return self.handle.best_of_n.remote(BestOfNRequest(prompts=list(prompts), n=n, metadata=metadata,
                                                           **kwargs)).result()

    async def abest_of_n(self, prompts: list[str], *, n: int = 4, metadata: list[dict] | None = None, **kwargs
                         ) -> list[BestOfNResult]:
        return await self.handle.best_of_n.remote(BestOfNRequest(prompts=list(prompts), n=n, metadata=metadata,
                                                                 **kwargs))

    def generate_multi(self, prompts: list[str], *, plms: list[str] | None = None, **kwargs
                       ) -> dict[str, list[list[str]]]:
        """The same prompts to every PLM (or ``plms``) concurrently; ``{plm: n completions per prompt}``."""
        return self.handle.generate_multi.remote(self._request(prompts, **kwargs), plms).result()

    async def agenerate_multi(self, prompts: list[str], *, plms: list[str] | None = None, **kwargs
                              ) -> dict[str, list[list[str]]]:
        return await self.handle.generate_multi.remote(self._request(prompts, **kwargs), plms)

    def models(self) -> list[str]:
        return self.handle.models.remote().result()

    def stats(self, model: str | None = None) -> dict:
        return self.handle.stats.remote(model).result()


class HTTPGenerationClient:
    """The same ``generate`` over the OpenAI-compatible HTTP route (for processes outside Ray)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)

    def models(self) -> list[str]:
        response = self._http.get("/v1/models")
        response.raise_for_status()
        return [m["id"] for m in response.json()["data"]]

    def generate(self, prompts: list[str], *, model: str, max_new_tokens: int = 64, temperature: float = 1.0,
                 top_p: float = 1.0, n: int = 1, seed: int | None = None) -> list[list[str]]:
        body = {"model": model, "prompt": list(prompts), "max_tokens": max_new_tokens, "temperature": temperature,
                "top_p": top_p, "n": n}
        if seed is not None:
            body["seed"] = seed
        response = self._http.post("/v1/completions", json=body)
        if response.status_code != 200:
            message = response.json().get("error", {}).get("message", response.text[:200])
            raise RuntimeError(f"generation service answered {response.status_code}: {message}")
        choices = sorted(response.json()["choices"], key=lambda c: c["index"])
        return [[c["text"] for c in choices[i * n:(i + 1) * n]] for i in range(len(prompts))]

    def close(self) -> None:
        self._http.close()
