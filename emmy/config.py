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
    egraph_iterations: int  # EMMY_EGRAPH_ITERATIONS: iterations per saturation phase
    egraph_enodes: int  # EMMY_EGRAPH_ENODES: e-nodes a phase may add (per 10,000 e-nodes of the program)
    egraph_seconds: float  # EMMY_EGRAPH_SECONDS: seconds per phase (per 10,000 e-nodes of the program)
    knobs: str  # EMMY_KNOBS: schedule pins, "K=V,..." (see emmy/schedule/knobs.py)
    measurements: Path | None = None  # EMMY_MEASUREMENTS: a JSON file of measured kernel times
    db: Path | None = None  # EMMY_DB: the measurement database (default: EMMY_CACHE_DIR/measurements.sqlite)
    calibration_dir: Path = Path()  # EMMY_CALIBRATION_DIR: fitted factors by GPU (default EMMY_CACHE_DIR/calibration)
    sim_mode: str = "plain"  # EMMY_SIM_MODE: the simulator build programs run in (plain, asan, racecheck)
    lazy_input_bytes: int = 256 << 20  # EMMY_LAZY_INPUT_MB: -c code inputs larger than this are made only
    # when a run needs their values (compiling needs their shapes)
    dynamo_rnn: bool = True  # EMMY_DYNAMO_RNN: 0 leaves Dynamo's allow_rnn as it is (emmy.dynamo)


def settings(environ: dict[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    cache = env.get("EMMY_CACHE_DIR") or str(Path.home() / ".cache" / "emmy")
    return Settings(
        target=env.get("EMMY_TARGET") or DEFAULT_TARGET,
        cache_dir=Path(cache),
        egraph_iterations=_number(env, "EMMY_EGRAPH_ITERATIONS", int, 30),
        egraph_enodes=_number(env, "EMMY_EGRAPH_ENODES", int, 20_000),
        egraph_seconds=_number(env, "EMMY_EGRAPH_SECONDS", float, 0.5),
        knobs=env.get("EMMY_KNOBS", ""),
        measurements=Path(env["EMMY_MEASUREMENTS"]) if env.get("EMMY_MEASUREMENTS") else None,
        db=Path(env["EMMY_DB"]) if env.get("EMMY_DB") else None,
        calibration_dir=Path(env.get("EMMY_CALIBRATION_DIR") or Path(cache) / "calibration"),
        sim_mode=_choice(env, "EMMY_SIM_MODE", ("plain", "asan", "racecheck"), "plain"),
        lazy_input_bytes=_number(env, "EMMY_LAZY_INPUT_MB", int, 256) << 20,
        dynamo_rnn=_choice(env, "EMMY_DYNAMO_RNN", ("0", "1"), "1") == "1",
    )


def _choice(env, name: str, choices: tuple[str, ...], default: str) -> str:
    text = env.get(name) or default
    if text not in choices:
        from emmy.errors import EmmyError

        raise EmmyError(f"{name}={text!r} is not one of {', '.join(choices)}")
    return text


def _number(env, name: str, kind, default):
    text = env.get(name)
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or value <= 0:
        from emmy.errors import EmmyError

        raise EmmyError(f"{name}={text!r} is not a positive {kind.__name__}")
    return value
