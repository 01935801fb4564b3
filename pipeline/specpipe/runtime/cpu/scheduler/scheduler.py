"""In-flight batching for the CPU runtime: one scheduler loop owns the target model.

Iteration-level scheduling (Orca, Yu et al. 2022, OSDI) with continuous batching (vLLM, Kwon et al.
2023, SOSP): requests join and leave the running batch at every step. Each :meth:`BatchScheduler.step`:

1. admits waiting requests while cache slots are free (at most ``max_batch_size`` active; beyond that
   they wait in a queue of ``max_queue``; past it :meth:`~BatchScheduler.submit` raises
   :class:`ServerBusy` at once) and drops cancelled requests (their slot is freed);
2. chooses each decoding request's draft length with the load-adaptive rule
   (:func:`~specpipe.runtime.cpu.scheduler.adaptive.choose_draft_lengths`; 0 = plain decoding) and drafts:
   a chain (``[last, d1..dk]``, causal) or a token tree (``[root, nodes]``, tree mask and positions);
3. gives prefilling requests the next whole ``prefill_chunk`` of their own prompt, at most ``prefill_chunk``
   prompt tokens per step over all of them, so a long prompt does not stall the batch;
4. runs **one** target forward over all of it (:class:`~specpipe.runtime.cpu.model.batched_lm.BatchedLM`)
   and one ``lm_head`` over every row that needs logits;
5. per request: chooses tokens (:mod:`~specpipe.runtime.cpu.scheduler.batch_request`), accepts its own drafts,
   rolls back its own rejected entries (chain: truncate; tree: compact the accepted path, one
   gather/scatter for the batch), applies its stop conditions (counting: :class:`~specpipe.generation.api.RequestStats`) and emits its own
   :class:`~specpipe.generation.api.StepOutput`; finished requests leave and free their slot.

A failure while drafting or choosing for one request ends only that request (``fail`` callback); a
failure of the shared forward ends that step's requests. A request's greedy output does not depend on
its batch (``tests/test_batched_scheduler.py``), nor, bitwise, a sampled one's logits.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

import torch

from specpipe.errors import SpecpipeError
from specpipe.generation.api import RequestStats, SamplingParams, StepOutput
from specpipe.generation.stopping import StopConditions
from specpipe.runtime.cpu.deployment import Deployment
from specpipe.runtime.cpu.model.batched_lm import BatchedLM, BatchEntry
from specpipe.runtime.cpu.model.weights_memory import trim_heap
from specpipe.runtime.cpu.scheduler.adaptive import (
    IDLE_FORGETTING,
    NodeAcceptance,
    ResumeCost,
    StartCost,
    ewma,
    shared_acceptance,
)
from specpipe.runtime.cpu.scheduler.batch_request import (
    BatchRequest,
    DraftSampler,
    PositionKeyedChooser,
    fork_drafter,
    new_seed,
)
from specpipe.runtime.cpu.scheduler.draft_planning import DraftPlanning
from specpipe.runtime.cpu.scheduler.forward_cost import ForwardCostModel
from specpipe.runtime.cpu.validation import validate_request
from specpipe.runtime.cpu.verify.accept import accept_block, chain_tree
from specpipe.runtime.cpu.verify.tree_accept import DraftTree, tree_attention


class ServerBusy(SpecpipeError):
    """Every batch slot and the waiting queue are full: retry later."""


class Cancelled(Exception):
    """The request was cancelled before it finished."""


class BatchScheduler(DraftPlanning):
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
        self.deployment, self.tree, self.acceptance_rule = deployment, deployment.tree, deployment.acceptance
        self.lm = BatchedLM(deployment.target.model, max_batch_size, capture_layers=deployment.target.capture_layers)
        self.exact_greedy = self.lm.quantized if exact_greedy is None else exact_greedy
        self.max_batch_size, self.max_queue, self.prefill_chunk = max_batch_size, max_queue, max(1, prefill_chunk)
        self.max_draft_len, self.max_context, self.adaptive = deployment.max_draft_len, deployment.max_context, adaptive
        self.cost_model = cost_model if cost_model is not None else ForwardCostModel.measure(self.lm)
        self.active: list[BatchRequest] = []
        self._waiting: deque[BatchRequest] = deque()
        self._lock = threading.Lock()
        self._next_id = self.steps = 0
        self.last_draft_lengths: list[int] = []
        self.shared_acceptance = shared_acceptance()
        self.draft_seconds_per_depth = 0.0  # the deployment's, for requests that have not drafted yet
        self.resume_cost, self.start_cost = ResumeCost(), StartCost()
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
        with self._lock:
            for request in [r for r in self._waiting if r.cancelled]:
                self._waiting.remove(request)
                self._finish(request, error=Cancelled("cancelled while waiting"))
            while self._waiting and self.lm.free_slots:
                request = self._waiting.popleft()
                request.slot = self.lm.allocate()
                request.drafter = fork_drafter(self.deployment.drafter)
                request.acceptance = NodeAcceptance(shared=self.shared_acceptance)
                request.drafter.reset(list(request.prompt))
                self.active.append(request)

    def _finish(self, request: BatchRequest, error: BaseException | None = None) -> None:
        if request in self.active:
            self.active.remove(request)
        if request.drafting_steps and not request.done:
            self.start_cost.request_ended(request.drafting_steps)
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
        """One scheduler iteration (module doc)."""
        self._admit()
        for request in [r for r in self.active if r.cancelled]:
            self._finish(request, error=Cancelled("cancelled"))
        if not self.active:
            return
        decoding = [r for r in self.active if not r.prefilling]
        prefilling = [r for r in self.active if r.prefilling]
        budget, chunks = self.prefill_chunk, []
        for request in prefilling:  # whole chunks of its own prompt: their bounds do not depend on the batch
            size = min(self.prefill_chunk, len(request.prompt) - request.prefilled)
            if chunks and size > budget:
                break
            chunks.append((request, size))
            budget -= size
        lengths = self._draft_lengths(
            decoding, sum(n for _, n in chunks), sum(1 for r, n in chunks if r.prefilled + n == len(r.prompt))
        )
        plans, entries = [], []
        for request, (nodes, depth) in zip(decoding, lengths):
            try:
                plan = self._draft(request, nodes, depth)
            except Exception as exc:  # noqa: BLE001 - one request's drafter failing must not stop the batch
                self._finish(request, error=exc)
                continue
            plans.append(plan)
            entries.append(plan[1])
        for request, size in chunks:
            prompt_chunk = request.prompt[request.prefilled : request.prefilled + size]
            entries.append(
                BatchEntry(request.slot, prompt_chunk, exact=self.exact_greedy or not request.chooser.greedy)
            )
            plans.append((request, entries[-1], None))
        if not entries:
            return
        started = time.perf_counter()
        try:
            hidden = self.lm.hidden(entries)
            rows, offset, wanted, argmax_only = [], 0, [], []
            for request, entry, _ in plans:
                n = len(entry.token_ids)
                if not request.prefilling:
                    wanted.append(list(range(offset, offset + n)))
                elif request.prefilled + n == len(request.prompt):
                    wanted.append([offset + n - 1])
                else:
                    wanted.append([])
                rows += wanted[-1]
                argmax_only += [request.chooser.argmax_only] * len(wanted[-1])
                offset += n
            logits = self.lm.project(hidden[rows], argmax_only) if rows else None
        except Exception as exc:  # noqa: BLE001 - the shared forward failed: end this step's requests
            for request, _, _ in plans:
                self._finish(request, error=exc)
            return
        drafting = any(len(entry.token_ids) > 1 for request, entry, _ in plans if not request.prefilling)
        if len(rows) == offset:  # every token had logits, as in the cost model's measurements
            sizes = {min(len(e.token_ids), 2) for e in entries}
            self.cost_model.observe(offset, time.perf_counter() - started, mixed=len(sizes) == 2, drafting=drafting)
        self.steps += 1
        self.last_draft_lengths = [r.draft_length for r in decoding]
        if not drafting:
            self.shared_acceptance.forget(1.0 - IDLE_FORGETTING)
        first_row, offset = 0, 0
        for (request, entry, draft), want in zip(plans, wanted):
            n = len(entry.token_ids)
            own_hidden = hidden[offset : offset + n]
            own_logits = logits[first_row : first_row + len(want)] if want else None
            offset += n
            first_row += len(want)
            try:
                self._complete(request, entry, draft, own_hidden, own_logits)
            except Exception as exc:  # noqa: BLE001 - isolate one request's failure
                self._finish(request, error=exc)

    def _draft(self, request: BatchRequest, nodes: int, depth: int):
        """Propose the request's first ``nodes`` draft tokens (``depth`` deep); returns ``(request, entry, draft)``."""
        paused, fresh, drafted_last_step, request.draft_length = (
            request.paused,
            request.fresh,
            request.draft_length > 0,
            nodes,
        )
        context, cached = request.context, len(request.context) - 1
        started = time.perf_counter()
        if nodes > 0:
            request.drafter.catch_up(context)
            if not drafted_last_step:  # the prompt or tokens committed while not drafting: timed apart
                caught_up = time.perf_counter()
                if paused:
                    self.resume_cost.resumed(caught_up - started)
                elif fresh:
                    self.start_cost.started(caught_up - started, len(context) - 1)
                started = caught_up
            request.draft_streak += 1
            request.drafting_steps += 1
        elif drafted_last_step:
            self.resume_cost.run_ended(request.draft_streak)
            request.draft_streak = 0
        exact = self.exact_greedy or not request.chooser.greedy  # seeded draws read a sampled request's rows
        if self.tree:
            tree = DraftTree([], [])
            if nodes > 0:
                tree = request.drafter.propose(context, nodes, depth).prune(depth, nodes)
                if exact:  # an exact text must not depend on the tree verified
                    tree = tree.first_children()
                request.node_depths = tree.depths()
            if len(tree):
                mask, positions = tree_attention(tree.parents, cached)
                entry = BatchEntry(
                    request.slot, [context[-1], *tree.tokens], positions=cached + positions, mask=mask[0, 0]
                )
            else:  # plain decoding: the root alone, a plain causal entry
                entry = BatchEntry(request.slot, [context[-1]])
            draft = tree
        else:
            drafts = []
            if nodes > 0:
                proposal = request.drafter.propose(context, nodes, DraftSampler(request.chooser, request.output_index))
                drafts = list(proposal.tokens[:nodes])
            entry = BatchEntry(request.slot, [context[-1], *drafts])
            draft = drafts
        if nodes > 0:
            seconds = (time.perf_counter() - started) / depth
            request.draft_seconds_per_depth = ewma(request.draft_seconds_per_depth, seconds, 0.2)
            self.draft_seconds_per_depth = ewma(self.draft_seconds_per_depth, seconds, 0.05)
        entry.exact = exact
        return request, entry, draft

    def _complete(
        self, request: BatchRequest, entry: BatchEntry, draft, hidden: torch.Tensor, logits: torch.Tensor | None
    ) -> None:
        if request.prefilling:
            request.prefilled += len(entry.token_ids)
            if self.tree:
                request.prefill_features.append(hidden)
            if logits is None:
                return
            token = int(request.chooser.choose(logits, request.output_index)[0])
            request.context.append(token)
            if self.tree:
                request.drafter.commit(request.context, torch.cat(request.prefill_features))
                request.prefill_features = []
            else:
                request.drafter.commit(request.context)
            self._release_tokens(request, [token])
            return
        cached = len(request.context) - 1
        tree = draft if self.tree else chain_tree(draft)
        path, token = accept_block(tree, logits, request.chooser, request.output_index, self.acceptance_rule)
        committed = [*(tree.tokens[i] for i in path), token]
        request.context.extend(committed)
        if self.tree:  # keep the accepted path's keys/values; the drafter reads their features
            self.lm.keep_paths([(request.slot, cached, path)])
            request.drafter.commit(request.context, hidden[[0, *(i + 1 for i in path)]])
        else:
            self.lm.truncate(request.slot, cached + 1 + len(path))
            request.drafter.commit(request.context)
        request.acceptance.observe(len(tree), path)
        if len(tree):
            self.shared_acceptance.observe(len(tree), path)
        self._release_tokens(request, committed, len(tree), len(path))

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
