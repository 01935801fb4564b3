"""Request types shared by every generation loop (torch-free): what a request asks for
(:class:`~specpipe.generation.api.SamplingParams`), what each step returns
(:class:`~specpipe.generation.api.StepOutput`, :class:`~specpipe.generation.api.RequestStats`), and when
it stops (:class:`~specpipe.generation.stopping.StopConditions`).

The CPU runtime (:mod:`specpipe.runtime.cpu`) and the GPU draft-target Triton model
(:mod:`specpipe.triton.models.draft_loop`) both use them, so they belong to neither.
"""
