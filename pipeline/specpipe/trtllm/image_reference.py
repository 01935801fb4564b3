"""Container image references, checked before they reach ``docker run``: a value such as ``--privileged``
or an empty string would otherwise become a docker flag or docker's own ``invalid reference format``.

The grammar is docker's, ``[REGISTRY[:PORT]/]PATH[:TAG][@DIGEST]`` (``distribution/reference``
``regexp.go`` @ 727f80d42224f6696b8e1ad16b06aadf2c6b833b, ``ReferencePat``):

* registry: DNS-like components of letters, digits and inner ``-`` joined by ``.``, or ``[IPv6]``, with
  an optional ``:PORT``; it is a registry only when followed by ``/``;
* path: ``/``-separated components of lower-case letters and digits, joined inside by one ``.``, one or
  two ``_`` or any number of ``-``;
* tag: a word character then up to 127 of ``[A-Za-z0-9_.-]``;
* digest: ``ALGORITHM:HEX`` with at least 32 hex digits (``sha256:...``);
* the name (registry and path) is at most 255 characters (``NameTotalLengthMax``, ``reference.go``
  of the same commit).
"""

from __future__ import annotations

import re

from specpipe.errors import SpecpipeError

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_NAME = rf"(?:{_HOST}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
REFERENCE = re.compile(rf"(?P<name>{_NAME})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?", re.ASCII)
NAME_MAX_CHARS = 255


class ImageReferenceError(SpecpipeError):
    """A container image reference docker would refuse or read as something else."""


def check(image: str, *, example: str = "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3") -> str:
    """``image`` when it is an image reference of docker's grammar (module docstring); returns it unchanged.

    Raises:
        ImageReferenceError: empty, starting with ``-`` (it would become a docker flag), not of the
            grammar (upper-case path, spaces, a bad tag or digest), or a name over 255 characters; the
            message shows the form and ``example``.
    """
    form = f"give [REGISTRY/]NAME[:TAG][@sha256:DIGEST], e.g. {example}"
    if not image or not image.strip():
        raise ImageReferenceError(f"the container image is empty: {form}")
    if image.startswith("-"):
        raise ImageReferenceError(
            f"the container image {image!r} starts with '-' and would be read as a docker flag: {form}"
        )
    match = REFERENCE.fullmatch(image)
    if match is None:
        hint = " (the name must be lower case)" if REFERENCE.fullmatch(image.lower()) else ""
        raise ImageReferenceError(f"{image!r} is not a container image reference{hint}: {form}")
    if len(match["name"]) > NAME_MAX_CHARS:
        raise ImageReferenceError(f"the image name of {image!r} is longer than {NAME_MAX_CHARS} characters: {form}")
    return image
