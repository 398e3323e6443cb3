"""Where private records may be sent: a loopback endpoint, or elsewhere only when the config says so.

An attribute extractor behind an OpenAI-compatible API receives raw private texts. A server on this
machine (vLLM, Ray Serve) keeps them here; any other host -- the hosted API when no base URL is
given, a colleague's server, a cloud endpoint -- is processing by a third party, which a data
owner must opt into with ``allow_external_processing: true``. The check runs when the config is
loaded and again before a client is built, so nothing is sent before it.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from dpsynth_core.errors import ConfigError

HOSTED_API = "the hosted OpenAI API"


def is_loopback_url(base_url: str | None) -> bool:
    """True if ``base_url`` points at this machine (localhost, 127.0.0.0/8, ::1)."""
    if not base_url:
        return False  # no base URL: the client's default, the hosted API
    host = urlsplit(base_url if "://" in base_url else f"http://{base_url}").hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_local_or_allowed(base_url: str | None, allow_external_processing: bool, where: str) -> None:
    """Refuse to send private records to a non-loopback endpoint unless explicitly allowed."""
    if allow_external_processing or is_loopback_url(base_url):
        return
    target = f"'{base_url}'" if base_url else HOSTED_API
    raise ConfigError(
        f"{where}: would send private records to {target}, which is not on this machine. Serve the model "
        "locally (e.g. `dpsynth serve start`, base_url: http://127.0.0.1:8000/v1), or set "
        "allow_external_processing: true if sending the private data to that endpoint is acceptable"
    )
