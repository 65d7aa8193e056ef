"""Simulated time.

A full start of Kimi K2.6 takes about 600 simulated seconds (mostly reading ~555 GiB of shards). The wall
clock runs `WALL_PER_SIM * SGLANG_SIM_TIME_SCALE` seconds per simulated second: with the default scale 1.0 a
full start takes about 10 s of wall time; tests use 0.05 (about 0.5 s). Without the variable the scale is the
host's, in /etc/sim-gpu/time-scale (a lab host's clock: sim/lab/lab.py writes it), else 1.0.
"""

from __future__ import annotations

import os
import time

WALL_PER_SIM = 10.0 / 600.0


HOST_TIME_SCALE = "/etc/sim-gpu/time-scale"


def time_scale() -> float:
    value = os.environ.get("SGLANG_SIM_TIME_SCALE")
    if value is None:
        try:
            with open(HOST_TIME_SCALE) as f:
                value = f.read().strip()
        except OSError:
            value = "1.0"
    try:
        return float(value)
    except ValueError:
        return 1.0


class Clock:
    def __init__(self, wall_start: float | None = None, sim_offset: float = 0.0):
        self.wall_start = time.time() if wall_start is None else wall_start
        self.sim_offset = sim_offset
        self.factor = WALL_PER_SIM * time_scale()
        self.logical: float | None = None  # the simulated time of the event being logged, when known

    def sim_now(self) -> float:
        if self.factor <= 0:
            return self.sim_offset
        return self.sim_offset + (time.time() - self.wall_start) / self.factor

    def sim_epoch(self) -> float:
        """Epoch seconds to print: start wall time + simulated time of the event (or elapsed)."""
        return self.wall_start + (self.logical if self.logical is not None else self.sim_now())

    def sleep_until(self, sim_t: float) -> None:
        delay = (sim_t - self.sim_now()) * self.factor
        if delay > 0:
            time.sleep(delay)
        self.logical = sim_t

    def sleep_sim(self, sim_seconds: float) -> None:
        if sim_seconds > 0:
            time.sleep(sim_seconds * self.factor)
        if self.logical is not None:
            self.logical += max(sim_seconds, 0)
