"""Serving: in-flight batching for the CPU runtime. One scheduler loop owns the target model and runs
every active request's step in one batched forward (``scheduler``); each request keeps its own state,
drafter and token choice (``batch_request``); the load-adaptive rule chooses how many draft tokens each
request verifies per step (``adaptive``) from a forward cost model measured at load (``forward_cost``).
The top of the runtime: it drives the engines' request handling and imports every other part."""
