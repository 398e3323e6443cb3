"""Bounded concurrent calls with retries, for PLMs behind an HTTP API (OpenAI-compatible endpoints):
at most ``max_concurrency`` requests in flight, a transient failure retried up to ``max_retries``
times with exponential backoff, results in input order."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def is_transient_api_error(exc: BaseException) -> bool:
    """Connection errors, timeouts, 429 and 5xx answers are worth retrying; other 4xx are not."""
    try:
        import openai
    except ImportError:  # no client installed: only plain connection problems count
        return isinstance(exc, (ConnectionError, TimeoutError))
    if isinstance(exc, (openai.APIConnectionError, openai.APITimeoutError, openai.RateLimitError,
                        openai.InternalServerError)):
        return True
    status = getattr(exc, "status_code", None)
    return isinstance(status, int) and (status == 429 or status >= 500)


def call_with_retries(fn: Callable[[], R], max_retries: int, backoff_s: float,
                      retry_if: Callable[[BaseException], bool]) -> R:
    for attempt in range(max_retries + 1):
        try:
            return fn()
        except Exception as exc:
            if attempt == max_retries or not retry_if(exc):
                raise
            time.sleep(backoff_s * 2**attempt)
    raise AssertionError("unreachable")


def map_bounded(fn: Callable[[int, T], R], items: Sequence[T], *, max_concurrency: int, max_retries: int = 3,
                backoff_s: float = 0.5, retry_if: Callable[[BaseException], bool] = is_transient_api_error) -> list[R]:
    """``[fn(i, item) for i, item in enumerate(items)]`` with at most ``max_concurrency`` calls at once."""
    if max_concurrency < 1 or max_retries < 0:
        raise ValueError("map_bounded: max_concurrency >= 1 and max_retries >= 0")
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(max_concurrency, len(items))) as pool:
        futures = [pool.submit(call_with_retries, lambda i=i, x=x: fn(i, x), max_retries, backoff_s, retry_if)
                   for i, x in enumerate(items)]
        return [f.result() for f in futures]
