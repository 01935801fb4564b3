"""First-contact check: run inside the TensorRT-LLM container (or where ``tensorrt_llm`` imports) before
anything is downloaded, and check every generated artifact against the live TensorRT-LLM.

Standalone on purpose: the pinned container does not have specpipe installed, so this file is copied
next to its input and run as ``python3 first_contact.py --input CHECKS.json [--report FILE]``; it
imports only the standard library, ``tensorrt_llm`` and (for ``model.yaml``) PyYAML.

What it checks (the input is written by :func:`specpipe.trtllm.doctor.check_input`):

1. ``tensorrt_llm.__version__`` equals the pin (engines load only in the release that built them).
2. Every planned argv parses with the real tool's own argparse parser, without running the tool.
   ``parse_arguments()`` comes in two shapes, both handled (:func:`_parse_with`); anything else is a
   failure, never a pass:

   * it returns the ``ArgumentParser`` unparsed, which is then parsed with the argv: ``trtllm-build``'s
     ``tensorrt_llm.commands.build.parse_arguments`` (TensorRT-LLM ``tensorrt_llm/commands/build.py``
     @ 65f1d15 ends with ``return parser``; its ``main()`` calls ``parser.parse_args()``);
   * it parses ``sys.argv`` and returns the Namespace: the example converters, imported under another
     module name so that their ``__main__`` block does not run (``examples/eagle/convert_checkpoint.py``
     @ 65b31db, ``examples/models/core/llama/convert_checkpoint.py`` @ fd96a08,
     ``examples/medusa/convert_checkpoint.py`` @ b93e14c: ``args = parser.parse_args(); return args``).

   Scripts that build their parser inside ``if __name__ == "__main__"`` (``examples/quantization/quantize.py``
   @ c8c6df0) run under :mod:`runpy` with ``ArgumentParser.parse_args`` stopping right after parsing; one
   that runs to its end without parsing fails.
3. ``model.yaml`` (LLM API flow; the very content ``specpipe package`` writes, from
   :func:`specpipe.trtllm.llmapi_args.model_yaml`): every key except ``triton_config`` is merged with
   ``tensorrt_llm.llmapi.llm_args.update_llm_args_with_extra_dict`` and validated by ``TorchLlmArgs``
   (what the container's Triton model does before ``LLM(**args)``: TensorRT-LLM
   ``triton_backend/all_models/llmapi/tensorrt_llm/1/model.py``), so a wrong ``decoding_type`` or key fails here.
4. Each Triton backend the repository names exists under the backends root
   (``/opt/tritonserver/backends/<name>``).

Output: one line per artifact, ``[checked] ...`` or ``[FAILED] ...: why``, and ``[not checked] ...: why``
for what the document says cannot be checked yet (a model.yaml without a GPU named); exit status 0 when
nothing failed, 1 otherwise, 2 for unusable input. A failed ``import tensorrt_llm`` is classified
(:func:`classify_import_failure`): a missing driver library (no GPU passed, no NVIDIA Container Toolkit),
a missing package, or a broken container.
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


def _outcome(result):
    """``None`` when ``result`` (what a tool's ``parse_arguments()`` returned) shows the argv parsed, else why not."""
    if isinstance(result, argparse.Namespace):
        return None
    return (
        f"parse_arguments() returned {type(result).__name__}, neither a parsed Namespace nor an ArgumentParser: "
        f"this TensorRT-LLM's parser is not one specpipe can check; report it with this TensorRT-LLM's version"
    )


def _parse_with(call, argv):
    """Run ``call`` with ``sys.argv`` = ``argv``; ``None`` when ``argv`` parsed, else the parser's complaint.

    ``call`` is a tool's ``parse_arguments``, of either shape upstream has: one that parses ``sys.argv`` and
    returns the Namespace (the example converters), or one that returns its ``ArgumentParser`` unparsed
    (``trtllm-build``: ``tensorrt_llm/commands/build.py`` @ 65f1d15 ends with ``return parser``; its ``main()``
    calls ``parser.parse_args()``), which is then parsed here. Anything else is a failure, never a pass.
    """
    err = io.StringIO()
    try:
        with _argv(argv), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            result = call()
            if isinstance(result, argparse.ArgumentParser):
                result = result.parse_args(argv[1:])
    except _Parsed:
        return None
    except SystemExit as exc:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        return lines[-1] if lines else f"the parser exited with status {exc.code}"
    except Exception as exc:  # a script that fails while importing or parsing
        return f"{type(exc).__name__}: {exc}"
    return _outcome(result)


def _run_main(script):
    runpy.run_path(script, run_name="__main__")
    raise RuntimeError("the script ran to its end without parsing its arguments")


def check_argv(argv):
    """``None`` when ``argv`` parses with its tool's own parser, else why not."""
    if argv[0] == "trtllm-build":
        try:
            module = importlib.import_module("tensorrt_llm.commands.build")
            parse_arguments = module.parse_arguments
        except Exception as exc:
            return f"{type(exc).__name__} while loading tensorrt_llm.commands.build: {exc}"
        return _parse_with(parse_arguments, ["trtllm-build", *argv[1:]])
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
                return _parse_with(lambda: _run_main(script), [script, *argv[2:]])
        except Exception as exc:
            return f"{type(exc).__name__} while loading {script}: {exc}"
        finally:
            sys.path.remove(os.path.dirname(script))
    return f"no parser known for program {argv[0]!r}"


#: Import errors that name an NVIDIA driver library: what a container lacks when it was started without
#: a GPU (``docker run`` without ``--gpus``) or on a host without the NVIDIA Container Toolkit, which
#: mounts these libraries into the container.
DRIVER_LIBRARIES = (
    "libcuda.so",
    "libnvidia-ml.so",
    "libnvidia-",
    "NVML Shared Library Not Found",
    "CUDA driver version is insufficient",
    "no CUDA-capable device",
    "Found no NVIDIA driver",
)


def classify_import_failure(exc, checks):
    """One line saying why ``import tensorrt_llm`` failed with ``exc`` and what to do: a missing driver
    library (no GPU passed to the container, or no NVIDIA Container Toolkit), a missing package, or a
    broken container (the error text)."""
    text = f"{type(exc).__name__}: {exc}"
    image = checks.get("image", "the pinned container")
    if any(marker in str(exc) for marker in DRIVER_LIBRARIES):
        if checks.get("gpus_passed") is False:
            why = (
                "no GPU was passed to the container (this machine showed none to nvidia-smi, so docker ran "
                "without --gpus): run the check on a machine with an NVIDIA GPU"
            )
        elif checks.get("gpus_passed"):
            why = (
                "the container got --gpus all but no driver libraries: install the NVIDIA Container Toolkit on "
                "this host (nvidia-ctk runtime configure --runtime=docker) and restart docker"
            )
        else:
            why = (
                "run where the NVIDIA driver is installed (in a container: docker run --gpus all, with the NVIDIA "
                "Container Toolkit)"
            )
        return f"a driver library is missing, the container is not broken ({text}): {why}"
    if isinstance(exc, ModuleNotFoundError) and getattr(exc, "name", None) == "tensorrt_llm":
        return f"tensorrt_llm is not installed here ({text}): run the check in {image}"
    return f"the container's TensorRT-LLM is broken ({text}): pull {image} again, or use another release of it"


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
    except Exception as exc:  # OSError too: a shared library that does not load
        out.write(f"[FAILED] tensorrt_llm import: {classify_import_failure(exc, checks)}\n")
        return 1
    pin = checks["pin"]
    results.append(
        (
            f"tensorrt_llm {version}",
            None
            if version == pin
            else f"this TensorRT-LLM is {version}, the plan is pinned to {pin}: use {checks.get('image', 'the pinned container')}",
        )
    )
    for item in checks.get("argvs", []):
        results.append((f"{item['step']}: {' '.join(item['argv'][:2])}", check_argv(item["argv"])))
    if checks.get("model_yaml") is not None:
        results.append(("model.yaml (LLM API arguments)", check_model_yaml(checks["model_yaml"])))
    root = checks.get("backends_root", BACKENDS_ROOT)
    for name in checks.get("backends", []):
        path = os.path.join(root, name)
        results.append(
            (f"Triton backend {name}", None if os.path.isdir(path) else f"{path} does not exist in this image")
        )
    for what, problem in results:
        out.write(f"[checked] {what}\n" if problem is None else f"[FAILED] {what}: {problem}\n")
    skipped = checks.get("not_checked", [])
    for item in skipped:
        out.write(f"[not checked] {item['what']}: {item['why']}\n")
    failed = sum(1 for _, p in results if p is not None)
    out.write(
        f"first contact: {len(results) - failed} checked, {failed} failed"
        f"{f', {len(skipped)} not checked' if skipped else ''}\n"
    )
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
