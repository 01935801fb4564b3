"""``specpipe bench`` and ``specpipe tune``: measured comparisons of deployments.

Modules, one job each:

- :mod:`~specpipe.bench.prompts`: the built-in prompt sets (``chat``, ``code``, ``summarize``) and JSONL files;
- :mod:`~specpipe.bench.endpoints`: ``--url NAME=HOST:PORT`` / ``NAME=openai://HOST:PORT/v1``;
- :mod:`~specpipe.bench.backends`, :mod:`~specpipe.bench.openai_backend`: Triton gRPC streaming and
  OpenAI-compatible streaming clients (what they share: :mod:`~specpipe.bench.backend_base`);
- :mod:`~specpipe.bench.synthetic`: prompts of an exact token length (``--input-len``);
- :mod:`~specpipe.bench.load`: closed-loop load at one concurrency, or open-loop Poisson arrivals at one
  request rate;
- :mod:`~specpipe.bench.records`, :mod:`~specpipe.bench.stats`: per-request records and their statistics
  (GenAI-Perf / AIPerf definitions);
- :mod:`~specpipe.bench.metrics`: memory and speculative-decoding counters from Prometheus metrics;
- :mod:`~specpipe.bench.runner`, :mod:`~specpipe.bench.job`: the whole run, and one run as a library call;
- :mod:`~specpipe.bench.report`: JSON, CSV, plot; :mod:`~specpipe.bench.table`: the terminal table;
  :mod:`~specpipe.bench.export`: the per-request profile export GenAI-Perf reads;
  :mod:`~specpipe.bench.machine`: the machine's facts in ``bench.json``;
- :mod:`~specpipe.bench.tune`: draft-length tuning (its record, read by the build, is :mod:`specpipe.tuned`).
"""
