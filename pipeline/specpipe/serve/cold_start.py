"""Cold start of a Triton server: time to ready and each model's load time, read from Triton's log.

Triton (2.51, default log settings) writes one line when it starts loading a model version and one when
the model is loaded, each with a glog timestamp (``IMMDD hh:mm:ss.uuuuuu``)::

    I1130 22:16:57.364314 17157 model_lifecycle.cc:472] "loading: tensorrt_llm:1"
    I1130 22:17:47.818250 17157 model_lifecycle.cc:839] "successfully loaded 'tensorrt_llm'"

A model's load time is the difference; it includes what the model does before it reports ready (the
CPU engine's warm-up, Triton's ``model_warmup`` requests). Neither the repository index nor the model
statistics extension reports load times, hence the log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

_STAMP = r"^[IWE](?P<month>\d\d)(?P<day>\d\d) (?P<time>\d\d:\d\d:\d\d\.\d+) "
_LOADING = re.compile(_STAMP + r'.*"loading: (?P<model>[^:"]+):\d+"')
_LOADED = re.compile(_STAMP + r".*\"successfully loaded '(?P<model>[^']+)'")


def _seconds(match: re.Match) -> float:
    stamp = datetime.strptime(f"{match['month']}{match['day']} {match['time']}", "%m%d %H:%M:%S.%f")
    return (stamp - datetime(1900, 1, 1)).total_seconds()


def model_load_times(log_text: str) -> dict[str, float]:
    """Seconds from "loading" to "successfully loaded" per model (the last load of each), in load order.

    Models still loading, or that failed, are left out.
    """
    started: dict[str, float] = {}
    times: dict[str, float] = {}
    for line in log_text.splitlines():
        match = _LOADING.match(line)
        if match:
            started[match["model"]] = _seconds(match)
            continue
        match = _LOADED.match(line)
        if match and match["model"] in started:
            times[match["model"]] = round(max(0.0, _seconds(match) - started[match["model"]]), 3)
    return times


@dataclass(frozen=True)
class ColdStart:
    """How long a server took to become ready.

    Attributes:
        ready_s: seconds from starting the process to ``/v2/health/ready`` answering 200.
        model_load_s: seconds each model took to load (see :func:`model_load_times`).
    """

    ready_s: float
    model_load_s: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        """One line: ``ready in 52.3 s (tensorrt_llm 50.5 s, preprocessing 39.4 s, ...)``, slowest first."""
        models = ", ".join(
            f"{name} {seconds:.1f} s" for name, seconds in sorted(self.model_load_s.items(), key=lambda item: -item[1])
        )
        return f"ready in {self.ready_s:.1f} s" + (f" (model load: {models})" if models else "")
