"""One request's state inside the batch scheduler, its own drafter, and its token choice.

Token choice with position-keyed randomness: a sampled request's token at output index j is drawn by
inverse-CDF sampling from the processed target distribution p_j with the uniform
``u_j = hash(seed, j)`` (splitmix64), and a draft (chain or tree node) is accepted iff it equals that
token. With deterministic drafts (n-gram, tree candidates) this is exactly speculative sampling
(acceptance probability p(d) = min(1, p(d)/q(d)) for one-hot q; on rejection the token is a sample of
p conditioned on differing from d, i.e. ``norm(max(p - q, 0))``, Leviathan et al. 2023); for a draft
model the draft token is drawn with the same ``u_j`` from its own q (common random numbers), which
keeps every committed token an exact sample of p. Consequence: a seeded request's text depends only on
its seed and parameters, not on which requests share its batch nor on the draft lengths the adaptive
rule picks. Greedy requests take the (bad-word masked) argmax.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specpipe.generation.api import RequestStats, SamplingParams, StepOutput
from specpipe.generation.stopping import StopConditions
from specpipe.runtime.cpu.drafters.proposer import Proposer
from specpipe.runtime.cpu.scheduler.adaptive import NodeAcceptance
from specpipe.runtime.cpu.verify.sampling import TokenSampler

_MASK64 = (1 << 64) - 1


def position_uniform(seed: int, position: int) -> float:
    """A uniform in [0, 1) determined by ``(seed, position)`` (splitmix64 finaliser, 53 bits)."""
    z = (seed * 0x9E3779B97F4A7C15 + (position + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return (z >> 11) / float(1 << 53)


class PositionKeyedChooser:
    """A request's token choice keyed by output position (module doc).

    Args:
        params: validated sampling settings; seed: the request's seed (drawn at random when it gave none).
    """

    def __init__(
        self, params: SamplingParams, seed: int, history: list[int] | None = None, end_ids: frozenset[int] | None = None
    ):
        generator = torch.Generator()
        generator.manual_seed(seed)
        self.sampler = TokenSampler(params, generator, history=history, end_ids=end_ids)
        self.greedy = self.sampler.greedy
        self.argmax_only = self.sampler.argmax_only
        self.seed = seed

    def choose(self, logits: torch.Tensor, first_position: int, drafts: list[int] = ()) -> torch.Tensor:
        """int64 ``[n]``: the token chosen after each row of ``logits`` ``[n, vocab]``; row r is output
        index ``first_position + r`` and follows the committed history plus ``drafts[:r]`` (for a tree,
        pass per-row positions and paths to :meth:`choose_at`)."""
        rows = logits.shape[0]
        return self.choose_at(
            logits, list(range(first_position, first_position + rows)), [list(drafts[:r]) for r in range(rows)]
        )

    def choose_at(
        self, logits: torch.Tensor, positions: list[int], paths: list[list[int]] | None = None
    ) -> torch.Tensor:
        """As :meth:`choose`, row r at output index ``positions[r]`` after the history plus ``paths[r]``
        (the tokens between the committed history and that row; they count for the penalties and
        ``min_tokens``, TensorRT-LLM's per-position semantics)."""
        if self.greedy:
            return self.sampler.greedy_logits(logits, paths).argmax(dim=-1)
        probs = self.sampler.distributions(logits, paths)
        cdf = probs.cumsum(dim=-1)
        uniforms = torch.tensor([position_uniform(self.seed, p) for p in positions], dtype=cdf.dtype)
        picked = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None]).squeeze(-1)
        picked = picked.clamp_max(probs.shape[-1] - 1)
        # never pick a zero-probability token at the edge of a rounding gap
        bad = probs.gather(-1, picked[:, None]).squeeze(-1) <= 0
        if bool(bad.any()):
            picked[bad] = probs[bad].argmax(dim=-1)
        return picked


class DraftSampler:
    """What a drafter's ``propose`` sees as the request's sampler: greedy flag, processing, and a
    ``choose`` that uses the uniform of the next output position (common random numbers)."""

    def __init__(self, chooser: PositionKeyedChooser, first_position: int):
        self._chooser, self._position = chooser, first_position
        self.greedy = chooser.greedy
        self.banned = chooser.sampler.banned
        self.generator = chooser.sampler.generator
        self.distributions = chooser.sampler.distributions

    def choose(self, logits: torch.Tensor):
        token = int(self._chooser.choose_at(logits, [self._position])[0])
        self._position += 1
        return token, None


@dataclass
class BatchRequest:
    """A request in the scheduler.

    Attributes:
        prompt: prompt token ids; context: prompt + committed output.
        emit: called with each :class:`StepOutput` (on the scheduler thread); fail: called once with the
            exception that ended the request early (bad state, drafter failure, shutdown).
        slot: KV cache slot while active; prefilled: prompt tokens in the cache so far.
        drafter: its own fork of the deployment's drafter (set when it gets a slot).
        prefill_features: drafters that read features: hidden chunks of the prompt, handed over after the last chunk.
        acceptance: the request's per-node acceptance (the scheduler links it to the deployment's).
        draft_length: draft tokens chosen for the latest step (a tree's nodes; 0 = plain decoding).
        draft_seconds_per_depth: EWMA of the drafter's seconds per draft depth.
        draft_streak: consecutive steps up to the latest in which the request drafted.
        drafting_steps: steps in which the request drafted, in all.
        node_depths: the depth of each node of the latest proposal (what a dynamic tree's next plan starts from).
    """

    request_id: int
    prompt: list[int]
    params: SamplingParams
    chooser: PositionKeyedChooser
    stop: StopConditions
    stats: RequestStats
    drafter: Proposer | None
    emit: Callable[[StepOutput], None]
    fail: Callable[[BaseException], None]
    context: list[int] = field(default_factory=list)
    slot: int | None = None
    prefilled: int = 0
    prefill_features: list[torch.Tensor] = field(default_factory=list)
    acceptance: NodeAcceptance = field(default_factory=NodeAcceptance)
    draft_length: int = 0
    draft_seconds_per_depth: float = 0.0
    draft_streak: int = 0
    drafting_steps: int = 0
    node_depths: list[int] | None = None
    cancelled: bool = False
    done: bool = False

    @property
    def output_index(self) -> int:
        """Index (in the output) of the next token to commit."""
        return len(self.context) - len(self.prompt)

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.prompt)

    @property
    def fresh(self) -> bool:
        """Whether the request has not drafted yet (its drafter must catch up on its whole context)."""
        return self.draft_seconds_per_depth == 0

    @property
    def paused(self) -> bool:
        """Whether the request drafted before, but not in its latest step (its drafter must catch up)."""
        return self.draft_length == 0 and self.draft_seconds_per_depth > 0

    def cancel(self) -> None:
        """Ask the scheduler to drop this request at its next step (thread-safe: a flag)."""
        self.cancelled = True


def new_seed() -> int:
    """A random 63-bit seed for a request that gave none."""
    return random.SystemRandom().getrandbits(63)
