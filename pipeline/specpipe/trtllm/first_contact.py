"""First-contact check: run inside the TensorRT-LLM container (or where ``tensorrt_llm`` imports) before
anything is downloaded, and check every generated artifact against the live TensorRT-LLM.

Standalone on purpose: the pinned container does not have specpipe installed, so this file is copied
next to its input and run as ``python3 first_contact.py --input CHECKS.json [--report FILE]``; it
imports only the standard library, ``tensorrt_llm`` and (for ``model.yaml``) PyYAML.

What it checks (the input is written by :func:`specpipe.trtllm.doctor.check_input`):

1. ``tensorrt_llm.__version__`` equals the pin (engines load only in the release that built them).
2. Every planned argv parses with the real tool's own argparse parser, without running the tool:
   ``trtllm-build`` with ``tensorrt_llm.commands.build.parse_arguments`` (TensorRT-LLM
   ``tensorrt_llm/commands/build.py`` @ 65f1d15); example scripts that define ``parse_arguments()``
   (``examples/eagle/convert_checkpoint.py`` @ 04a2cac, the llama and medusa converters) are imported
   under another module name, so their ``__main__`` block does not run, and that function is called;
   scripts that build their parser inside ``if __name__ == "__main__"`` (``examples/quantization/quantize.py``
   @ 059c97c) run under :mod:`runpy` with ``ArgumentParser.parse_args`` stopping right after parsing.
3. ``model.yaml`` (LLM API flow): every key except ``triton_config`` is merged with
   ``tensorrt_llm.llmapi.llm_args.update_llm_args_with_extra_dict`` and validated by ``TorchLlmArgs``
   (what the container's Triton model does before ``LLM(**args)``: TensorRT-LLM
   ``triton_backend/all_models/llmapi/tensorrt_llm/1/model.py``), so a wrong ``decoding_type`` or key fails here.
4. Each Triton backend the repository names exists under the backends root
   (``/opt/tritonserver/backends/<name>``).

Output: one line per artifact, ``[checked] ...`` or ``[FAILED] ...: why``; exit status 0 when all
are checked, 1 otherwise, 2 for unusable input.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import json
import os
import runpy
import sys

BACKENDS_ROOT = "/opt/tritonserver/backends"


class _Parsed(Exception):
    """Raised by the patched ``ArgumentParser.parse_args`` once the arguments parsed."""


@contextlib.contextmanager
def _argv(argv):
    saved = sys.argv
    sys.argv = list(argv)
    try:
        yield
    finally:
        sys.argv = saved


@contextlib.contextmanager
def _stop_after_parse():
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        original(self, args, namespace)
        raise _Parsed()

    argparse.ArgumentParser.parse_args = parse_args
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original


def _parse_with(call, argv):
    """Run ``call`` (which parses ``sys.argv``) with ``argv``; returns ``None`` or the parser's complaint."""
    err = io.StringIO()
    try:
        with _argv(argv), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            call()
    except _Parsed:
        return None
    except SystemExit as exc:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        return lines[-1] if lines else f"the parser exited with status {exc.code}"
    except Exception as exc:  # a script that fails while importing or parsing
        return f"{type(exc).__name__}: {exc}"
    return None


def check_argv(argv):
    """``None`` when ``argv`` parses with its tool's own parser, else why not."""
    if argv[0] == "trtllm-build":
        module = importlib.import_module("tensorrt_llm.commands.build")
        return _parse_with(module.parse_arguments, ["trtllm-build", *argv[1:]])
    if argv[0].startswith("python") and len(argv) > 1 and argv[1].endswith(".py"):
        script = argv[1]
        if not os.path.isfile(script):
            return f"script {script} does not exist in this TensorRT-LLM"
        spec = importlib.util.spec_from_file_location("specpipe_first_contact_script", script)
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, os.path.dirname(script))
        try:
            spec.loader.exec_module(module)  # module level only: __name__ is not "__main__"
            if callable(getattr(module, "parse_arguments", None)):
                return _parse_with(module.parse_arguments, [script, *argv[2:]])
            with _stop_after_parse():
                return _parse_with(lambda: runpy.run_path(script, run_name="__main__"), [script, *argv[2:]])
        except Exception as exc:
            return f"{type(exc).__name__} while loading {script}: {exc}"
        finally:
            sys.path.remove(os.path.dirname(script))
    return f"no parser known for program {argv[0]!r}"


def check_model_yaml(text):
    """``None`` when the LLM-API arguments validate with TensorRT-LLM's own classes, else why not."""
    import yaml

    config = yaml.safe_load(text) or {}
    config.pop("triton_config", None)
    llm_args = importlib.import_module("tensorrt_llm.llmapi.llm_args")
    try:
        merged = llm_args.update_llm_args_with_extra_dict({}, config)
        llm_args.TorchLlmArgs(**merged)
    except Exception as exc:
        first = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {first[0] if first else ''}"[:500]
    return None


def run(checks, out):
    """Run every check of ``checks`` (the input document), printing to ``out``; returns the exit status."""
    results = []
    try:
        import tensorrt_llm

        version = str(tensorrt_llm.__version__)
    except Exception as exc:
        out.write(f"[FAILED] tensorrt_llm import: {type(exc).__name__}: {exc}: run the check in "
                  f"{checks.get('image', 'the pinned container')}\n")
        return 1
    pin = checks["pin"]
    results.append((f"tensorrt_llm {version}", None if version == pin else
                    f"this TensorRT-LLM is {version}, the plan is pinned to {pin}: use {checks.get('image', 'the pinned container')}"))
    for item in checks.get("argvs", []):
        results.append((f"{item['step']}: {' '.join(item['argv'][:2])}", check_argv(item["argv"])))
    if checks.get("model_yaml") is not None:
        results.append(("model.yaml (LLM API arguments)", check_model_yaml(checks["model_yaml"])))
    root = checks.get("backends_root", BACKENDS_ROOT)
    for name in checks.get("backends", []):
        path = os.path.join(root, name)
        results.append((f"Triton backend {name}", None if os.path.isdir(path) else f"{path} does not exist in this image"))
    for what, problem in results:
        out.write(f"[checked] {what}\n" if problem is None else f"[FAILED] {what}: {problem}\n")
    failed = sum(1 for _, p in results if p is not None)
    out.write(f"first contact: {len(results) - failed} checked, {failed} failed\n")
    return 1 if failed else 0


def main(argv=None):
    parser = argparse.ArgumentParser(description="specpipe first-contact check of a TensorRT-LLM plan")
    parser.add_argument("--input", required=True, help="checks document (JSON) written by specpipe")
    parser.add_argument("--report", default=None, help="also write the report to this file")
    args = parser.parse_args(argv)
    try:
        with open(args.input) as f:
            checks = json.load(f)
    except (OSError, ValueError) as exc:
        print(f"error: cannot read {args.input} ({exc}): rerun 'specpipe build' to write it", file=sys.stderr)
        return 2
    buffer = io.StringIO()
    status = run(checks, buffer)
    sys.stdout.write(buffer.getvalue())
    if args.report:
        os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
        with open(args.report, "w") as f:
            f.write(buffer.getvalue())
    return status


if __name__ == "__main__":
    sys.exit(main())
