"""specpipe: Hugging Face checkpoints to a validated speculative-decoding deployment.

Two runtimes share one pipeline: TensorRT-LLM on GPUs (engine flow pinned to 1.2.x, and the
LLM-API flow) and a CPU reference runtime that implements the same speculative algorithms and the
same Triton tensor interface.
"""

__version__ = "0.1.0"
