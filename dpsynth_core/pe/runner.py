"""The WASP and Aug-PE loops. One :class:`RunState` (a :class:`Population` plus PLM weights and
history) flows through; every iteration ends with the callbacks (metrics, checkpoint).

Privacy: the only steps that read private data are the vote histograms. Before the first vote
the runner checks and records ONE :class:`GaussianEvent` covering all T noisy releases
(``compositions = T``) at the calibrated noise multiplier; generation and prompting only see
synthetic samples and public label names (post-processing).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from dpsynth_core.engines.config import SamplingParams
from dpsynth_core.errors import ConfigError, DataError
from dpsynth_core.pe.callbacks import Callback
from dpsynth_core.pe.checkpoint import RunState, VoteStore
from dpsynth_core.pe.config import PEConfig
from dpsynth_core.pe.embedding import Embedding
from dpsynth_core.pe.federated import assign_parties
from dpsynth_core.pe.histogram import Histogram, NearestNeighborHistogram, TopQHistogram, VoteHistograms
from dpsynth_core.pe.llm import LLM
from dpsynth_core.pe.population import Population, draw_examples, resample_per_class, top_per_class
from dpsynth_core.pe.prompts import PromptSet
from dpsynth_core.pe.weights import allocate_budget, update_plm_weights
from dpsynth_core.privacy.gaussian_histogram import (
    FederatedGaussianHistogram,
    GaussianHistogram,
    NoiselessHistogram,
    calibrate_histogram_noise,
)
from dpsynth_core.privacy.randomness import secure_rng

log = logging.getLogger(__name__)
VOTE_STAGE = {"wasp": "wasp.topq_vote", "augpe": "augpe.nn_vote"}
GEN_STAGE = {"wasp": "wasp.generate", "augpe": "augpe.generate"}


@dataclass
class PrivateData:
    """Private labelled records: held in memory only, never logged or written."""

    texts: list[str]
    labels: list[str]
    parties: list[int] | None = None  # federated: each record's party (party files); None: split by config

    def __repr__(self) -> str:  # never print records by accident
        return f"PrivateData(<{len(self.texts)} private records>)"


def generate_all(llms: Sequence[LLM], requests: list[list[str]], params: list[SamplingParams],
                 parallel: bool = True) -> list[list[str]]:
    """Submit every PLM's prompts first, then wait: Ray/Serve backends run concurrently.
    ``parallel=False`` waits for each PLM before calling the next (the reference code's way)."""
    if not parallel:
        return [llm.submit(p, prm).result() if p else [] for llm, p, prm in zip(llms, requests, params)]
    pending = [llm.submit(p, prm) if p else None for llm, p, prm in zip(llms, requests, params)]
    return [[] if h is None else h.result() for h in pending]


class PERunner:
    """Runs ``config.method`` (wasp | augpe) over ``llms`` with a privacy ``ledger``."""

    def __init__(self, config: PEConfig, llms: Sequence[LLM], embedding: Embedding, prompts: PromptSet,
                 ledger, classes: list[str], callbacks: Sequence[Callback] = (),
                 vote_store: VoteStore | None = None) -> None:
        if len(llms) != len(config.plms):
            raise DataError(f"runner: {len(llms)} LLM backends for {len(config.plms)} configured PLMs")
        self.cfg = config
        self.llms = list(llms)
        self.embedding = embedding
        self.prompts = prompts
        self.ledger = ledger
        self.classes = list(classes)
        self.callbacks = list(callbacks)
        self.vote_store = vote_store
        self.histogram: Histogram = TopQHistogram(config.q) if config.method == "wasp" else NearestNeighborHistogram()
        if config.is_reference:  # epsilon = inf (not_private: true): the votes carry no noise
            self.noise_multiplier = 0.0
            self.mechanism = NoiselessHistogram(self.histogram.sensitivity)
            return
        self.noise_multiplier = calibrate_histogram_noise(config.epsilon, ledger.delta, config.iterations)
        if config.federated_parties > 1:
            self.mechanism = FederatedGaussianHistogram(self.noise_multiplier, self.histogram.sensitivity,
                                                        config.federated_parties)
        else:
            self.mechanism = GaussianHistogram(self.noise_multiplier, self.histogram.sensitivity)

    # ----------------------------------------------------------------------------- helpers
    def _rounds(self) -> int:
        return self.cfg.iterations + 1 if self.cfg.method == "wasp" else 1

    def _per_round(self, rnd: int) -> int:
        """WASP splits the final N samples over T+1 generation rounds; Aug-PE keeps N each round."""
        if self.cfg.method == "augpe":
            return self.cfg.num_synthetic
        base, extra = divmod(self.cfg.num_synthetic, self.cfg.iterations + 1)
        return base + (1 if rnd < extra else 0)

    def _params(self, k: int, rnd: int) -> SamplingParams:
        p = self.cfg.plms[k]
        return SamplingParams(max_new_tokens=self.cfg.max_new_tokens, temperature=p.temperature, top_p=p.top_p,
                              seed=(self.cfg.seed * 100_003 + p.seed * 1_009 + rnd * 31 + k) % 2**62)

    def _assign(self, weights: np.ndarray, total: int) -> list[list[str]]:
        """Labels each PLM writes this round: classes evenly, PLMs by weight within a class."""
        per_class = allocate_budget(np.ones(len(self.classes)), total)
        out: list[list[str]] = [[] for _ in self.llms]
        for c, n_c in zip(self.classes, per_class):
            for k, n in enumerate(allocate_budget(weights, n_c)):
                out[k] += [c] * n
        return out

    def _generate(self, prompts: list[list[str]], labels: list[list[str]], rnd: int) -> tuple[Population, float]:
        t0 = time.perf_counter()
        params = [self._params(k, rnd) for k in range(len(self.llms))]
        texts = generate_all(self.llms, prompts, params, parallel=self.cfg.parallel_plms)
        new = Population()
        for k, (ts, ls) in enumerate(zip(texts, labels)):
            if len(ts) != len(ls):
                raise DataError(f"PLM '{self.llms[k].name}' returned {len(ts)} completions for {len(ls)} prompts")
            new.extend(ts, ls, [k] * len(ts), born=rnd)
        return new, time.perf_counter() - t0

    def zero_shot(self, total: int, rnd: int = 0) -> tuple[Population, float, list[int]]:
        """``total`` zero-shot samples, classes evenly, PLMs equally (no private data involved).
        Returns the population, the generation wall time and each PLM's budget."""
        w = np.full(len(self.llms), 1.0 / len(self.llms))
        labels = self._assign(w, total)
        prompts = [[self.prompts.render_zero_shot(c) for c in ls] for ls in labels]
        pop, secs = self._generate(prompts, labels, rnd=rnd)
        return pop, secs, [len(ls) for ls in labels]

    def first_vote_candidates_per_class(self) -> int:
        """Fewest synthetic samples of one class at WASP's first vote (public: from the config)."""
        return min(allocate_budget(np.ones(len(self.classes)), self._per_round(0)))

    def check_votes_not_degenerate(self) -> None:
        """Refuse a WASP run whose first vote gives a class fewer than 2Q candidates: every private
        record's Q nearest and Q farthest samples then overlap (with <= Q, every record votes for every
        candidate), so the noisy votes barely separate samples or PLMs while the run still spends its
        whole epsilon. Refused rather than warned: a warning scrolls by and the budget is gone."""
        if self.cfg.method != "wasp" or self.cfg.allow_degenerate_votes:
            return
        fewest = self.first_vote_candidates_per_class()
        if fewest < 2 * self.cfg.q:
            raise ConfigError(
                f"WASP: the first vote has {fewest} synthetic samples per class (num_synthetic / (iterations + 1) "
                f"over {len(self.classes)} classes) for Q = {self.cfg.q} nearest and Q farthest votes; they overlap "
                f"below 2Q = {2 * self.cfg.q}, so the vote is degenerate. Raise num_synthetic, lower q, or set "
                "allow_degenerate_votes: true")

    def _noise_rng(self, iteration: int) -> np.random.Generator:
        if self.cfg.noise_seed is None:
            return secure_rng()  # OS entropy: the noise is not reproducible on purpose
        # Test-only (config refuses it outside DPSYNTH_TEST_MODE; the ledger says "not private").
        return np.random.default_rng([self.cfg.noise_seed, iteration])

    def _federated_details(self) -> dict:
        """What holds per party when L parties each add N(0, (sigma / sqrt L)^2) and the sum is formed
        WITHOUT secure aggregation: whoever sees one party's message (the aggregator) sees that
        party's records protected by noise multiplier z / sqrt(L) over T votes, i.e. a larger epsilon
        than the released sum's (which carries N(0, sigma^2): the ledger's event)."""
        from dpsynth_core.privacy import gaussian_epsilon

        assert isinstance(self.mechanism, FederatedGaussianHistogram)
        party_nm = self.noise_multiplier / math.sqrt(self.mechanism.parties)
        delta, t = self.ledger.delta, self.cfg.iterations
        return {
            "parties": self.mechanism.parties, "secure_aggregation": False,
            "split": "party files" if self.cfg.data.party_paths else self.cfg.federated_split,
            **({"dirichlet_alpha": self.cfg.dirichlet_alpha}
               if not self.cfg.data.party_paths and self.cfg.federated_split == "dirichlet" else {}),
            "party_sigma": self.mechanism.party_sigma, "party_noise_multiplier": party_nm,
            "epsilon_released_sum": gaussian_epsilon(self.noise_multiplier, t, delta),
            "epsilon_per_party_message": gaussian_epsilon(party_nm, t, delta),
            "guarantee": "the released (summed) votes satisfy the ledger's epsilon for every record; a party's "
                         "own noisy message, as seen by the aggregator without secure aggregation, satisfies "
                         "only epsilon_per_party_message for that party's records (at the ledger's delta)",
        }

    def _record_privacy(self) -> None:
        """Check then record the T-fold Gaussian mechanism once, before the first vote."""
        from dpsynth_core.privacy import PostProcessingEvent

        from dpsynth_core.privacy.reference_runs import mark_reference_run

        stage = VOTE_STAGE[self.cfg.method]
        if mark_reference_run(self.ledger, stage, self.cfg.epsilon):
            return  # epsilon = inf: no finite epsilon to record; the ledger says "not private"
        if any(e.stage == stage for e in self.ledger.entries()):
            return  # resumed run: already accounted (for all T iterations)
        event = self.mechanism.event(self.cfg.iterations)
        self.ledger.check(stage, event)
        self.ledger.record(stage, event, details={
            "sensitivity_l2": self.histogram.sensitivity, "sigma": self.mechanism.sigma,
            "q": self.cfg.q if self.cfg.method == "wasp" else None,
            "federated_parties": self.cfg.federated_parties, "iterations": self.cfg.iterations,
            "noise": "OS entropy" if self.cfg.noise_seed is None else "pinned noise_seed (test only)",
            **({"federated": self._federated_details()} if self.cfg.federated_parties > 1 else {}),
        })
        if self.cfg.noise_seed is not None:
            self.ledger.mark_not_private(stage, "noise_seed pins the vote noise to a public seed (test only)")
        if not any(e.stage == GEN_STAGE[self.cfg.method] for e in self.ledger.entries()):
            self.ledger.record(GEN_STAGE[self.cfg.method], PostProcessingEvent(),
                               details={"what": "prompting PLMs with synthetic samples and label names"})

    def _vote(self, private: PrivateData, private_emb: np.ndarray, pop: Population, iteration: int) -> VoteHistograms:
        has_far = self.histogram.has_farthest
        if self.vote_store is not None:
            stored = self.vote_store.load(iteration, len(pop))
            if stored is not None:  # released before an interruption: re-use it, never redraw
                log.info("iteration %d: re-using the stored noisy vote", iteration)
                return VoteHistograms.split(np.asarray(stored), len(pop), has_far)
        noisy = self._noisy_vote(private, private_emb, pop, iteration)
        if self.vote_store is not None:
            self.vote_store.save(iteration, noisy.tolist(), len(pop))
        return VoteHistograms.split(noisy, len(pop), has_far)

    def _noisy_vote(self, private: PrivateData, private_emb: np.ndarray, pop: Population, iteration: int) -> np.ndarray:
        synth_emb = self.embedding.encode(pop.texts)
        rng = self._noise_rng(iteration)
        if isinstance(self.mechanism, FederatedGaussianHistogram):
            parties = self._parties(private)
            partials = []
            for j in range(self.mechanism.parties):
                idx = np.flatnonzero(parties == j)
                h = self.histogram.compute(private_emb[idx], [private.labels[i] for i in idx], synth_emb, pop.labels)
                partials.append(h.joint())
            noisy = self.mechanism.aggregate(partials, rng)
        else:
            raw = self.histogram.compute(private_emb, private.labels, synth_emb, pop.labels)
            noisy = self.mechanism.privatize(raw.joint(), rng)
        return noisy

    def _parties(self, private: PrivateData) -> np.ndarray:
        """Each private record's party: from its file, else the configured split (drawn once per run)."""
        if private.parties is not None:
            return np.asarray(private.parties, dtype=np.int64)
        if getattr(self, "_party_of", None) is None or len(self._party_of) != len(private.labels):
            self._party_of = assign_parties(private.labels, self.mechanism.parties, self.cfg.federated_split,
                                            self.cfg.dirichlet_alpha, secure_rng())
        return self._party_of

    def _end_iteration(self, state: RunState) -> None:
        for cb in self.callbacks:
            cb.on_iteration_end(state)

    # ----------------------------------------------------------------------------- loops
    def run(self, private: PrivateData, state: RunState | None = None) -> RunState:
        """Run (or continue from ``state``) until iteration T; returns the final state."""
        missing = sorted(set(private.labels) - set(self.classes))
        if missing:
            raise DataError(f"private data: {len(missing)} label(s) outside the configured classes")
        k = len(self.llms)
        if state is None:
            w = np.full(k, 1.0 / k)
            pop, secs, budgets = self.zero_shot(self._per_round(0), rnd=0)
            state = RunState(self.cfg.method, 0, pop, w.tolist(), [{
                "iteration": 0, "generated": len(pop), "generate_seconds": round(secs, 3),
                "plm_weights": w.tolist(), "budgets": budgets,
            }])
            self._end_iteration(state)
        if state.iteration >= self.cfg.iterations:
            return self._finish(state)
        self.check_votes_not_degenerate()
        self._record_privacy()
        private_emb = self.embedding.encode(private.texts)
        bar = tqdm(range(state.iteration + 1, self.cfg.iterations + 1), desc=f"{self.cfg.method} iterations",
                   initial=state.iteration, total=self.cfg.iterations)
        for t in bar:
            step = self._wasp_step if self.cfg.method == "wasp" else self._augpe_step
            state = step(state, private, private_emb, t)
            self._end_iteration(state)
        return self._finish(state)

    def _finish(self, state: RunState) -> RunState:
        for cb in self.callbacks:
            cb.on_run_end(state)
        return state

    def _wasp_step(self, state: RunState, private: PrivateData, private_emb: np.ndarray, t: int) -> RunState:
        pop = state.population
        fewest = min(pop.labels.count(c) for c in self.classes)
        if fewest <= self.cfg.q:  # every voter then covers all candidates of its class: weak signal
            log.warning("iteration %d: a class has only %d synthetic samples for Q = %d nearest / farthest votes; "
                        "the nearest and farthest sets overlap and the votes barely separate samples or PLMs "
                        "(use a smaller q or a larger num_synthetic)", t, fewest, self.cfg.q)
        t0 = time.perf_counter()
        votes = self._vote(private, private_emb, pop, t)
        vote_secs = time.perf_counter() - t0
        pop.nearest_votes = votes.nearest.tolist()
        pop.farthest_votes = votes.farthest.tolist()
        w = self._next_weights(votes.nearest, pop.plm_ids, np.asarray(state.plm_weights))
        good = top_per_class(pop.labels, votes.nearest, self.cfg.select_per_class, self.classes)
        bad = top_per_class(pop.labels, votes.farthest, self.cfg.select_per_class, self.classes)
        labels = self._assign(w, self._per_round(t))
        rng = np.random.default_rng([self.cfg.seed, t])  # post-processing: picks among released samples
        prompts = [[self._wasp_prompt(c, pop, good[c], bad[c], rng) for c in ls] for ls in labels]
        new, gen_secs = self._generate(prompts, labels, rnd=t)
        votes_per_plm = np.bincount(pop.plm_ids, weights=np.maximum(votes.nearest, 0), minlength=len(self.llms))
        n_scored = len(pop)
        pop.extend(new.texts, new.labels, new.plm_ids, born=t)
        row = {
            "iteration": t, "scored": n_scored, "generated": len(new), "population": len(pop),
            "sigma": self.mechanism.sigma, "noise_multiplier": self.noise_multiplier,
            "sensitivity": self.histogram.sensitivity, "plm_weights": w.tolist(),
            "votes_per_plm": votes_per_plm.tolist(), "budgets": [len(ls) for ls in labels],
            "vote_seconds": round(vote_secs, 3), "generate_seconds": round(gen_secs, 3),
        }
        return RunState(state.method, t, pop, w.tolist(), state.history + [row])

    def _next_weights(self, nearest: np.ndarray, plm_ids: list[int], previous: np.ndarray) -> np.ndarray:
        if self.cfg.plm_weighting == "uniform":  # ablation: PLM weighting off
            return np.full(len(self.llms), 1.0 / len(self.llms))
        return update_plm_weights(nearest, plm_ids, len(self.llms), previous, self.cfg.weight_momentum,
                                  self.cfg.weight_floor, rule=self.cfg.plm_weighting)

    def _wasp_prompt(self, label: str, pop: Population, good: list[int], bad: list[int],
                     rng: np.random.Generator) -> str:
        """As in the paper, each prompt shows a random ``example_fraction`` (50 %) of the S good and of
        the S bad samples, in random order; without ``contrastive`` the bad ones are left out."""
        g = [pop.texts[i] for i in draw_examples(good, self.cfg.example_fraction, rng)]
        if not self.cfg.contrastive:
            return self.prompts.render_few_shot(label, g)
        b = [pop.texts[i] for i in draw_examples(bad, self.cfg.example_fraction, rng)]
        return self.prompts.render_contrastive(label, g, b)

    def _augpe_step(self, state: RunState, private: PrivateData, private_emb: np.ndarray, t: int) -> RunState:
        pop = state.population
        t0 = time.perf_counter()
        votes = self._vote(private, private_emb, pop, t)
        vote_secs = time.perf_counter() - t0
        pop.nearest_votes = votes.nearest.tolist()
        per_class = dict(zip(self.classes, allocate_budget(np.ones(len(self.classes)), self.cfg.num_synthetic)))
        rng = np.random.default_rng([self.cfg.seed, t])
        chosen = resample_per_class(pop.labels, votes.nearest, self.cfg.threshold, per_class, rng)
        selected = pop.subset(chosen)
        row = {"iteration": t, "scored": len(pop), "sigma": self.mechanism.sigma,
               "noise_multiplier": self.noise_multiplier, "sensitivity": self.histogram.sensitivity,
               "unique_selected": len(set(chosen)), "vote_seconds": round(vote_secs, 3),
               "plm_weights": state.plm_weights}
        if t == self.cfg.iterations:  # last vote: the selected samples are the output
            row["generate_seconds"] = 0.0
            return RunState(state.method, t, selected, state.plm_weights, state.history + [row])
        # Variations: each PLM rewrites the parents it wrote (PLM shares stay fixed in Aug-PE).
        requests: list[list[str]] = [[] for _ in self.llms]
        labels: list[list[str]] = [[] for _ in self.llms]
        for text, label, k in zip(selected.texts, selected.labels, selected.plm_ids):
            requests[k].append(self.prompts.render_variation(label, text))
            labels[k].append(label)
        new, gen_secs = self._generate(requests, labels, rnd=t)
        row.update(generated=len(new), generate_seconds=round(gen_secs, 3))
        return RunState(state.method, t, new, state.plm_weights, state.history + [row])
