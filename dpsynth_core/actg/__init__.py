"""ACTG-ARL: attribute-conditioned text generation with anchored RL.

Stages (one module each): ``schema`` (the attribute schema), ``schema_design`` (an LLM proposes a
schema from public descriptions), ``extractors`` (text -> attributes, IFAcc), ``features`` (AIM DP
attribute table + marginal d_JS), ``text_eval`` (MAUVE, downstream classifier, length/repetition),
``generator``, ``best_of_n``, ``anchored_rl``, ``pipeline``.

Kept import-light on purpose: import the submodule you need (torch, smartnoise and
sentence-transformers load only there).
"""
