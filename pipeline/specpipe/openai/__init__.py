"""An OpenAI-compatible HTTP gateway in front of a TensorRT-LLM-style Triton ensemble.

``specpipe serve NAME --openai-port PORT`` starts it beside Triton. It serves ``GET /v1/models``,
``POST /v1/completions`` and ``POST /v1/chat/completions`` (streamed as server-sent events when
``stream`` is true, ending with ``data: [DONE]``), translating each request into one gRPC streaming
request to the ensemble (:class:`~specpipe.client.llm.LLMClient`). Chat messages are formatted with
the chat template of the deployment's own tokenizer (the ``tokenizer_dir`` parameter of its
``preprocessing`` model). ``GET /metrics`` exports request, token and speculative-decoding counters
and the acceptance rate and mean accepted length in the Prometheus text format.

Modules: :mod:`.protocol` (request parsing, response shapes), :mod:`.chat_template`,
:mod:`.metrics`, :mod:`.server` (the request handlers), :mod:`.http_server` (the aiohttp application and
its runner), :mod:`.auth` (the API key).

Where it listens (constants here, so that the command line reads them without importing the server):
loopback by default (:data:`LOCAL_HOST`); inside a container every interface (:data:`CONTAINER_HOST`)
on :data:`CONTAINER_PORT`.
"""

#: ``specpipe serve --openai-port`` and ``specpipe gateway`` bind the loopback interface by default.
LOCAL_HOST = "127.0.0.1"
#: Inside a container the gateway binds every interface (the container's network is the boundary).
CONTAINER_HOST = "0.0.0.0"
#: The gateway's port in the compose service and the Kubernetes pod.
CONTAINER_PORT = 9000
