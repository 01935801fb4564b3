"""The settings of ``specpipe deploy k8s``: one object, checked once, read by every manifest writer."""

from __future__ import annotations

import re
from dataclasses import dataclass

from specpipe.deploy.storage import check_quantity
from specpipe.errors import SpecpipeError

#: Where the engines and the repository come from (``--pvc`` (default), ``--image``, ``--host-path``).
STORAGE_PVC, STORAGE_IMAGE, STORAGE_HOST_PATH = "pvc", "image", "host-path"
#: The key of the API-key Secret the gateway reads unless ``--api-key-secret-key`` names another.
SECRET_KEY = "api-key"
# Label keys: an optional DNS-subdomain prefix and a name of 1-63 characters; values up to 63
# (Kubernetes "Labels and Selectors", syntax and character set).
_NAME = r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([a-z0-9.-]{{0,251}}[a-z0-9])?/)?{_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_NAME})?$")
_DNS_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$")


class DeployOptionError(SpecpipeError):
    """A ``deploy k8s`` option that cannot be written into a manifest."""


@dataclass(frozen=True)
class K8sOptions:
    """What ``specpipe deploy k8s`` was asked to write.

    Attributes:
        replicas: pods, each with TP x PP GPUs. container: the Triton TensorRT-LLM image the engine
            pairs with (``None``: the engine's).
        pvc: an existing PersistentVolumeClaim holding the data (``None``: the output defines one).
        storage_size: the defined claim's size (``None``: measured on disk). storage_class: its class
            (``None``: the cluster's default).
        image: an image with the repository and engines baked in (``REGISTRY/NAME:TAG``).
        host_path: mount the build host's folders from every node (``hostPath``).
        serving_image: the serving image the pods run, or the baked image is built FROM (``None``:
            the local tag of ``docker/Dockerfile``'s build, which a cluster can pull only once pushed).
        gateway: run the OpenAI-compatible gateway as a sidecar (``None``: for engine-flow
            repositories, which have the ensemble it talks to).
        api_key_secret: the existing Secret the gateway's API key comes from; api_key_secret_key: its key.
        node_selector: ``key=value`` node labels the pods need.
        expose_triton: keep Triton's HTTP and gRPC ports in the Service although the gateway has an
            API key (Triton's own ports have no authentication; metrics stay in the Service anyway).
    """

    replicas: int = 1
    container: str | None = None
    pvc: str | None = None
    storage_size: str | None = None
    storage_class: str | None = None
    image: str | None = None
    host_path: bool = False
    serving_image: str | None = None
    gateway: bool | None = None
    api_key_secret: str | None = None
    api_key_secret_key: str = SECRET_KEY
    node_selector: tuple[str, ...] = ()
    expose_triton: bool = False

    @property
    def storage(self) -> str:
        """:data:`STORAGE_IMAGE`, :data:`STORAGE_HOST_PATH` or :data:`STORAGE_PVC`."""
        return STORAGE_IMAGE if self.image else STORAGE_HOST_PATH if self.host_path else STORAGE_PVC

    def check(self) -> None:
        """Raises :class:`DeployOptionError` for options that contradict each other or are malformed."""
        if self.replicas < 1:
            raise DeployOptionError(f"--replicas must be >= 1, got {self.replicas}")
        claim = [
            f
            for f, v in (
                ("--pvc", self.pvc),
                ("--storage-size", self.storage_size),
                ("--storage-class", self.storage_class),
            )
            if v is not None and v is not False
        ]
        chosen = [f for f, v in (("--image", self.image), ("--host-path", self.host_path)) if v] + claim[:1]
        if len(chosen) > 1:
            raise DeployOptionError(
                f"{chosen[0]} and {chosen[1]} choose different storage: give one of --pvc (the default), "
                f"--image and --host-path"
            )
        if self.pvc and (self.storage_size is not None or self.storage_class):
            raise DeployOptionError(
                "--storage-size and --storage-class describe the claim the output defines; "
                f"--pvc {self.pvc} names an existing one: drop them"
            )
        if self.storage_size is not None:  # "" is a wrong size, not no size
            check_quantity(self.storage_size)
        for flag, name in (
            ("--pvc", self.pvc),
            ("--storage-class", self.storage_class),
            ("--api-key-secret", self.api_key_secret),
        ):
            if name and not _DNS_NAME.match(name):
                raise DeployOptionError(
                    f"{flag} {name!r} is not a Kubernetes object name: lower-case letters, digits, '-' and '.'"
                )
        if self.api_key_secret_key and not re.match(r"^[-._A-Za-z0-9]+$", self.api_key_secret_key):
            raise DeployOptionError(
                f"--api-key-secret-key {self.api_key_secret_key!r} is not a Secret key: letters, digits, '-', '_', '.'"
            )
        for flag, ref in (("--image", self.image), ("--serving-image", self.serving_image)):
            if ref and not _IMAGE.match(ref):
                raise DeployOptionError(
                    f"{flag} {ref!r} is not an image reference such as registry.example.com/team/name:tag"
                )
        if self.api_key_secret and self.gateway is False:
            raise DeployOptionError(
                "--api-key-secret is the gateway's key, and --no-gateway leaves the gateway out: drop one"
            )
        self.node_labels()

    def node_labels(self) -> dict[str, str]:
        """``--node-selector`` as a mapping.

        Raises:
            DeployOptionError: not ``key=value``, a key given twice, or not a valid label.
        """
        labels: dict[str, str] = {}
        for item in self.node_selector:
            key, sep, value = item.partition("=")
            if not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
                raise DeployOptionError(
                    f"--node-selector {item!r} is not a node label KEY=VALUE such as "
                    f"nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"
                )
            if key in labels:
                raise DeployOptionError(f"--node-selector names {key} twice: give each label once")
            labels[key] = value
        return labels
