"""Continuous batching for the edge: one thread owns the model and steps every answer in flight.

Orca-style iteration-level scheduling (Yu et al., OSDI 2022): between two decode steps the
scheduler drops what is cancelled or past its deadline, starts the waiting requests the batch
has room for (at most `max_starts`), then runs one batched decode step
(`kvedge.common.model.batch.decode_step`) for every running one. The rows a step pays for
anyway — the padding that keeps answers batch-invariant, up to `spec_rows` — carry greedy
requests' draft tokens (prompt lookup), so a step can give a request several tokens.

Graph decode (`graph_decode`; on by default where the model is on CUDA): while one answer
alone is running, it is stepped in fixed buffers (`kvedge.common.model.static_decode`) made
for it at its first lone step and replayed as a CUDA graph — one token a step, no drafts. On
an H200 (Qwen2.5-0.5B's shape, bf16) that took 3.48 ms a token at 1.3K tokens of context and
6.04 at 8K, against `decode_step`'s 16.6 and 16.3 (one row, unpadded). A second answer
joining hands the run back to the answer's own cache (`StaticDecode.hand_back`) before it
starts, so the copy never meets a new start's KV, and the batched step continues both; a lone
answer that leaves drops its run. The copy doubles the answer's KV while it lives, so under a
`kv_budget` an answer runs that way only where twice its `kv_bytes` fits (else its steps are
the batched ones). It is not bit for bit the batched step (float rounding: the static
module's "Exactness"), so it is on only on CUDA, where the batched step's batch invariance
is not established either; off on the CPU, where it gains nothing over the unpadded step,
takes no drafts and would break the CPU step's invariance (the module's "Off on the CPU").
A failed static step fails its answer as a broken batched step does.

Starting a request — its strategy's plan and the forward over the prompt, up to its first
token — runs alone: those forwards already have hundreds of rows (compute-bound on a CPU, so
batching them would buy nothing), and each strategy's per-layer plan and observer stay as they
are. Starts go first, as in vLLM's default schedule: a full batch makes the most of each step
(on 2 CPU cores a step of 16 costs about what a start does, so starting one request per step
would cap throughput at one answer per start + step); the price is that the answers already
running pause while a burst is started (`max_starts` bounds the pause).

Stall-free starts (`max_stall`, seconds; None: off). A start pauses the answers already
running for as long as its forward takes: on 2 CPU cores with Qwen2.5-0.5B and 30 HotpotQA
paragraphs, 8 in flight, a legolink answer took a mean of 118 s against 19.5 s alone, each
new ~15 s start stalling the other seven (docs/results.md). Sarathi-Serve (Agrawal et al.,
"Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve", OSDI 2024, Sec. 4)
makes batches stall-free by splitting a prefill into chunks of tokens, each run in one batch
with the decodes. Here a start is split at its layers instead: `Runtime.forward` calls
`Runtime.between_layers` after each layer, and while a start runs with answers decoding the
scheduler sets it to run one decode step of those answers whenever `max_stall` seconds have
passed since their last. Decision (2026-11-29), layers rather than Sarathi's token chunks:
the start's forward runs exactly as before — the same ops over the same tensors — so every
answer stays the same bits as without the option (and the batched step, being
batch-invariant, the same bits for the running ones); a token-chunked start would change its
attention's shapes and so its bits, and the reuse strategies that choose their recompute set
at a shallow layer from the whole prompt (A3, CacheBlend, SparseX) cannot be cut by tokens.
What it gives up: Sarathi's chunks share one batch with the decodes (on a GPU the decode rows
ride on the prefill's compute nearly free); here the steps take their own time, so a start
grows by the steps run inside it — the starting answer's first token later, the running
answers' tokens sooner. The steps inside a start are always batched ones (never a lone
answer's graph decode, which would copy a cache while the start's KV grows).

Requests wait in a bounded queue: beyond `max_waiting` a submit raises Overloaded
(RESOURCE_EXHAUSTED). `waiting` and `running` are the queue depth and the batch size.

Admission by KV memory (vLLM admits by free KV blocks): each job says how many bytes its cache
holds at most (`Job.kv_bytes`: its prompt and decode budget at the runtime's dtype); with a
`kv_budget` a waiting job starts only while the running ones' and its own fit in it, and
waits otherwise, in order. One alone always starts, so nothing waits forever behind an empty
batch. A job that could not fit even alone is refused at submit (Overloaded, naming its size
and the budget).

Work that helps a later request but no current one (computing a conversation's next prefix,
`EdgeEngine.ask(keep=True)`) is queued with `when_idle` and runs only when no request waits
or runs; at most `MAX_IDLE` such tasks are held, the oldest dropped first.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from typing import Callable, Iterator

from kvedge.common.errors import Cancelled, DeadlineExceeded, KvedgeError, Overloaded

log = logging.getLogger("kvedge.scheduler")
_END = object()
MAX_IDLE = 8  # idle tasks held; a newer one pushes out the oldest


class Job:
    """One answer as the scheduler runs it. A subclass says how it starts and what each token
    means; the base class is the plumbing between the scheduler thread and the caller's:

    - `start(rt)`, on the scheduler thread: plan and run the prompt; returns the
      `kvedge.common.model.decoding.Decoding` holding the first token;
    - `on_token(token)`, on the scheduler thread, for every token in order: `put` what the
      caller should see; True when the answer is complete (a stop token or string);
    - `finish()`, on the scheduler thread, once, when it is complete or out of tokens.

    The caller iterates `events()`; leaving it early cancels the job. `deadline` is a
    `time.monotonic()` time; `alive()` says whether the client is still there.
    """

    kv_bytes = 0  # what its cache holds at most (admission by KV memory; 0: not counted)

    def __init__(self, deadline: float | None = None, alive: Callable[[], bool] | None = None):
        self.deadline, self.alive = deadline, alive or (lambda: True)
        self.decoding = None
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._cancelled = threading.Event()

    def start(self, rt):
        raise NotImplementedError

    def on_token(self, token: int) -> bool:
        raise NotImplementedError

    def finish(self) -> None:
        raise NotImplementedError

    def put(self, event) -> None:
        self._outbox.put(event)

    def cancel(self) -> None:
        self._cancelled.set()

    def close(self, error: BaseException | None = None) -> None:
        """The end of the caller's stream: after `error` (raised there) or after `finish`."""
        self._outbox.put(_END if error is None else error)

    def why_dropped(self, now: float) -> KvedgeError | None:
        if self.deadline is not None and now > self.deadline:
            return DeadlineExceeded("the request's deadline passed before its answer was "
                                    "complete; ask with a longer timeout or a smaller "
                                    "max_new_tokens, or when the edge is less busy")
        if self._cancelled.is_set() or not self.alive():
            return Cancelled("the request was cancelled")
        return None

    def events(self) -> Iterator:
        """What `on_token` and `finish` put, as they put it; raises the job's error."""
        try:
            while (item := self._outbox.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.cancel()  # a caller that stops reading stops the work


class Scheduler:
    """Owns the runtime: runs `Job`s, up to `max_batch` decoding together, `max_waiting` queued.
    `graph_decode`: step a lone answer in a `StaticDecode` (a CUDA graph on CUDA, eager on the
    CPU); None: on where `rt` is on CUDA. `graph_steps` counts the steps run that way (they
    count in `steps` and `rows` too). `max_stall`: stall-free starts (the module's), the
    running answers stepped inside a start once they have waited that many seconds;
    `inner_steps` counts those steps."""

    def __init__(self, rt, max_batch: int = 16, max_waiting: int = 64,
                 max_starts: int | None = None, invariant: bool = True,
                 spec_rows: int | None = None, kv_budget: int | None = None,
                 graph_decode: bool | None = None, max_stall: float | None = None):
        if max_batch < 1 or max_waiting < 0 or (max_starts is not None and max_starts < 1):
            raise ValueError("need max_batch ≥ 1, max_waiting ≥ 0 and max_starts ≥ 1")
        if max_stall is not None and max_stall < 0:
            raise ValueError("max_stall must be ≥ 0 seconds (None: off)")
        if kv_budget is not None and kv_budget < 1:
            raise ValueError("kv_budget must be positive (None: no limit)")
        self.rt, self.max_batch, self.max_waiting = rt, max_batch, max_waiting
        self.kv_budget = kv_budget  # bytes the running jobs' caches may hold together
        self.max_starts = max_starts or max_batch  # starts between two decode steps
        self.invariant = invariant  # steps padded so no answer depends on its neighbours
        # rows a step may fill with drafts (0: no speculation; None: the default for the
        # runtime's decode weights, batch.spec_rows_for)
        self.spec_rows = spec_rows
        # a lone answer stepped in fixed buffers, replayed as a CUDA graph there (None: on
        # where the model is on CUDA; True on the CPU steps it eagerly, as the tests do)
        self.graph_decode = rt.device.type == "cuda" if graph_decode is None else graph_decode
        self._lone: tuple[Job, object] | None = None  # that answer's job and its StaticDecode
        self._waiting: deque[Job] = deque()
        self._running: list[Job] = []
        self._starting: Job | None = None  # between the queue and the batch: its prefill
        self._idle: deque[Callable] = deque(maxlen=MAX_IDLE)  # run when nothing else is
        self._idle_running = False
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.steps = self.rows = 0  # decode steps run, and requests stepped over all of them
        self.graph_steps = 0  # of those steps, a lone answer's static ones (graph decode)
        # stall-free starts: the running answers are stepped between a start's layers once
        # they have waited this long (seconds; None: off)
        self.max_stall = max_stall
        self.stepped_at = time.monotonic()  # when the last decode step ended
        self.inner_steps = 0  # of the steps, those run inside a start (max_stall)

    @property
    def waiting(self) -> int:
        """Requests accepted and not yet started: the queue depth."""
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Requests decoding in the batch."""
        return len(self._running)

    @property
    def in_flight(self) -> int:
        """Requests held: waiting, starting (planning and prefilling) or decoding."""
        return self.waiting + self.running + (self._starting is not None)

    @property
    def kv_reserved(self) -> int:
        """Bytes the running jobs' caches (and the one starting) hold at most."""
        held = [*self._running, *([self._starting] if self._starting is not None else [])]
        return sum(job.kv_bytes for job in held)

    @property
    def capacity(self) -> int:
        """Requests this scheduler holds at most (not counting the one starting)."""
        return self.max_batch + self.max_waiting

    def submit(self, job: Job) -> Job:
        """Queue `job` (Overloaded when the queue is full); the scheduler thread starts on
        the first submit."""
        with self._wake:
            if self._closed:
                raise Cancelled("the service is stopping; ask another edge or retry later")
            if self.kv_budget is not None and job.kv_bytes > self.kv_budget:
                raise Overloaded(f"this request's KV cache would take {_mb(job.kv_bytes)}, "
                                 f"more than the edge's KV budget of {_mb(self.kv_budget)}; "
                                 "ask with fewer segments (top_k), a shorter conversation or "
                                 "a smaller max_new_tokens, or raise the edge's --kv-budget")
            if len(self._waiting) >= self.max_waiting:
                self._drop_gone(self._waiting)  # a client that left gives its place up now
            if len(self._waiting) >= self.max_waiting:
                raise Overloaded(f"the edge is answering {len(self._running)} questions with "
                                 f"{len(self._waiting)} waiting, its limit; retry later "
                                 "(with backoff) or ask another edge")
            self._waiting.append(job)
            self._ensure_thread()
            self._wake.notify()
        return job

    def _ensure_thread(self) -> None:
        """The scheduler thread starts on the first submit (under the lock)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
            self._thread.start()

    def when_idle(self, task: Callable) -> None:
        """Run `task(rt)` on the scheduler thread once no request waits or runs (dropped if
        the scheduler closes first, or pushed out by MAX_IDLE newer ones)."""
        with self._wake:
            if self._closed:
                return
            self._idle.append(task)
            self._ensure_thread()
            self._wake.notify()

    def settle(self, timeout: float = 60.0) -> bool:
        """Wait until nothing is held — no request, no idle task queued or running (a user's
        pause between turns, in tests and the benchmark); False if `timeout` passed first."""
        deadline = time.monotonic() + timeout
        while self.in_flight or self._idle or self._idle_running:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Refuse new jobs, cancel the ones held, and stop the thread."""
        with self._wake:
            self._closed = True
            for job in [*self._waiting, *self._running]:
                job.cancel()
            self._idle.clear()
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ the scheduler thread

    def _loop(self) -> None:
        while self._wait_for_work():
            for _ in range(self.max_starts):
                if (job := self._next_start()) is None:
                    break
                if self._lone is not None:  # its static copy goes before the start's KV comes
                    self._end_lone()
                self._start(job)
            if self._lone is not None and self._running != [self._lone[0]]:
                self._end_lone()
            if self._running:
                self._step()
            elif task := self._next_idle():
                self._run_idle(task)
        self._lone = None  # closed: its buffers (and graph) go with it

    def _wait_for_work(self) -> bool:
        """Block until a job or an idle task is held; False once closed and every job has
        left."""
        with self._wake:
            while not (self._waiting or self._running or self._idle or self._closed):
                self._wake.wait()
            self._drop_gone()
            return not self._closed or bool(self._waiting or self._running)

    def _next_idle(self) -> Callable | None:
        """The oldest idle task if no request waits or runs, marked running under the lock
        (so `settle` never sees it neither queued nor running)."""
        with self._wake:
            if self._waiting or self._running or not self._idle:
                return None
            self._idle_running = True
            return self._idle.popleft()

    def _run_idle(self, task: Callable) -> None:
        try:
            task(self.rt)
        except Exception:  # noqa: BLE001 - it served no request; the next one will do it
            log.exception("idle task failed")
        finally:
            self._idle_running = False

    def _next_start(self) -> Job | None:
        """The next waiting job, if the batch has room for it — a place, and its KV within
        the budget beside the running ones' (one alone always fits)."""
        with self._wake:
            self._drop_gone(self._waiting)
            if not self._waiting or len(self._running) >= self.max_batch:
                return None
            if (self.kv_budget is not None and self._running and
                    self.kv_reserved + self._waiting[0].kv_bytes > self.kv_budget):
                return None  # it waits for an answer to end and give its KV back
            self._starting = self._waiting.popleft()
            return self._starting

    def _drop_gone(self, *held) -> None:
        """Every cancelled or expired job leaves (of `held`, default all), with its error
        (under the lock)."""
        now = time.monotonic()
        for jobs in held or (self._waiting, self._running):
            for job in list(jobs):
                error = job.why_dropped(now)
                if error is not None:
                    jobs.remove(job)
                    job.close(error)

    def _start(self, job: Job) -> None:
        if self.max_stall is not None:
            self.rt.between_layers = self._between_layers
        try:
            job.decoding = job.start(self.rt)
            if not self._emit(job):
                with self._wake:
                    self._running.append(job)
        except Exception as err:  # noqa: BLE001 - the caller gets it; the others go on
            job.close(err)
        finally:
            self.rt.between_layers = None
            self._starting = None

    def _between_layers(self) -> None:
        """Between two layers of a start's forward: one batched step of the running answers
        (what is cancelled or past its deadline dropped first) if they have waited
        `max_stall` since their last; the start's own forward goes on untouched. Raises
        nothing: a broken step fails the answers in it, not the start. A forward another
        thread runs over the same runtime meanwhile (the bench's phase timing) steps nothing."""
        if (not self._running or threading.current_thread() is not self._thread
                or time.monotonic() - self.stepped_at < self.max_stall):
            return
        with self._wake:
            self._drop_gone(self._running)
        if not self._running:
            return
        self.rt.between_layers = None  # the step's own work is not interleaved again
        try:
            self.inner_steps += 1
            self._step(lone=False)
        finally:
            self.rt.between_layers = self._between_layers

    def _step(self, lone: bool = True) -> None:
        """One decode step of every running answer (a lone answer's static one where
        `lone` and graph decode allow)."""
        try:
            self._step_once(lone)
        finally:
            self.stepped_at = time.monotonic()

    def _step_once(self, lone: bool) -> None:
        from kvedge.common.model.batch import decode_step, row_multiple, spec_rows_for

        jobs = list(self._running)
        self.steps, self.rows = self.steps + 1, self.rows + len(jobs)
        if lone and self.graph_decode and len(jobs) == 1 and self._static_fits(jobs[0]):
            self._lone_step(jobs[0])
            return
        try:
            decode_step(self.rt, [job.decoding for job in jobs],
                        row_multiple(self.rt, self.invariant),
                        spec_rows_for(self.rt) if self.spec_rows is None else self.spec_rows)
        except Exception as err:  # noqa: BLE001 - a broken step fails the requests in it
            log.exception("batched decode step failed")
            self._end(jobs, err)
            return
        self._end([job for job in jobs if self._emit(job)])

    def _static_fits(self, job: Job) -> bool:
        """Whether a lone answer's static copy fits the KV budget beside its own cache: the
        copy holds what the cache holds at most (`kv_bytes`: the prompt and the decode
        budget), so the two take twice that while the run lives. A new start never meets
        the copy (it is handed back first), so `kv_reserved` need not count it."""
        return self.kv_budget is None or 2 * job.kv_bytes <= self.kv_budget

    def _lone_step(self, job: Job) -> None:
        """One step of the only running answer in its `StaticDecode` (made at its first lone
        step; captured as a CUDA graph on CUDA): no drafts, one token. A failure fails the
        answer as a broken batched step does; the run goes once the answer ends."""
        try:
            self._lone_run(job).advance()
        except Exception as err:  # noqa: BLE001 - a broken step fails the request in it
            log.exception("graph decode step failed")
            self._lone = None
            self._end([job], err)
            return
        self.graph_steps += 1
        if self._emit(job):
            self._lone = None
            self._end([job])

    def _lone_run(self, job: Job):
        """The lone answer's StaticDecode, made for it at its first lone step (its cache
        copied once into fixed buffers; it raises the CacheError `decode_step` would for a
        position inside the cache's context)."""
        from kvedge.common.model.static_decode import StaticDecode

        if self._lone is None:
            run = StaticDecode(self.rt, job.decoding)
            if self.rt.device.type == "cuda":
                run.graph()
            self._lone = job, run
        return self._lone[1]

    def _end_lone(self) -> None:
        """The lone answer is not alone any more: a second joined, so its static run is
        handed back to its own cache and the batched step continues it — or it left
        (cancelled, past its deadline), so the run is dropped. A failed hand-back fails the
        answer as a broken step does."""
        (job, run), self._lone = self._lone, None
        if job not in self._running:
            return
        try:
            run.hand_back()
        except Exception as err:  # noqa: BLE001 - the caller gets it; the others go on
            log.exception("handing a graph-decoded answer back to its cache failed")
            self._end([job], err)

    def _emit(self, job: Job) -> bool:
        """Hand the job the tokens its last forward picked, in order; True (and the job
        closed) once it is complete."""
        try:
            decoding = job.decoding
            done = any(job.on_token(token) for token in decoding.fresh) or decoding.finished
            if done:
                job.finish()
                job.close()
            return done
        except Exception as err:  # noqa: BLE001 - the caller gets it
            job.close(err)
            return True

    def _end(self, jobs: list[Job], error: BaseException | None = None) -> None:
        with self._wake:
            for job in jobs:
                if job in self._running:
                    self._running.remove(job)
                if error is not None:
                    job.close(error)


def _mb(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"
