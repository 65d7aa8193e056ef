"""TP0's scheduler event loop (managers/scheduler.py event_loop_normal), as far as a client, /health and the journal
can see it.

- Prefill is serial and chunked: each loop iteration runs one prefill batch of at most ``--chunked-prefill-size``
  new tokens (-1: no limit), FCFS: the request being chunked first, then waiting ones; a request larger than what
  is left becomes the chunked request. A batch lasts its new tokens / ``SGLANG_SIM_PREFILL_TOKENS_PER_S``
  simulated seconds and prints SGLang 0.5.10's line (observability/scheduler_metrics_mixin.py,
  report_prefill_stats). While prefill batches run, decoding waits (no mixed chunk: get_next_batch_to_run prefers
  a new prefill batch).
- Decoding requests (their tokens come from the throughput model, http.py) make one decode batch per token of
  the slowest share; every ``--decode-log-interval`` decode batches the loop prints report_decode_stats' line.
- Health checks (http_server.health_generate, Scheduler.process_input_requests): a check that arrives while the
  scheduler is fully idle is an ordinary one-token prefill (its own ``#new-token: 1`` line); one that arrives while
  it is busy is answered after the next batch that starts after it (maybe_send_health_check_signal). Either way the
  tokenizer's ``last_receive_tstamp`` moves then; a batch that never ends (an NCCL hang) moves nothing.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

from . import gpu as G
from . import throughput as T
from .logs import line

PREFILL_SPEED_ENV = "SGLANG_SIM_PREFILL_TOKENS_PER_S"
# Single-request prefill of Kimi K2.x (1T MoE, 32B active, INT4 experts) on 8 PCIe GPUs without NVLink, in
# simulated tokens per second. No public single-request figure for this class of hardware was found. The nearest
# public measurement: Kimi K2.5 under SGLang on 8x RTX PRO 6000 Blackwell (PCIe), a synthetic coding-agent load of
# 2k-45k input tokens with up to 10 concurrent requests, mean TTFT ~9 s and median ~3.7 s (Yannick Nick's
# KTransformers/SGLang comparison posts, Feb 2026), i.e. a few thousand prompt tokens a second. 2000 is the
# conservative end of that: slower prefill means longer stalls, the harder case for anything watching the host.
# It is the figure of TP8 (`--tp-size 8`); other layouts scale it by their saturated decode aggregate
# (throughput.py: EP8 x960/808, TP2-EP4 x1531/808, PP8 x396/808), as the whole batch's compute does. It ignores
# that late chunks of a very long prompt are slower (attention over the whole prefix).
DEFAULT_PREFILL_TOKENS_PER_S = 2000.0


def prefill_speed(agg: float) -> float:
    """SGLANG_SIM_PREFILL_TOKENS_PER_S when set (any layout), else the TP8 default scaled by the layout's aggregate."""
    default = DEFAULT_PREFILL_TOKENS_PER_S * agg / T.CALIBRATION["tp8"][1]
    try:
        value = float(os.environ[PREFILL_SPEED_ENV])
    except (KeyError, ValueError):
        return default
    return value if value > 0 else default


def hang_while_nccl_hangs() -> None:
    """A collective that never completes (sim/lab/lab.py fault HOST hang): the batch stops where it is, no error,
    until the processes are killed."""
    while G.nccl_hung():
        time.sleep(0.5)


def prefill_message(new_seqs: int, new_tokens: int, usage: float, running: int, queued: int,
                    input_throughput: float) -> str:
    """report_prefill_stats' line in SGLang 0.5.10 (no SWA/mamba pools, no PD disaggregation, no MFU metrics)."""
    return (f"Prefill batch, #new-seq: {new_seqs}, #new-token: {new_tokens}, #cached-token: 0, "
            f"token usage: {usage:.2f}, #running-req: {running}, #queue-req: {queued}, "
            f"cuda graph: False, input throughput (token/s): {input_throughput:.2f}")


def decode_message(running: int, tokens: int, usage: float, cuda_graph: bool, gen_throughput: float,
                   queued: int) -> str:
    """report_decode_stats' line in SGLang 0.5.10 (no speculative decoding, no PD disaggregation)."""
    return (f"Decode batch, #running-req: {running}, #token: {tokens}, token usage: {usage:.2f}, "
            f"cuda graph: {cuda_graph}, gen throughput (token/s): {gen_throughput:.2f}, #queue-req: {queued}")


class _Prefill:
    def __init__(self, tokens: int, health: bool = False):
        self.tokens = tokens
        self.done = 0
        self.health = health
        self.finished = threading.Event()


class Scheduler:
    def __init__(self, st):
        self.st = st
        self.clock = st.serve_clock
        self.chunk = int(st.args.chunked_prefill_size or -1)
        self.log_interval = max(1, int(getattr(st.args, "decode_log_interval", 40) or 40))
        self.speed = prefill_speed(st.healthy_agg) / st.slowdown  # the healthy layout's speed, unless "slow"
        self.cuda_graph_max_bs = int(st.plan.cuda_graph_max_bs or 0)
        self.max_total = max(1, int(st.plan.max_total_num_tokens or 1))
        self.cv = threading.Condition()
        self.waiting: deque[_Prefill] = deque()
        self.chunked: _Prefill | None = None
        self.inbox: list[threading.Event] = []  # health checks sent, not yet received by the loop
        self.decoding = 0  # requests past their prefill, not finished
        self.kv_tokens = 0  # tokens held in the KV pool by requests in flight
        self.prefilling = threading.Event()
        self.decode_steps = 0.0  # forward_ct_decode (fractional: many requests share a batch)
        self.last_prefill_tic = self.clock.sim_now()
        self.last_prefill_tokens = 0
        self.last_decode_tic = self.clock.sim_now()
        self.generated_since_log = 0.0

    # ---- called by request threads ---------------------------------------------------------------
    def prefill(self, tokens: int) -> None:
        """Queue a request's prefill and wait until its last chunk has run (its first token is out)."""
        job = _Prefill(tokens)
        with self.cv:
            self.waiting.append(job)
            self.cv.notify_all()
        job.finished.wait()

    def decoded(self, tokens: int) -> None:
        """A decoding request got `tokens` more: with n requests decoding, each decode batch gives each one token,
        so they make tokens / n decode batches (forward_ct_decode); every --decode-log-interval of them the loop
        logs report_decode_stats' line."""
        with self.cv:
            self.kv_tokens += tokens
            running = max(1, self.decoding)
            before = self.decode_steps
            self.decode_steps += tokens / running
            self.generated_since_log += tokens
            due = int(self.decode_steps // self.log_interval) - int(before // self.log_interval)
            if due:  # a request's thread hands over several batches' tokens at once: one line per interval
                now = self.clock.sim_now()
                gen = self.generated_since_log / max(now - self.last_decode_tic, 1e-9)
                self.last_decode_tic, self.generated_since_log = now, 0.0
                msg = decode_message(running, self.kv_tokens, self.kv_tokens / self.max_total,
                                     running <= self.cuda_graph_max_bs, gen, len(self.waiting))
        for _ in range(due):
            line(self.st.clock, self.st.prefix_tp0, msg)

    def release(self, tokens: int, decoding: bool) -> None:
        """A request left: its KV tokens are freed."""
        with self.cv:
            self.kv_tokens = max(0, self.kv_tokens - tokens)
            if decoding:
                self.decoding -= 1

    def wait_for_decode_turn(self) -> bool:
        """Decoding waits while a prefill batch runs; True when it had to wait."""
        if not self.prefilling.is_set():
            return False
        while self.prefilling.is_set():
            time.sleep(0.005)
        return True

    def health_check(self) -> threading.Event:
        """health_generate's one-token request: the event is set when the scheduler answers anything for it."""
        ev = threading.Event()
        with self.cv:
            self.inbox.append(ev)
            self.cv.notify_all()
        return ev

    # ---- the event loop --------------------------------------------------------------------------
    def _idle(self) -> bool:
        return not self.waiting and self.chunked is None and self.decoding == 0

    def run(self) -> None:
        """The loop; the server runs it in a helper thread (one that leaves the ending signals to the main one)."""
        while True:
            with self.cv:
                while not (self.waiting or self.chunked or self.inbox or self.decoding):
                    self.cv.wait()
                signals = []
                for ev in self.inbox:  # process_input_requests
                    if self._idle():
                        job = _Prefill(1, health=True)
                        job.finished = ev
                        self.waiting.append(job)
                    else:
                        signals.append(ev)
                self.inbox.clear()
                batch = self._next_prefill_batch()
                if batch:
                    self.prefilling.set()
            if batch:
                self._run_prefill(batch)
            else:
                self._decode_batch()
            if signals:  # maybe_send_health_check_signal after the batch: the tokenizer receives something
                self.st.last_output = time.time()
                for ev in signals:
                    ev.set()

    def _next_prefill_batch(self) -> list[tuple[_Prefill, int]]:
        budget = self.chunk if self.chunk > 0 else float("inf")
        batch = []
        if self.chunked is not None:
            job, self.chunked = self.chunked, None
            take = int(min(job.tokens - job.done, budget))
            batch.append((job, take))
            budget -= take
            if job.done + take < job.tokens:
                self.chunked = job
        while self.chunked is None and self.waiting and budget > 0:
            job = self.waiting.popleft()
            take = int(min(job.tokens, budget))
            batch.append((job, take))
            budget -= take
            if take < job.tokens:
                self.chunked = job
        return batch

    def _run_prefill(self, batch: list[tuple[_Prefill, int]]) -> None:
        try:
            hang_while_nccl_hangs()
            new_tokens = sum(take for _, take in batch)
            time.sleep(new_tokens / self.speed * self.clock.factor)
        finally:
            self.prefilling.clear()
        now = self.clock.sim_now()
        with self.cv:
            for job, take in batch:
                job.done += take
                if not job.health:
                    self.kv_tokens += take
                    if job.done >= job.tokens:
                        self.decoding += 1  # it joins the running batch
            gap = max(now - self.last_prefill_tic, 1e-9)
            throughput = self.last_prefill_tokens / gap
            self.last_prefill_tic, self.last_prefill_tokens = now, new_tokens
            msg = prefill_message(len(batch), new_tokens, self.kv_tokens / self.max_total, self.decoding,
                                  len(self.waiting), throughput)
        line(self.st.clock, self.st.prefix_tp0, msg)
        for job, _ in batch:
            if job.done >= job.tokens:
                self.st.last_output = time.time()
                job.finished.set()

    def _decode_batch(self) -> None:
        """While requests decode (their tokens come from their own threads, http.py), the loop only waits about one
        decode batch or until something arrives."""
        with self.cv:
            if self.decoding and not (self.waiting or self.inbox):
                speed = T.per_request(self.decoding, self.st.s1, self.st.agg)
                self.cv.wait(timeout=max(self.clock.factor / speed, 0.001))
        hang_while_nccl_hangs()
