"""The vendored vLLM flag table (``specpipe/vllm/flags.json``), its reader of wheels, and the checks
every generated ``vllm serve`` argv and ``--speculative-config`` passes."""

import json
import os
import zipfile
from pathlib import Path

import pytest

from specpipe.vllm import release
from specpipe.vllm.flagcheck import (
    FLAGS_FILE,
    InvalidVllmCommandError,
    check_speculative_config,
    load_table,
    parse_serve_argv,
)
from specpipe.vllm.vendor import ARG_UTILS, FRONTEND, QUANTIZATION, SPECULATIVE, VendorError, read_wheel

OLD_FLAGS = [
    "--speculative-model",
    "--num-speculative-tokens",
    "--draft-model-tp-size",
    "--target-model-tp-size",
    "--use-v2-block-manager",
    "--speculative-draft-tensor-parallel-size",
    "--ngram-prompt-lookup-max",
    "--ngram-prompt-lookup-min",
    "--spec-decoding-acceptance-method",
]
BASE = ["vllm", "serve", "meta-llama/Meta-Llama-3-8B-Instruct"]


def test_the_table_is_the_pinned_release_s_with_the_flags_specpipe_emits():
    table = load_table()
    assert table["version"] == release.VLLM_VERSION and table["wheel"] == release.WHEEL
    assert release.IMAGE == f"vllm/vllm-openai:v{release.VLLM_VERSION}"
    for flag in (
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--quantization",
        "--max-model-len",
        "--max-num-seqs",
        "--speculative-config",
        "--dtype",
        "--served-model-name",
        "--revision",
        "--host",
        "--port",
    ):
        assert table["flags"][flag]["kind"] == "value", flag
    assert table["flags"]["--enforce-eager"]["kind"] == "bool"
    assert {"fp8", "awq", "int8_per_channel_weight_only"} <= set(table["quantization_methods"])


@pytest.mark.parametrize("flag", OLD_FLAGS)
def test_the_old_flags_of_published_guides_are_refused(flag):
    assert flag not in load_table()["flags"]
    with pytest.raises(InvalidVllmCommandError, match="unknown flag"):
        parse_serve_argv(BASE + [flag, "1"])


def test_parse_reads_values_switches_and_the_speculative_config():
    parsed = parse_serve_argv(
        BASE
        + [
            "--tensor-parallel-size=2",
            "--enforce-eager",
            "--no-enable-prefix-caching",
            "--speculative-config",
            '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":3}',
        ]
    )
    assert parsed["model"] == BASE[2] and parsed["--tensor-parallel-size"] == 2
    assert parsed["--enforce-eager"] is True and parsed["--enable-prefix-caching"] is False
    assert parsed["--speculative-config"]["prompt_lookup_max"] == 3


@pytest.mark.parametrize(
    "argv, message",
    [
        (["vllm", "bench", "m"], "must start with"),
        (["vllm", "serve", "--port", "1"], "model"),
        (BASE + ["--tensor-parallel-size", "two"], "takes an int"),
        (BASE + ["--quantization", "int4-awq"], "is not one of"),
        (BASE + ["--dtype", "bf16"], "is not one of"),
        (BASE + ["--port", "1", "--port", "2"], "given twice"),
        (BASE + ["--max-model-len"], "needs a value"),
        (BASE + ["--speculative-config", "{method: ngram}"], "not JSON"),
    ],
)
def test_parse_refuses_what_vllm_serve_would(argv, message):
    with pytest.raises(InvalidVllmCommandError, match=message):
        parse_serve_argv(argv)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"method": "medusa", "num_speculative_tokens": 3, "model": "x/y"}, "not one of"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "ngram"}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 3, "tensor_parallel_size": 2}, "draft_tensor_parallel_size"),
        ({"method": "ngram", "num_speculative_tokens": 3, "speculative_model": "x"}, "unknown field"),
        ({"method": "ngram", "num_speculative_tokens": 3, "target_model_config": {}}, "set by vLLM"),
        ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2, "prompt_lookup_min": 3}, "exceeds"),
        ({"method": "eagle", "num_speculative_tokens": 3}, "needs 'model'"),
        ({"method": "draft_model", "num_speculative_tokens": 3, "model": "m", "quantization": "int4"}, "quantization"),
    ],
)
def test_speculative_configs_vllm_refuses_are_refused(config, message):
    with pytest.raises(InvalidVllmCommandError, match=message):
        check_speculative_config(config)


def _fake_wheel(tmp_path: Path, version: str = "9.9.9") -> Path:
    """A wheel holding small sources in the shape of vLLM's (nested Literal aliases, dataclass fields, add_argument)."""
    sources = {
        SPECULATIVE: (
            'from typing import Literal\nMTP = Literal["deepseek_mtp", "mtp"]\nEagle = Literal["eagle", MTP]\n'
            'SpeculativeMethod = Literal["ngram", Eagle]\n'
            "class SpeculativeConfig:\n    num_speculative_tokens: int = Field(default=None, gt=0)\n"
            "    model: str | None = None\n    custom_method: str | None = field(default=None, init=False)\n"
        ),
        ARG_UTILS: (
            "class EngineArgs:\n    max_model_len: int = 0\n    enforce_eager: bool = False\n"
            "    @staticmethod\n    def add_cli_args(parser):\n        g = parser.add_argument_group()\n"
            '        g.add_argument("--max-model-len", **kw)\n        g.add_argument("--enforce-eager", **kw)\n'
            '        g.add_argument("--speculative-config", "-sc", **kw)\n'
        ),
        FRONTEND: (
            "class BaseFrontendArgs:\n    api_key: str | None = None\nclass FrontendArgs(BaseFrontendArgs):\n"
            '    port: int = 8000\ndef make_arg_parser(parser):\n    parser.add_argument("--headless", action="store_true")\n'
        ),
        QUANTIZATION: 'from typing import Literal\nQuantizationMethods = Literal["awq", "fp8"]\n',
        "vllm/config/model.py": 'from typing import Literal\nModelDType = Literal["auto", "bfloat16"]\n',
    }
    wheel = tmp_path / f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in sources.items():
            archive.writestr(path, text)
    return wheel


def test_the_reader_takes_literals_fields_and_flags_from_the_sources(tmp_path):
    table = read_wheel(_fake_wheel(tmp_path))
    assert table["version"] == "9.9.9"
    assert table["speculative_methods"] == ["ngram", "eagle", "deepseek_mtp", "mtp"]
    assert table["speculative_fields"]["custom_method"]["init"] is False
    assert table["speculative_fields"]["model"] == {"annotation": "str | None", "default": "None", "init": True}
    assert set(table["flags"]) == {
        "--max-model-len",
        "--enforce-eager",
        "--speculative-config",
        "--api-key",
        "--port",
        "--headless",
    }
    assert table["flags"]["--enforce-eager"]["kind"] == "bool" and table["flags"]["--port"]["annotation"] == "int"
    assert table["quantization_methods"] == ["awq", "fp8"] and table["dtypes"] == ["auto", "bfloat16"]


def test_the_reader_names_what_a_wheel_lacks(tmp_path):
    wheel = _fake_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        kept = {n: archive.read(n) for n in archive.namelist() if n != SPECULATIVE}
    broken = tmp_path / "vllm-1.0-py3-none-any.whl"
    with zipfile.ZipFile(broken, "w") as archive:
        for name, data in kept.items():
            archive.writestr(name, data)
    with pytest.raises(VendorError, match="cannot read"):
        read_wheel(broken)
    with pytest.raises(VendorError, match="not a vLLM wheel"):
        read_wheel(tmp_path / "torch-2.0.whl")


def _pinned_wheel() -> Path | None:
    for folder in (os.environ.get("SPECPIPE_VLLM_WHEEL_DIR"), "/tmp/vllm", Path.home() / ".cache" / "specpipe"):
        if folder and (Path(folder) / release.WHEEL).is_file():
            return Path(folder) / release.WHEEL
    return None


@pytest.mark.skipif(
    _pinned_wheel() is None,
    reason=f"{release.WHEEL} not downloaded (pip download --no-deps "
    f"vllm=={release.VLLM_VERSION}; SPECPIPE_VLLM_WHEEL_DIR)",
)
def test_the_vendored_table_is_what_the_pinned_wheel_says():
    assert read_wheel(_pinned_wheel()) == json.loads(FLAGS_FILE.read_text())
