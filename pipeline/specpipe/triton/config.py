"""Triton ``config.pbtxt`` files built from the protobuf schema, written, re-read and cross-checked.

Configs are ``tritonclient.grpc.model_config_pb2.ModelConfig`` messages (Triton's
``model_config.proto``) built from :mod:`specpipe.triton.interface`, never from text templates, so a
file cannot hold an unreplaced ``${...}`` placeholder or a misspelt field. Every written file is
parsed back strictly (unknown fields are errors) and compared with the message it came from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from specpipe.errors import SpecpipeError
from specpipe.triton.interface import ENSEMBLE, ENSEMBLE_STEPS, MAX_BATCH_SIZE
from specpipe.triton.tensor_spec import ModelInterface, TensorSpec

CONFIG_NAME = "config.pbtxt"
PLACEHOLDER = "${"


def data_type(dtype: str) -> int:
    """``model_config.proto`` DataType enum value of ``dtype`` (``"INT32"`` -> ``TYPE_INT32``)."""
    try:
        return mc.DataType.Value(f"TYPE_{dtype}")
    except ValueError as exc:
        raise SpecpipeError(f"unknown Triton data type {dtype!r}: use one of INT32, FP32, BOOL, STRING ...") from exc


def model_input(spec: TensorSpec) -> mc.ModelInput:
    """A ``ModelInput`` for ``spec`` (name, data type, dims, optional, reshape)."""
    message = mc.ModelInput(
        name=spec.name,
        data_type=data_type(spec.dtype),
        dims=list(spec.dims),
        optional=spec.optional,
        allow_ragged_batch=spec.ragged,
    )
    if spec.reshape is not None:
        message.reshape.SetInParent()  # an empty shape (a scalar) must still be present
        message.reshape.shape.extend(spec.reshape)
    return message


def model_output(spec: TensorSpec) -> mc.ModelOutput:
    """A ``ModelOutput`` for ``spec`` (name, data type, dims)."""
    return mc.ModelOutput(name=spec.name, data_type=data_type(spec.dtype), dims=list(spec.dims))


def python_model_config(
    interface: ModelInterface,
    parameters: Mapping[str, str],
    *,
    decoupled: bool = False,
    max_batch_size: int = MAX_BATCH_SIZE,
    instance_count: int = 1,
) -> mc.ModelConfig:
    """Config of a Python-backend model: ``backend: "python"``, one CPU instance group.

    Args:
        interface: the model's tensors.
        parameters: string parameters (``parameters { key ... value { string_value ... } }``).
        decoupled: ``model_transaction_policy { decoupled: true }`` (any number of responses per request).
        max_batch_size: requests' leading batch dimension at most.
        instance_count: model instances (``KIND_CPU``).
    """
    config = mc.ModelConfig(name=interface.name, backend="python", max_batch_size=max_batch_size)
    config.input.extend(model_input(s) for s in interface.inputs)
    config.output.extend(model_output(s) for s in interface.outputs)
    if decoupled:
        config.model_transaction_policy.decoupled = True
    config.instance_group.append(mc.ModelInstanceGroup(count=instance_count, kind=mc.ModelInstanceGroup.KIND_CPU))
    for key, value in parameters.items():
        config.parameters[key].string_value = str(value)
    return config


def ensemble_model_config(
    max_batch_size: int = MAX_BATCH_SIZE, steps=ENSEMBLE_STEPS, interface: ModelInterface = ENSEMBLE
) -> mc.ModelConfig:
    """Config of the ``ensemble`` model: ``interface``'s tensors (default
    :data:`~specpipe.triton.interface.ENSEMBLE`) wired through ``steps`` (default
    :data:`~specpipe.triton.interface.ENSEMBLE_STEPS`; ``platform: "ensemble"``)."""
    config = mc.ModelConfig(name=interface.name, platform="ensemble", max_batch_size=max_batch_size)
    config.input.extend(model_input(s) for s in interface.inputs)
    config.output.extend(model_output(s) for s in interface.outputs)
    for step in steps:
        message = config.ensemble_scheduling.step.add(model_name=step.model_name, model_version=-1)
        for key, value in step.input_map:
            message.input_map[key] = value
        for key, value in step.output_map:
            message.output_map[key] = value
    return config


def config_text(config: mc.ModelConfig) -> str:
    """``config`` in protobuf text format, as Triton reads ``config.pbtxt``."""
    return text_format.MessageToString(config)


def parse_config(text: str, source: str = "<text>") -> mc.ModelConfig:
    """Parse protobuf text strictly into a ``ModelConfig``.

    Raises:
        SpecpipeError: unknown fields, bad syntax or bad enum values (names ``source``).
    """
    try:
        return text_format.Parse(text, mc.ModelConfig())
    except text_format.ParseError as exc:
        raise SpecpipeError(
            f"{source} is not a valid Triton model config ({exc}): regenerate it with 'specpipe package'"
        ) from exc


def read_config(path: Path) -> mc.ModelConfig:
    """Read and strictly parse a ``config.pbtxt`` (errors as in :func:`parse_config`)."""
    return parse_config(Path(path).read_text(), str(path))


def write_config(config: mc.ModelConfig, model_dir: Path) -> Path:
    """Write ``model_dir/config.pbtxt``, parse it back and check it equals ``config``.

    Raises:
        SpecpipeError: the file does not parse back to the same message, or holds ``${``.
    """
    path = Path(model_dir) / CONFIG_NAME
    text = config_text(config)
    if PLACEHOLDER in text:
        raise SpecpipeError(
            f"{path} would contain an unreplaced '{PLACEHOLDER}...' placeholder: a value was not filled in"
        )
    path.write_text(text)
    if read_config(path) != config:
        raise SpecpipeError(f"{path} does not read back as the config that was written: report this as a bug")
    return path


def find_placeholders(root: Path) -> list[Path]:
    """Files under ``root`` (recursively) that contain ``${``, sorted."""
    hits = []
    for path in sorted(Path(root).rglob("*")):
        if path.is_file() and PLACEHOLDER.encode() in path.read_bytes():
            hits.append(path)
    return hits


def check_no_placeholders(root: Path) -> None:
    """Raise :class:`SpecpipeError` naming every file under ``root`` that contains ``${``."""
    hits = find_placeholders(root)
    if hits:
        names = ", ".join(str(p) for p in hits)
        raise SpecpipeError(
            f"unreplaced '{PLACEHOLDER}...' placeholders in {names}: regenerate with 'specpipe package'"
        )


def _tensor_types(tensors: Iterable) -> dict[str, int]:
    return {t.name: t.data_type for t in tensors}


def ensemble_problems(ensemble: mc.ModelConfig, steps: Mapping[str, mc.ModelConfig]) -> list[str]:
    """Everything wrong with the wiring of ``ensemble`` against its step models' configs.

    Checks that each step model exists; every ``input_map`` key is an input and every ``output_map``
    key an output of its step model; every ``input_map`` value is an ensemble input or a tensor some
    step produces; every ``output_map`` value is produced once; every ensemble output is produced;
    required step inputs are all mapped; and connected tensors have one data type.
    """
    problems: list[str] = []
    ensemble_inputs = _tensor_types(ensemble.input)
    ensemble_outputs = _tensor_types(ensemble.output)
    produced: dict[str, tuple[str, int]] = {}  # ensemble tensor -> (producer, data type)
    for step in ensemble.ensemble_scheduling.step:
        model = steps.get(step.model_name)
        if model is None:
            problems.append(f"step model '{step.model_name}' has no config")
            continue
        outputs = _tensor_types(model.output)
        for key, value in step.output_map.items():
            if key not in outputs:
                problems.append(f"output_map key '{key}' is not an output of '{step.model_name}'")
                continue
            if value in produced:
                problems.append(
                    f"ensemble tensor '{value}' is produced twice ('{produced[value][0]}' and '{step.model_name}')"
                )
            if value in ensemble_inputs:
                problems.append(f"output_map value '{value}' of '{step.model_name}' overwrites an ensemble input")
            produced[value] = (step.model_name, outputs[key])
            if value in ensemble_outputs and ensemble_outputs[value] != outputs[key]:
                problems.append(f"ensemble output '{value}' and '{step.model_name}.{key}' differ in data type")
    for step in ensemble.ensemble_scheduling.step:
        model = steps.get(step.model_name)
        if model is None:
            continue
        inputs = {t.name: t for t in model.input}
        for key, value in step.input_map.items():
            if key not in inputs:
                problems.append(f"input_map key '{key}' is not an input of '{step.model_name}'")
                continue
            if value in ensemble_inputs:
                dtype = ensemble_inputs[value]
            elif value in produced:
                dtype = produced[value][1]
            else:
                problems.append(
                    f"input_map value '{value}' of '{step.model_name}' is neither an ensemble input nor produced by a step"
                )
                continue
            if dtype != inputs[key].data_type:
                problems.append(f"'{value}' feeds '{step.model_name}.{key}' with another data type")
        for name, spec in inputs.items():
            if not spec.optional and name not in step.input_map:
                problems.append(f"required input '{name}' of '{step.model_name}' is not mapped")
    for name in ensemble_outputs:
        if name not in produced:
            problems.append(f"ensemble output '{name}' is produced by no step")
    return problems


def check_ensemble(ensemble_cfg: mc.ModelConfig, step_cfgs: Mapping[str, mc.ModelConfig]) -> None:
    """Raise :class:`SpecpipeError` listing every problem :func:`ensemble_problems` finds."""
    problems = ensemble_problems(ensemble_cfg, step_cfgs)
    if problems:
        raise SpecpipeError(f"ensemble '{ensemble_cfg.name}' is miswired: " + "; ".join(problems))
