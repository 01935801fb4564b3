"""The Triton CPU model's worker in batch mode: requests run concurrently in the scheduler on the worker
thread (the one that loaded the engine), each streams its own responses, a client cancellation ends
only that request, and a request past the queue bound gets UNAVAILABLE ("server busy") at once."""

import pytest
from batch_helpers import make_engine, prompts, run_alone, scheduler_for
from recording_sender import RecordingSender as Sender

from specpipe.generation.api import SamplingParams
from specpipe.triton.models.engine_request import EngineRequest
from specpipe.triton.models.request_worker import RequestWorker

pytestmark = pytest.mark.usefixtures("single_thread")


def test_worker_batches_streams_cancels_and_answers_busy():
    engine = make_engine("ngram")
    ps = prompts(4, seed=3)
    params = SamplingParams(max_tokens=20)
    worker = RequestWorker(load=lambda: scheduler_for(engine, max_batch_size=2, max_queue=1))
    senders = [Sender(), Sender(cancel_after=2), Sender(), Sender()]
    for prompt, sender in zip(ps, senders):
        worker.submit(
            EngineRequest(prompt, params, streaming=True, exclude_input_in_output=True, return_perf_metrics=True),
            sender,
        )
    busy = Sender()
    # the queue is drained in one go: 2 running + 1 waiting fit, the 4th and this one are refused
    worker.submit(EngineRequest(ps[0], params), busy)
    worker.close()
    assert busy.errors and busy.errors[0][1] == "UNAVAILABLE" and "server busy" in busy.errors[0][0]
    assert senders[3].errors and senders[3].errors[0][1] == "UNAVAILABLE"
    for i in (0, 2):
        assert senders[i].tokens() == run_alone(engine, ps[i], params)
        assert senders[i].responses[-1][1] is True
        assert "total_draft_tokens" in senders[i].responses[-1][0]
        lengths = [int(outputs["draft_length"][0, 0]) for outputs, _ in senders[i].responses]
        assert all(0 <= k <= engine.max_draft_len for k in lengths) and any(k > 0 for k in lengths)
        assert senders[i].threads == {"specpipe-engine"}
    cancelled = senders[1]
    assert cancelled.finished.is_set() and 2 <= len(cancelled.responses) < 20
    assert all(not final for _, final in cancelled.responses)
