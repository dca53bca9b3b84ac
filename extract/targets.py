"""The GPUs emmy compiles for.

Only identity and features for now; the cost model's figures (bandwidth,
rates, limits) join each entry when extraction needs them.
"""

from __future__ import annotations

from dataclasses import dataclass

from emmy.errors import UnknownTargetError


@dataclass(frozen=True)
class Target:
    name: str  # the nvcc architecture, e.g. "sm_90"
    compute_capability: tuple[int, int]
    gpus: tuple[str, ...]

    @property
    def has_cp_async(self) -> bool:  # cp.async arrived with Ampere (PTX ISA 7.0)
        return self.compute_capability >= (8, 0)

    @property
    def has_tma(self) -> bool:  # the tensor memory accelerator arrived with Hopper
        return self.compute_capability >= (9, 0)


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("sm_80", (8, 0), ("A100",)),
        Target("sm_89", (8, 9), ("L40S", "RTX 4090")),
        Target("sm_90", (9, 0), ("H100", "H200")),
        Target("sm_120", (12, 0), ("RTX 5090",)),
    )
}


def get_target(name: str) -> Target:
    found = TARGETS.get(name)
    if found is None:
        raise UnknownTargetError(f"unknown target {name!r}; emmy knows {', '.join(TARGETS)}")
    return found
