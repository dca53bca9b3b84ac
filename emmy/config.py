"""The one place that reads `EMMY_*` environment variables.

Other modules ask this module; nothing else touches `os.environ` for emmy
settings, so every knob a user can set from the environment is listed here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TARGET = "sm_90"


@dataclass(frozen=True)
class Settings:
    target: str  # EMMY_TARGET: the GPU to compile for when none is given
    cache_dir: Path  # EMMY_CACHE_DIR: on-disk caches (capture, cubins)


def settings(environ: dict[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    cache = env.get("EMMY_CACHE_DIR") or str(Path.home() / ".cache" / "emmy")
    return Settings(
        target=env.get("EMMY_TARGET") or DEFAULT_TARGET,
        cache_dir=Path(cache),
    )
