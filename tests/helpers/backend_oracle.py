"""The tensorrtllm backend's parser of ``eagle_choices`` / ``medusa_choices``, in Python: a test oracle.

The backend parses these parameters with ``utils::csvStrToVecVecInt``
(NVIDIA/TensorRT-LLM ``triton_backend/inflight_batcher_llm/src/utils.cc``; same function in
triton-inference-server/tensorrtllm_backend ``inflight_batcher_llm/src/utils.cc`` @ c2e65b8): it
reads up to each ``}``, drops one leading ``{``, splits the rest on commas with ``std::stoi``, then
skips the separating comma. :func:`parse_like_backend` follows those steps so tests can check that
:meth:`specpipe.tree.Tree.to_backend_text` round-trips.
"""

from __future__ import annotations


def parse_like_backend(text: str) -> list[list[int]]:
    """The tree the backend reads from ``text`` (its parsing steps, see the module docstring).

    Raises:
        ValueError: where the backend's ``std::stoi`` or its empty-input checks would throw.
    """
    if not text:
        raise ValueError("empty string")
    paths: list[list[int]] = []
    rest = text
    while True:
        end = rest.find("}")
        if end < 0:  # getline reached the end of the stream: the loop stops
            break
        group, rest = rest[:end], rest[end + 1 :]
        if group == "":
            break
        if group[0] == "{":
            group = group[1:]
        paths.append(_csv_ints(group))
        rest = rest.lstrip()
        comma = rest.find(",")
        rest = "" if comma < 0 else rest[comma + 1 :].lstrip()
    return paths


def _csv_ints(text: str) -> list[int]:
    if not text:
        raise ValueError("empty group")
    values = []
    for item in text.split(","):
        item = item.lstrip()
        if item == "":
            break
        digits = item.rstrip()
        sign = digits[:1] in "+-" and digits[:1] != ""
        body = digits[1:] if sign else digits
        if not body or not body[0].isdigit():
            raise ValueError(f"stoi: no conversion for {item!r}")
        number = ""
        for ch in body:
            if not ch.isdigit():
                break
            number += ch
        values.append(int(digits[0] + number if sign else number))
    if not values:
        raise ValueError("empty vector")
    return values
