"""Node initialisation of the ``ray_llm`` app's replicas (``LLMConfig.callback_config``).

Before its engine starts, a Ray LLM replica runs one Ray task per node of its placement group to
"download" the model. For a model in a local directory (every model this app serves: a bundled model or
a merged DP adapter) that task returns the path unchanged, yet it starts a fresh worker process and
imports torch and transformers there. The callback skips it for local directories and keeps the one
side effect the task has on the node (torch's kernels folder); remote sources download as before.
"""

from __future__ import annotations

import os

from ray.llm._internal.common.callbacks.base import CallbackBase


class LocalModelNodeInit(CallbackBase):
    """Skips Ray LLM's per-node download task when the model source is a local directory."""

    async def on_before_node_init(self) -> None:
        source = self.llm_config.model_loading_config.model_source
        if isinstance(source, str) and os.path.isdir(source):
            import torch

            # what Ray's download task does on the node first (a torch workaround), so nothing else changes
            os.makedirs(os.path.join(torch.hub._get_torch_home(), "kernels"), exist_ok=True)
            self.ctx.run_init_node = False
