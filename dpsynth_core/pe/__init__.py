"""Private evolution (Aug-PE) and WASP: DP synthetic text from PLM APIs and a few private samples.

One small class per concern, like DPSDA's ``pe`` library:
``llm`` (PLM backends), ``embedding``, ``histogram`` (vote rules), ``dp`` (the votes' sensitivity; the
Gaussian mechanism is ``privacy.gaussian_histogram``), ``population`` (the data object, selection),
``weights`` (WASP PLM weights), ``prompts`` (templates as data files), ``callbacks``/``checkpoint`` (every
iteration), ``runner`` (the loops), ``evaluate`` (downstream accuracy, FID, MAUVE), ``pipeline`` (a whole run).
"""

from dpsynth_core.pe.dp import joint_topq_l2_sensitivity, nearest_neighbor_l2_sensitivity, topq_weights
from dpsynth_core.pe.histogram import Histogram, NearestNeighborHistogram, TopQHistogram, VoteHistograms
from dpsynth_core.pe.llm import LLM, HFLocalLLM, OpenAICompatibleLLM
from dpsynth_core.pe.population import Population
from dpsynth_core.pe.weights import allocate_budget, update_plm_weights

__all__ = [
    "LLM",
    "HFLocalLLM",
    "Histogram",
    "NearestNeighborHistogram",
    "OpenAICompatibleLLM",
    "Population",
    "TopQHistogram",
    "VoteHistograms",
    "allocate_budget",
    "joint_topq_l2_sensitivity",
    "nearest_neighbor_l2_sensitivity",
    "topq_weights",
    "update_plm_weights",
]
