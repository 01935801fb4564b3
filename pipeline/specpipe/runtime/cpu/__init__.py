"""The CPU reference runtime: speculative decoding in PyTorch with the TensorRT-LLM tensor interface."""
