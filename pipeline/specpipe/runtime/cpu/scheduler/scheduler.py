"""In-flight batching for the CPU runtime: one scheduler loop owns the target model.

Iteration-level scheduling (Orca, Yu et al. 2022, OSDI) with continuous batching (vLLM, Kwon et al.
2023, SOSP): requests join and leave the running batch at every step. The loop is blind to the method
(as vLLM v1's scheduler): every drafter is a :class:`~specpipe.runtime.cpu.drafters.proposer.Proposer` whose
proposal is a token tree (a chain: one child each), and one accept rule decides every block
(:mod:`~specpipe.runtime.cpu.verify.accept`). Each :meth:`BatchScheduler.step`, after admitting waiting
requests while cache slots are free (at most ``max_batch_size`` active; beyond that they wait in a queue of
``max_queue``; past it :meth:`~BatchScheduler.submit` raises :class:`ServerBusy` at once) and dropping
cancelled ones:

1. **plan**: gives prefilling requests the next whole ``prefill_chunk`` of their own prompt (at most
   ``prefill_chunk`` prompt tokens per step over all of them, so a long prompt does not stall the batch) and
   asks the :class:`~specpipe.runtime.cpu.scheduler.policy.DraftPolicy` for each decoding request's draft
   length (the load-adaptive rule; 0 = plain decoding);
2. **draft**: each decoding request's drafter proposes its tree, laid out for verification (a chain causal,
   a branching tree with its tree mask and positions);
3. **forward**: **one** target forward over all of it (:class:`~specpipe.runtime.cpu.model.batched_lm.BatchedLM`)
   and one ``lm_head`` over every row that needs logits;
4. **accept**: per request, the accept rule picks its tokens, its cache keeps the accepted path's entries
   (a chain's prefix stays in place), its drafter gets the committed context (and the target's features,
   where it reads them), its stop conditions apply (counting: :class:`~specpipe.generation.api.RequestStats`)
   and it emits its own :class:`~specpipe.generation.api.StepOutput`; finished requests leave and free their slot;
5. **observe**: the policy learns the forward's cost and each request's acceptance.

A failure while drafting or choosing for one request ends only that request (``fail`` callback); a
failure of the shared forward ends that step's requests. A request's greedy output does not depend on
its batch (``tests/runtime/cpu/test_batched_scheduler.py``), nor, bitwise, a sampled one's logits.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from specpipe.errors import SpecpipeError
from specpipe.generation.api import RequestStats, SamplingParams, StepOutput
from specpipe.generation.stopping import StopConditions
from specpipe.runtime.cpu.deployment import Deployment
from specpipe.runtime.cpu.model.batched_lm import BatchedLM, BatchEntry
from specpipe.runtime.cpu.model.weights_memory import trim_heap
from specpipe.runtime.cpu.scheduler.batch_request import BatchRequest, DraftSampler, PositionKeyedChooser, new_seed
from specpipe.runtime.cpu.scheduler.forward_cost import ForwardCostModel
from specpipe.runtime.cpu.scheduler.policy import DraftPolicy
from specpipe.runtime.cpu.validation import validate_request
from specpipe.runtime.cpu.verify.accept import accept_block
from specpipe.runtime.cpu.verify.tree_accept import DraftTree, tree_attention


class ServerBusy(SpecpipeError):
    """Every batch slot and the waiting queue are full: retry later."""


class Cancelled(Exception):
    """The request was cancelled before it finished."""


@dataclass
class _Work:
    """One request's part of a step: its forward entry and its draft tree (``None``: a prompt chunk); after
    the forward its rows of hidden states, its range of logit rows and its logits; after acceptance the
    accepted nodes."""

    request: BatchRequest
    entry: BatchEntry
    tree: DraftTree | None = None
    hidden: torch.Tensor | None = None
    rows: tuple[int, int] = (0, 0)
    logits: torch.Tensor | None = None
    path: list[int] | None = None


@dataclass(frozen=True)
class _Forward:
    """A step's target forward: its tokens and seconds, and what the cost model needs to learn from it."""

    tokens: int
    seconds: float
    mixed: bool
    drafting: bool
    timed: bool


class BatchScheduler:
    """Serves many requests together on a deployment's target and drafter (module doc); one request alone
    too (:mod:`~specpipe.runtime.cpu.scheduler.one_request`).

    Args:
        deployment: a loaded :class:`~specpipe.runtime.cpu.deployment.Deployment`; the scheduler uses its
            model, drafter (one fork per request), chain or tree, acceptance rule, ``max_draft_len``,
            ``max_context``, end ids.
        max_batch_size: requests decoded together (cache slots).
        max_queue: requests waiting for a slot before :class:`ServerBusy`.
        prefill_chunk: most prompt tokens per step.
        cost_model: forward cost against tokens; ``None``: measured now (call on the serving thread).
        adaptive: choose draft lengths by the rule; ``False``: always draft ``max_draft_len``.
        exact_greedy: greedy requests are exact too (as sampled ones: :attr:`BatchEntry.exact` rows, a tree's
            first-children chain verified), so their text does not depend on the batch or the drafts;
            ``None``: where the target is weight-only quantized, whose bf16 inputs turn batched attention's
            last-bit differences into flipped near-ties.
    """

    def __init__(
        self,
        deployment: Deployment,
        *,
        max_batch_size: int = 8,
        max_queue: int = 32,
        prefill_chunk: int = 128,
        cost_model: ForwardCostModel | None = None,
        adaptive: bool = True,
        exact_greedy: bool | None = None,
    ):
        self.deployment, self.acceptance_rule = deployment, deployment.acceptance
        self.lm = BatchedLM(deployment.target.model, max_batch_size, capture_layers=deployment.target.capture_layers)
        self.exact_greedy = self.lm.quantized if exact_greedy is None else exact_greedy
        self.max_batch_size, self.max_queue, self.prefill_chunk = max_batch_size, max_queue, max(1, prefill_chunk)
        self.max_context = deployment.max_context
        self.policy = DraftPolicy(
            cost_model if cost_model is not None else ForwardCostModel.measure(self.lm),
            deployment.max_draft_len,
            deployment.max_context,
            adaptive,
        )
        self.active: list[BatchRequest] = []
        self._waiting: deque[BatchRequest] = deque()
        self._lock = threading.Lock()
        self._next_id = self.steps = 0
        self.last_draft_lengths: list[int] = []
        trim_heap()  # what measuring the cost curve allocated and freed

    # --- requests --------------------------------------------------------------------------------

    def submit(
        self,
        input_ids: list[int],
        params: SamplingParams,
        emit: Callable[[StepOutput], None],
        fail: Callable[[BaseException], None] = lambda exc: None,
    ) -> BatchRequest:
        """Queue a request (thread-safe); its outputs go to ``emit`` on the scheduler thread.

        Raises:
            ValueError: an invalid request (:func:`~specpipe.runtime.cpu.validation.validate_request`: empty
                prompt, prompt not shorter than ``max_context``, ids outside the vocabulary, bad sampling
                settings), before queueing.
            ServerBusy: ``max_batch_size`` requests are active and ``max_queue`` wait already.
        """
        input_ids = list(input_ids)
        validate_request(input_ids, params, vocab_size=self.lm.vocab_size, max_context=self.max_context)
        end_ids = params.end_ids(self.deployment.default_end_ids)
        with self._lock:
            if len(self.active) + len(self._waiting) >= self.max_batch_size + self.max_queue:
                raise ServerBusy(
                    f"server busy: it holds {len(self.active) + len(self._waiting)} requests already, the "
                    f"most it takes ({self.max_batch_size} decoding together + max_queue {self.max_queue} "
                    f"waiting); retry later"
                )
            context = list(input_ids)  # extended in place as tokens commit: the penalties' history
            request = BatchRequest(
                request_id=self._next_id,
                prompt=input_ids,
                params=params,
                chooser=PositionKeyedChooser(
                    params, params.seed if params.seed is not None else new_seed(), history=context, end_ids=end_ids
                ),
                stop=StopConditions(end_ids, params.stop_words, params.max_tokens),
                stats=RequestStats(num_input_tokens=len(input_ids)),
                drafter=None,
                emit=emit,
                fail=fail,
                context=context,
            )
            self._next_id += 1
            self._waiting.append(request)
        return request

    @property
    def waiting(self) -> int:
        """Requests queued for a slot."""
        return len(self._waiting)

    @property
    def has_work(self) -> bool:
        return bool(self.active or self._waiting)

    def run_until_idle(self) -> None:
        """Step until no request is active or waiting (on the calling thread)."""
        while self.has_work:
            self.step()

    # --- one step ------------------------------------------------------------------------------

    def _admit(self) -> None:
        """Drop cancelled requests, give waiting ones the free slots, each its own fork of the drafter."""
        with self._lock:
            for request in [r for r in self._waiting if r.cancelled]:
                self._waiting.remove(request)
                self._finish(request, error=Cancelled("cancelled while waiting"))
            while self._waiting and self.lm.free_slots:
                request = self._waiting.popleft()
                request.slot = self.lm.allocate()
                request.drafter = self.deployment.drafter.fork()
                self.policy.admit(request)
                request.drafter.reset(list(request.prompt))
                self.active.append(request)
        for request in [r for r in self.active if r.cancelled]:
            self._finish(request, error=Cancelled("cancelled"))

    def _finish(self, request: BatchRequest, error: BaseException | None = None) -> None:
        if request in self.active:
            self.active.remove(request)
        self.policy.request_ended(request)
        if request.slot is not None:
            self.lm.release(request.slot)
            request.slot = None
        request.done = True
        if error is not None:
            try:
                request.fail(error)
            except Exception:  # noqa: BLE001 - a consumer that has gone away must not stop the loop
                pass

    @torch.inference_mode()
    def step(self) -> None:
        """One scheduler iteration (module doc): plan -> draft -> forward -> accept -> observe."""
        self._admit()
        if not self.active:
            return
        decoding, chunks, lengths = self._plan()
        work = [w for w in map(self._draft, decoding, lengths) if w is not None]
        work += [self._prompt_chunk(request, size) for request, size in chunks]
        forward = self._forward(work) if work else None
        if forward is None:
            return
        self.steps += 1
        self.last_draft_lengths = [r.draft_length for r in decoding]
        for item in work:
            try:
                self._accept(item)
            except Exception as exc:  # noqa: BLE001 - isolate one request's failure
                self._finish(item.request, error=exc)
        self._observe(work, forward)

    def _plan(self) -> tuple[list[BatchRequest], list[tuple[BatchRequest, int]], list[tuple[int, int]]]:
        """The decoding requests, the prompt chunks ``(request, tokens)`` this step prefills, and each decoding
        request's ``(draft tokens, draft depth)`` from the policy."""
        decoding = [r for r in self.active if not r.prefilling]
        budget, chunks = self.prefill_chunk, []
        for request in (r for r in self.active if r.prefilling):  # whole chunks of its own prompt, batch-blind
            size = min(self.prefill_chunk, len(request.prompt) - request.prefilled)
            if chunks and size > budget:
                break
            chunks.append((request, size))
            budget -= size
        prefill_outputs = sum(1 for r, n in chunks if r.prefilled + n == len(r.prompt))
        return decoding, chunks, self.policy.plan(decoding, sum(n for _, n in chunks), prefill_outputs)

    def _draft(self, request: BatchRequest, length: tuple[int, int]) -> _Work | None:
        """Propose the request's first ``nodes`` draft tokens, ``depth`` deep (``length``; 0 nodes: plain
        decoding) and lay out its verification; ``None`` where its drafter failed (the request ends)."""
        nodes, depth = length
        try:
            start = self.policy.start_draft(request, nodes)
            exact = self.exact_greedy or not request.chooser.greedy  # seeded draws read a sampled request's rows
            if start is None:  # plain decoding: the newest token alone
                plain = DraftTree([], [])
                return _Work(request, self._verification(request, plain, exact), plain)
            began = time.perf_counter()
            request.drafter.catch_up(request.context)
            caught_up = time.perf_counter()
            sampler = DraftSampler(request.chooser, request.output_index)
            tree = request.drafter.propose(request.context, nodes, depth, sampler).prune(depth, nodes)
            if exact:  # an exact text must not depend on the tree verified
                tree = tree.first_children()
            request.node_depths = tree.depths()
            entry = self._verification(request, tree, exact)
            self.policy.drafted(request, start, caught_up - began, time.perf_counter() - caught_up, depth)
            return _Work(request, entry, tree)
        except Exception as exc:  # noqa: BLE001 - one request's drafter failing must not stop the batch
            self._finish(request, error=exc)
            return None

    def _verification(self, request: BatchRequest, tree: DraftTree, exact: bool) -> BatchEntry:
        """The forward entry verifying ``tree`` below the request's newest token: a chain (plain decoding too)
        as a causal entry, a branching tree with its tree mask and positions."""
        tokens = [request.context[-1], *tree.tokens]
        if tree.is_chain():
            return BatchEntry(request.slot, tokens, exact=exact)
        cached = len(request.context) - 1
        mask, positions = tree_attention(tree.parents, cached)
        return BatchEntry(request.slot, tokens, positions=cached + positions, mask=mask[0, 0], exact=exact)

    def _prompt_chunk(self, request: BatchRequest, size: int) -> _Work:
        """The next ``size`` tokens of the request's prompt."""
        chunk = request.prompt[request.prefilled : request.prefilled + size]
        return _Work(request, BatchEntry(request.slot, chunk, exact=self.exact_greedy or not request.chooser.greedy))

    def _forward(self, work: list[_Work]) -> _Forward | None:
        """One target forward over every entry, and one lm_head over the rows that need logits (a decoding
        request's every row, a prompt's last); hands each item its hidden states and logits. ``None`` where
        it failed (this step's requests end)."""
        started = time.perf_counter()
        try:
            hidden = self.lm.hidden([item.entry for item in work])
            rows, offset, argmax_only = [], 0, []
            for item in work:
                n = len(item.entry.token_ids)
                if item.tree is not None:
                    wanted = list(range(offset, offset + n))
                else:
                    wanted = [offset + n - 1] if item.request.prefilled + n == len(item.request.prompt) else []
                item.hidden, item.rows = hidden[offset : offset + n], (len(rows), len(rows) + len(wanted))
                rows += wanted
                argmax_only += [item.request.chooser.argmax_only] * len(wanted)
                offset += n
            logits = self.lm.project(hidden[rows], argmax_only) if rows else None
        except Exception as exc:  # noqa: BLE001 - the shared forward failed: end this step's requests
            for item in work:
                self._finish(item.request, error=exc)
            return None
        seconds = time.perf_counter() - started
        for item in work:
            first, last = item.rows
            item.logits = logits[first:last] if last > first else None
        drafting = any(len(item.tree) for item in work if item.tree is not None)
        mixed = len({min(len(item.entry.token_ids), 2) for item in work}) == 2
        return _Forward(offset, seconds, mixed=mixed, drafting=drafting, timed=len(rows) == offset)

    def _accept(self, item: _Work) -> None:
        """Commit what the forward gives the request: a prompt chunk's cache (its last, the first token), or
        the accepted drafts and the target's token after them; keep their cache entries, feed the drafter."""
        request, tree, drafter = item.request, item.tree, item.request.drafter
        if tree is None:
            self._accept_prompt_chunk(item)
            return
        cached = len(request.context) - 1
        path, token = accept_block(tree, item.logits, request.chooser, request.output_index, self.acceptance_rule)
        committed = [*(tree.tokens[i] for i in path), token]
        request.context.extend(committed)
        self.lm.keep_paths([(request.slot, cached, path)])  # a chain's accepted prefix moves nothing
        drafter.commit(request.context, item.hidden[[0, *(i + 1 for i in path)]] if drafter.reads_features else None)
        item.path = path
        self._release_tokens(request, committed, len(tree), len(path))

    def _accept_prompt_chunk(self, item: _Work) -> None:
        request, drafter = item.request, item.request.drafter
        request.prefilled += len(item.entry.token_ids)
        if drafter.reads_features:
            request.prefill_features.append(item.hidden)
        if item.logits is None:
            return
        token = int(request.chooser.choose(item.logits, request.output_index)[0])
        request.context.append(token)
        drafter.commit(request.context, torch.cat(request.prefill_features) if drafter.reads_features else None)
        request.prefill_features = []
        self._release_tokens(request, [token])

    def _observe(self, work: list[_Work], forward: _Forward) -> None:
        """What the step teaches the policy: the forward's cost, each request's accepted drafts."""
        self.policy.observe_forward(
            forward.tokens, forward.seconds, mixed=forward.mixed, drafting=forward.drafting, timed=forward.timed
        )
        for item in work:
            if item.path is not None:
                self.policy.observe_accept(item.request, len(item.tree), item.path)

    def _release_tokens(
        self, request: BatchRequest, committed: list[int], proposed: int = 0, accepted: int = 0
    ) -> None:
        before = request.stop.committed
        tokens, reason = request.stop.push(committed)
        through_stop = request.stop.committed - before  # committed, or up to the token that ended the request
        stats = request.stats
        stats.target_forwards += 1
        stats.total_draft_tokens += proposed
        stats.total_accepted_draft_tokens += min(accepted, through_stop - 1)  # a stopping draft is the step's own token
        stats.num_generated_tokens = request.stop.committed
        if reason is None and len(request.context) >= self.max_context:
            tokens += request.stop.finish()
            reason = "length"
        request.stats.num_output_tokens = request.stop.returned
        request.stats.draft_length = request.draft_length
        if reason is not None:
            self._finish(request)
        request.emit(StepOutput(tokens, reason is not None, reason, replace(request.stats)))
