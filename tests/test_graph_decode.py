"""Graph decode (edge/scheduler.py): the only running answer is stepped in fixed buffers
(`StaticDecode`, replayed as a CUDA graph on CUDA; eagerly here, as `graph_decode=True` runs it
on the CPU). It answers what the batched step answers, hands its tokens back to its own cache
when a second answer joins (the batched step then continues it), and drops its run when it
leaves. Tiny random models over dense, ragged and gapped caches (test_batching.started)."""
from types import SimpleNamespace

import pytest
import torch

from conftest import TINY, tiny_runtime
from test_batching import REQUESTS, started, wait_until
from kvedge.common.errors import Cancelled
from kvedge.edge.scheduler import Job, Scheduler


class Answer(Job):
    """A started answer (`test_batching.started`) as the scheduler runs it: its tokens kept
    in `tokens`, `then(job)` called after each one (on the scheduler thread)."""

    def __init__(self, request, seed, then=None):
        super().__init__()
        self.request, self.seed, self.then = request, seed, then
        self.tokens: list[int] = []

    def start(self, rt):
        return started(rt, *self.request, self.seed)

    def on_token(self, token: int) -> bool:
        self.tokens.append(token)
        if self.then is not None:
            self.then(self)
        return False

    def finish(self) -> None:
        pass


def answered(rt, request, seed, graph_decode):
    """A lone answer through its own scheduler: (the job, the scheduler's counts)."""
    scheduler = Scheduler(rt, graph_decode=graph_decode)
    try:
        job = scheduler.submit(Answer(request, seed))
        list(job.events())
        return job, (scheduler.steps, scheduler.graph_steps, scheduler.rows)
    finally:
        scheduler.close()


@pytest.mark.parametrize("name", TINY)
def test_a_lone_answer_in_graph_decode_is_the_batched_steps_answer(name):
    rt = tiny_runtime(name)
    for seed, request in enumerate(REQUESTS):
        plain, plain_counts = answered(rt, request, seed, graph_decode=False)
        graphed, counts = answered(rt, request, seed, graph_decode=True)
        assert graphed.tokens == plain.tokens, (name, request)
        steps = len(plain.tokens) - 1  # the first token is the start's
        assert plain_counts == (steps, 0, steps) and counts == (steps, steps, steps)


def test_a_second_answer_joining_hands_the_first_back_to_the_batched_step():
    """The first answer (8 tokens) decodes alone for 2 steps; after its 3rd token a second
    (11 tokens) is submitted: the first's run is handed back and 5 batched steps of both
    follow; then the second, alone again, finishes in a static run of its own (5 steps).
    Each answers as it does alone in batched steps, and the first's cache covers every
    position it ran, the static ones included."""
    rt = tiny_runtime("tiny-mistral")
    first_request, second_request = ("ragged", 31), ("gapped", 14)  # 31 > the window of 24
    alone = [answered(rt, first_request, 3, graph_decode=False)[0],
             answered(rt, second_request, 2, graph_decode=False)[0]]
    scheduler = Scheduler(rt, graph_decode=True)
    second = Answer(second_request, 2)

    def joined(job):
        if len(job.tokens) == 3:
            scheduler.submit(second)

    try:
        first = scheduler.submit(Answer(first_request, 3, then=joined))
        list(first.events())
        list(second.events())
    finally:
        scheduler.close()
    assert [first.tokens, second.tokens] == [a.tokens for a in alone]
    assert (len(first.tokens), len(second.tokens)) == (8, 11)
    assert (scheduler.steps, scheduler.graph_steps, scheduler.rows) == (12, 7, 17)
    assert first.decoding.cache.extent == alone[0].decoding.cache.extent


def test_a_cancelled_lone_answer_drops_its_static_run():
    rt = tiny_runtime("tiny-llama")
    scheduler = Scheduler(rt, graph_decode=True)

    def leave(job):
        if len(job.tokens) == 3:
            job.cancel()

    try:
        job = scheduler.submit(Answer(("dense", 9), 0, then=leave))
        with pytest.raises(Cancelled):
            list(job.events())
        wait_until(lambda: scheduler._lone is None)
        assert (scheduler.running, scheduler.graph_steps) == (0, 2)
        # dropped, not handed back: the cache holds the prompt's 12 positions alone
        assert job.decoding.cache.extent.spans == [(0, 12)]
        again = scheduler.submit(Answer(("dense", 9), 0))  # the next lone answer runs its own
        list(again.events())
        assert again.tokens[:3] == job.tokens and len(again.tokens) == 8
    finally:
        scheduler.close()


def test_a_failed_static_step_fails_its_answer_and_the_next_one_is_answered(monkeypatch):
    from kvedge.common.model.static_decode import StaticDecode

    rt = tiny_runtime("tiny-qwen2")
    scheduler = Scheduler(rt, graph_decode=True)
    step = StaticDecode.step

    def fails(run):
        raise RuntimeError("out of memory")

    try:
        monkeypatch.setattr(StaticDecode, "step", fails)
        with pytest.raises(RuntimeError, match="out of memory"):
            list(scheduler.submit(Answer(("dense", 5), 4)).events())
        monkeypatch.setattr(StaticDecode, "step", step)
        job = scheduler.submit(Answer(("dense", 5), 4))
        list(job.events())
        assert job.tokens == answered(rt, ("dense", 5), 4, graph_decode=False)[0].tokens
        assert scheduler._lone is None and scheduler.running == 0
    finally:
        scheduler.close()


def test_graph_decode_is_on_by_default_on_cuda_alone():
    rt = tiny_runtime("tiny-llama")
    assert Scheduler(rt).graph_decode is False  # the CPU: the batched step is faster there
    assert answered(rt, ("dense", 9), 0, graph_decode=None)[1][1] == 0
    assert Scheduler(rt, graph_decode=True).graph_decode is True
    on_cuda = SimpleNamespace(device=torch.device("cuda"))
    assert Scheduler(on_cuda).graph_decode is True
    assert Scheduler(on_cuda, graph_decode=False).graph_decode is False


def test_the_lone_run_is_handed_back_before_a_second_answer_starts():
    """The static copy and a new start's KV never coexist: the second answer's start finds
    no lone run (the first's tokens already in its own cache)."""
    rt = tiny_runtime("tiny-llama")
    scheduler = Scheduler(rt, graph_decode=True)
    seen = {}

    class Second(Answer):
        def start(self, rt):
            seen["lone"] = scheduler._lone
            seen["first_held"] = first.decoding.cache.extent.end
            return super().start(rt)

    second = Second(("dense", 9), 1)

    def joined(job):
        if len(job.tokens) == 4:
            scheduler.submit(second)

    try:
        first = scheduler.submit(Answer(("dense", 9), 0, then=joined))
        list(first.events())
        list(second.events())
    finally:
        scheduler.close()
    assert seen["lone"] is None and scheduler.graph_steps > 0
    assert seen["first_held"] == 12 + 3  # the prompt and the 3 tokens stepped alone


def test_under_a_kv_budget_a_lone_answer_runs_static_only_where_its_copy_fits():
    rt = tiny_runtime("tiny-llama")
    plain = answered(rt, ("dense", 9), 0, graph_decode=False)[0]
    for budget, graphed in ((2_000, True), (1_999, False)):
        scheduler = Scheduler(rt, graph_decode=True, kv_budget=budget)
        try:
            job = Answer(("dense", 9), 0)
            job.kv_bytes = 1_000
            list(scheduler.submit(job).events())
        finally:
            scheduler.close()
        assert job.tokens == plain.tokens
        assert (scheduler.graph_steps > 0) is graphed, budget
