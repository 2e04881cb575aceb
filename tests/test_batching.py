"""Continuous batching (edge/scheduler.py, common/model/batch.py): answers batched equal answers asked
one at a time, token for token; the bounded queue, deadlines and cancellation, over real gRPC
on loopback. A tiny random model keeps it fast: answers are noise, compared exactly.

The KB is prefilled by the cloud's PrefillEngine and written by the edge's real Syncer
(bench.load.LocalCloud), once dense and once evicted to ragged packs.
"""
import threading
import time

import grpc
import pytest
import torch

from conftest import TINY, tiny_runtime
from kvedge.bench.load import sync_local_kb
from kvedge.cloud.workers import PrefillEngine
from kvedge.common.model.batch import decode_logits, decode_step
from kvedge.common.errors import CacheError, Cancelled, DeadlineExceeded
from kvedge.common.model.decoding import Decoding, Prompt, Sampler
from kvedge.common.model.models import load_model
from kvedge.common.net.proto import kvedge_pb2 as pb
from kvedge.common.net.proto import kvedge_pb2_grpc as pb_grpc
from kvedge.common.net.rpc import channel, metadata
from kvedge.edge.engine import ASK_PHASES, AskResult, EdgeEngine
from kvedge.edge.packcache import PackCache
from kvedge.edge.scheduler import Job
from kvedge.edge.server import serve
from kvedge.edge.sync import Target

MODEL = "tiny-llama"
DOCS = {f"{name}.md": f"# {name.title()}\n\nThe {name} code is {code}.\n\n{name.title()} has "
        f"a {thing} by the water.\n" for name, code, thing in [
            ("alpha", 1234567, "harbour"), ("beta", 7654321, "bridge"), ("gamma", 5550123, "mill"),
            ("delta", 9081726, "tower"), ("epsilon", 3141592, "market"), ("zeta", 2718281, "gate")]}
QUESTIONS = [f"What is the {name} code?" for name in
             ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "alpha bridge", "zeta mill")]


# ---------------------------------------------------------------- the batched step


def started(rt, kind, n_context, seed):
    """A request decoding over `n_context` cached tokens after a 3-token question: "dense",
    "ragged" (head h keeps every (h+1)-th position) or "gapped" (dense, with a hole of 12
    positions mid-context where a 1-token question sits and its answer goes: a token between
    held positions, which the general write path inserts)."""
    ids = torch.randint(0, 300, (n_context + 3,), generator=torch.Generator().manual_seed(seed))
    pre = rt.prefill(ids[:n_context])
    everything = torch.arange(n_context)
    if kind == "gapped":
        half = n_context // 2
        held = torch.cat([everything[:half], everything[half:] + 12])
        cache = rt.dense_cache(pre.keys, pre.values, held, reserve=8)
        return Decoding.start(rt, Prompt(cache, ids[n_context:][:1], torch.tensor([half])), 11)
    if kind == "ragged":
        keep = [[everything[::h + 1] for h in range(rt.n_kv)] for _ in range(rt.n_layers)]
        split = [[[x[h, kept] for h, kept in enumerate(k)] for x, k in zip(xs, keep)]
                 for xs in (pre.keys, pre.values)]
        cache = rt.ragged_cache(*split, keep, reserve=8, extent=everything)
    else:
        cache = rt.dense_cache(pre.keys, pre.values, everything, reserve=8)
    return Decoding.start(rt, Prompt(cache, ids[n_context:],
                                     torch.arange(n_context, n_context + 3)), 8)


# requests of different lengths and kinds, sharing steps (31 > tiny-mistral's window of 24)
REQUESTS = [("dense", 9), ("ragged", 23), ("gapped", 14), ("ragged", 31), ("dense", 5)]


@pytest.mark.parametrize("name", TINY)
def test_a_batched_step_equals_each_forward_alone(name):
    """Requests of different lengths, dense, ragged and gapped, in one step: each row equals
    Runtime.forward of that request alone, and equals exactly its own step alone."""
    rt = tiny_runtime(name)
    batch = [started(rt, kind, n, seed) for seed, (kind, n) in enumerate(REQUESTS)]
    ids = torch.tensor([s.token for s in batch])
    pos = torch.tensor([s.next_position() for s in batch])
    together = decode_logits(rt, ids, pos, batch)
    for i, (kind, n) in enumerate(REQUESTS):
        state = started(rt, kind, n, i)
        alone = decode_logits(rt, ids[i:i + 1], pos[i:i + 1], [state])[0]
        assert torch.equal(alone, together[i])  # no matter what else shares the step
        state = started(rt, kind, n, i)
        reference = rt.forward(ids[i:i + 1], pos[i:i + 1], state.cache, seq_len=state.seq_len)
        torch.testing.assert_close(together[i], reference.logits[-1], atol=1e-5, rtol=1e-4)
        state = started(rt, kind, n, i)  # unpadded, one request is exactly the forward
        unpadded = decode_logits(rt, ids[i:i + 1], pos[i:i + 1], [state], row_multiple=1)
        assert torch.equal(unpadded[0], reference.logits[-1])


def test_steps_in_a_batch_equal_steps_alone():
    """Ten steps, each cache growing past its reserve: every request picks the same tokens
    and ends with the same cache as when it is stepped alone."""
    rt = tiny_runtime("tiny-mistral")
    batch = [started(rt, kind, n, seed) for seed, (kind, n) in enumerate(REQUESTS)]
    together = [decode_step(rt, batch) for _ in range(10)]
    for i, (kind, n) in enumerate(REQUESTS):
        state = started(rt, kind, n, i)
        assert [decode_step(rt, [state])[0] for _ in range(10)] == [t[i] for t in together]
        assert same(cache_state(state), cache_state(batch[i]))


def cache_state(state):
    """Everything a step may change: each head group's K/V and positions, the extent, the
    request's position and token."""
    return ([[(g.keys.clone(), g.values.clone(), g.positions.clone()) for g in layer.heads()]
             for layer in state.cache], list(state.cache.extent.spans), state.position,
            state.token)


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mistral"])
def test_a_failed_step_leaves_every_cache_as_it_was(name, monkeypatch):
    rt = tiny_runtime(name)
    batch = [started(rt, kind, n, seed) for seed, (kind, n) in enumerate(REQUESTS)]
    before = [cache_state(s) for s in batch]
    calls, post_attention = [], rt.post_attention

    def fails_in_layer_2(*args):
        calls.append(None)
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        return post_attention(*args)

    monkeypatch.setattr(rt, "post_attention", fails_in_layer_2)
    with pytest.raises(RuntimeError, match="out of memory"):
        decode_step(rt, batch)
    assert same([cache_state(s) for s in batch], before)
    batch[1].position = 2  # its next token would land inside its context
    with pytest.raises(CacheError, match="inside the cache's context"):
        decode_step(rt, batch)
    batch[1].position = before[1][2]
    assert same([cache_state(s) for s in batch], before)


# ---------------------------------------------------------------- the engine and the daemon


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kb")
    for name, text in DOCS.items():
        (folder / name).write_text(text)
    state = tmp_path_factory.mktemp("edge")
    engine = PrefillEngine(MODEL)
    sync_local_kb(state, MODEL, folder, "facts", segment_tokens=48, engine=engine)
    sync_local_kb(state, MODEL, folder, "evicted", segment_tokens=48, engine=engine,
                  evict=("snapkv", 0.5))
    return state


@pytest.fixture(scope="module")
def loaded():
    return load_model(MODEL)


def make_engine(loaded, state, **limits) -> EdgeEngine:
    return EdgeEngine(loaded, PackCache(state / "packs", loaded.fingerprint), state, **limits)


@pytest.fixture(scope="module")
def engine(loaded, state):
    engine = make_engine(loaded, state)
    yield engine
    engine.close()


def concurrently(fn, items):
    """fn over items, each on its own thread, all released at once; results in order."""
    results, start = [None] * len(items), threading.Barrier(len(items))

    def run(i):
        start.wait()
        results[i] = fn(items[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def comparable(events):
    """An answer's pieces and its result without the timings and the draft counts (a lone
    answer drafts into the rows a batch of several fills with other answers)."""
    done = events[-1]
    assert isinstance(done, AskResult)
    return events[:-1], {k: v for k, v in vars(done).items()
                         if k not in ("ttft_s", "tpot_s", "phases", "draft_tokens",
                                      "accepted_tokens")}


def test_an_asks_phases_sum_to_its_time_to_first_token(engine):
    """AskResult.phases: retrieval, packs, the scheduler's queue and the model's part, each
    ≥ 0, adding up to ttft_s, alone and with asks beside it."""
    def ask(question):
        *_, done = engine.ask(Target("default", "facts"), question, max_new_tokens=4)
        return done

    for done in [ask(QUESTIONS[0]), *concurrently(ask, QUESTIONS)]:
        assert tuple(done.phases) == ASK_PHASES
        assert min(done.phases.values()) >= 0
        assert sum(done.phases.values()) == pytest.approx(done.ttft_s, abs=1e-6)
        assert done.phases["model_s"] > 0 and done.phases["retrieve_s"] > 0


@pytest.mark.parametrize("strategy,kb", [("a3", "facts"), ("recompute", "facts"),
                                         ("sparsex", "facts"), ("samkv", "facts"),
                                         ("a3", "evicted"), ("cacheblend", "evicted")])
def test_batched_answers_equal_one_at_a_time(engine, strategy, kb):
    def ask(question):
        return comparable(list(engine.ask(Target("default", kb), question, strategy=strategy,
                                          max_new_tokens=12)))

    alone = [ask(q) for q in QUESTIONS]
    steps, rows = engine.scheduler.steps, engine.scheduler.rows
    together = concurrently(ask, QUESTIONS)
    assert together == alone
    assert engine.scheduler.rows - rows > engine.scheduler.steps - steps  # steps were shared


def test_answers_match_without_batch_invariance(loaded, state):
    """Unpadded steps (`--no-batch-invariant`) may differ in the last bits of a logit, which
    greedy decoding of these answers does not feel."""
    engine = make_engine(loaded, state, batch_invariant=False)

    def ask(question):
        return comparable(list(engine.ask(Target("default", "facts"), question,
                                          max_new_tokens=12)))

    try:
        assert concurrently(ask, QUESTIONS) == [ask(q) for q in QUESTIONS]
    finally:
        engine.close()


def test_the_engine_says_whether_its_answers_are_batch_invariant(engine, monkeypatch):
    """What `kvedge serve` warns of and its metrics report: invariant where the load-time
    probe found a row padding that holds (a lone step then runs that many rows), not where
    none held (steps pad to ROW_MULTIPLE, nothing claimed), nor without --batch-invariant."""
    from kvedge.common.model.batch import ROW_MULTIPLE

    rt = engine.rt
    assert engine.step_rows == (rt.decode_row_multiple or ROW_MULTIPLE)
    assert engine.batch_invariant == (rt.decode_row_multiple is not None)
    probed = rt._multiples  # the probe's outcome, forced
    monkeypatch.setitem(probed, rt.decode_format, None)
    assert not engine.batch_invariant and engine.step_rows == ROW_MULTIPLE
    monkeypatch.setitem(probed, rt.decode_format, 2)
    assert engine.batch_invariant and engine.step_rows == 2
    monkeypatch.setattr(engine.scheduler, "invariant", False)
    assert not engine.batch_invariant and engine.step_rows == 1


def test_seeded_sampling_stays_per_request(engine):
    def ask(i):
        return comparable(list(engine.ask(Target("default", "facts"), QUESTIONS[i],
                                          max_new_tokens=12, sampler=Sampler(1.0, seed=i))))

    alone = [ask(i) for i in range(len(QUESTIONS))]
    assert concurrently(ask, list(range(len(QUESTIONS)))) == alone
    assert len({answer for _, answer in [(e, r["answer"]) for e, r in alone]}) > 1


def sized(engine) -> list[int]:
    """The KV bytes of every answer the engine's scheduler is given from here on."""
    seen, submit = [], engine.scheduler.submit
    engine.scheduler.submit = lambda job: seen.append(job.kv_bytes) or submit(job)
    return seen


def test_answers_wait_for_kv_memory_and_answer_the_same(loaded, state):
    """With room in the KV budget for one answer at a time, concurrent asks start one after
    another (every decode step has one row) and answer as they do alone."""
    def ask(engine, question):
        return comparable(list(engine.ask(Target("default", "facts"), question,
                                          max_new_tokens=12)))

    roomy = make_engine(loaded, state)
    seen = sized(roomy)
    try:
        alone = [ask(roomy, q) for q in QUESTIONS]
    finally:
        roomy.close()
    per_answer = max(seen)
    assert min(seen) > 0 and per_answer == roomy.kv_token_bytes * max(
        a["prompt_tokens"] + 12 for _, a in alone)
    tight = make_engine(loaded, state, kv_budget=per_answer * 3 // 2)
    try:
        together = concurrently(lambda q: ask(tight, q), QUESTIONS)
        assert together == alone
        assert tight.scheduler.rows == tight.scheduler.steps  # never two at once
        assert tight.scheduler.kv_reserved == 0
    finally:
        tight.close()


def test_the_default_kv_budget_is_half_the_free_memory_or_none(monkeypatch):
    import os

    from kvedge.edge.engine import default_kv_budget

    assert default_kv_budget("cpu") > 0
    monkeypatch.setattr(os, "sysconf", lambda name: (_ for _ in ()).throw(ValueError(name)))
    assert default_kv_budget("cpu") is None  # a system that does not say: no limit


def test_an_answer_larger_than_the_kv_budget_is_refused(loaded, state):
    from kvedge.common.errors import Overloaded

    engine = make_engine(loaded, state, kv_budget=4096)
    try:
        with pytest.raises(Overloaded, match="more than the edge's KV budget of 0 MiB"):
            list(engine.ask(Target("default", "facts"), QUESTIONS[0], max_new_tokens=12))
    finally:
        engine.close()


class Gate(Job):
    """Holds the scheduler thread in `start` until opened, as a long prefill would."""

    def __init__(self):
        super().__init__()
        self.entered, self.opened = threading.Event(), threading.Event()

    def start(self, rt):
        self.entered.set()
        assert self.opened.wait(30)
        raise RuntimeError("the gate never answers")


def closed_gate(engine) -> Gate:
    gate = engine.scheduler.submit(Gate())
    assert gate.entered.wait(10)
    return gate


def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class Probe(Job):
    """A start that runs a forward over 64 tokens of its own and counts the decode steps the
    scheduler took while it ran."""

    def __init__(self, scheduler):
        super().__init__()
        self.scheduler, self.inner = scheduler, None

    def start(self, rt):
        before = self.scheduler.steps
        ids = torch.randint(0, 300, (64,), generator=torch.Generator().manual_seed(0))
        rt.prefill(ids, logits="none")
        self.inner = self.scheduler.steps - before
        raise RuntimeError("the probe never answers")


@pytest.mark.parametrize("max_stall", [None, 0.0])
def test_stall_free_starts_step_the_running_answers_between_layers(loaded, state, max_stall):
    """A start waiting behind an answer that has just started: with `max_stall` 0 the answer
    takes a step after each of the start's layers (while it lasts), and answers as it does
    alone; off, it waits for the whole start."""
    engine = make_engine(loaded, state, max_stall=max_stall)

    def ask():
        return comparable(list(engine.ask(Target("default", "facts"), QUESTIONS[1],
                                          max_new_tokens=12)))

    try:
        alone = ask()
        assert alone[1]["tokens"] > engine.rt.n_layers  # still decoding through the start
        gate, together = closed_gate(engine), []
        asking = threading.Thread(target=lambda: together.append(ask()))
        asking.start()
        wait_until(lambda: engine.scheduler.waiting == 1)
        probe = engine.scheduler.submit(Probe(engine.scheduler))
        gate.opened.set()
        asking.join(60)
        with pytest.raises(RuntimeError, match="the probe never answers"):
            list(probe.events())
        assert together == [alone]
        if max_stall is None:
            assert probe.inner == engine.scheduler.inner_steps == 0
        else:
            assert probe.inner == engine.scheduler.inner_steps == engine.rt.n_layers
            assert engine.rt.between_layers is None  # set only while a start runs
    finally:
        engine.close()


@pytest.fixture(scope="module")
def edge(loaded, state):
    """A real edge daemon on loopback whose scheduler runs one answer and queues one more."""
    engine = make_engine(loaded, state, max_batch=1, max_queue=1)
    server, port = serve(engine, state, "127.0.0.1:0")
    ch = channel(f"127.0.0.1:{port}")
    stub = pb_grpc.EdgeStub(ch)
    token = (state / "edge.token").read_text().strip()

    def ask(question="What is the alpha code?", timeout=30, max_new_tokens=6):
        request = pb.AskRequest(kb="facts", question=question, max_new_tokens=max_new_tokens)
        return stub.Ask(request, metadata=metadata(token), timeout=timeout)

    yield engine, ask
    ch.close()
    server.stop(0)
    engine.close()


def test_a_full_queue_answers_resource_exhausted(edge):
    engine, ask = edge
    gate = closed_gate(engine)
    queued = ask()
    wait_until(lambda: engine.scheduler.waiting == 1)
    with pytest.raises(grpc.RpcError) as refused:
        list(ask())
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused.value.details().startswith("Overloaded: ")
    gate.opened.set()
    assert list(queued)[-1].done.tokens > 0  # the queued one is answered once there is room


def test_a_request_past_its_deadline_is_dropped(edge):
    engine, ask = edge
    gate = closed_gate(engine)
    late = ask(timeout=0.3)
    wait_until(lambda: engine.scheduler.waiting == 1)
    with pytest.raises(grpc.RpcError) as expired:
        list(late)
    assert expired.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    local = engine.ask(Target("default", "facts"), QUESTIONS[0],
                       deadline=time.monotonic() + 0.2)
    with pytest.raises(DeadlineExceeded):  # the engine's own report, without gRPC
        threading.Timer(0.4, gate.opened.set).start()
        list(local)
    wait_until(lambda: engine.scheduler.waiting == engine.scheduler.running == 0)


def test_a_cancelled_request_frees_its_slot(edge):
    engine, ask = edge
    gate = closed_gate(engine)
    cancelled = ask()
    wait_until(lambda: engine.scheduler.waiting == 1)
    cancelled.cancel()
    time.sleep(0.2)  # the server sees the cancellation
    replacement = ask()  # takes the cancelled one's place while the scheduler is still busy
    gate.opened.set()
    assert list(replacement)[-1].done.tokens > 0
    with pytest.raises(grpc.RpcError) as err:
        list(cancelled)
    assert err.value.code() == grpc.StatusCode.CANCELLED


def test_cancelling_mid_answer_stops_decoding(edge):
    engine, ask = edge
    call = ask(max_new_tokens=1000)
    next(call)  # the first piece: it is decoding now
    assert engine.scheduler.running == 1
    steps = engine.scheduler.steps
    call.cancel()
    wait_until(lambda: engine.scheduler.running == 0, 5)
    assert engine.scheduler.steps - steps < 100


def test_idle_tasks_wait_for_the_requests_and_settle_waits_for_them(edge):
    """A task queued with `when_idle` runs only once no request waits or runs (a
    conversation's next prefix never delays an answer); `settle` returns after it."""
    engine, ask = edge
    ran = []
    gate = closed_gate(engine)
    engine.scheduler.when_idle(lambda rt: ran.append(engine.scheduler.in_flight))
    time.sleep(0.2)
    assert ran == []  # the gate (a request starting) holds the thread
    gate.opened.set()
    assert engine.scheduler.settle(30) and ran == [0]


def test_a_closed_scheduler_refuses_work(loaded, state):
    engine = make_engine(loaded, state)
    engine.close()
    with pytest.raises(Cancelled):
        list(engine.ask(Target("default", "facts"), QUESTIONS[0]))


def test_load_rounds_count_answers_that_differ_from_one_client():
    """`kvctl bench load`'s table: a question answered otherwise than in the one-client round,
    or two ways within a round, counts once."""
    from kvedge.bench.load import Round, table

    one, many = Round(1, wall_s=2.0), Round(4, wall_s=2.0)
    one.add("q1", 0.5, 3, "a")
    one.add("q2", 0.6, 3, "b")
    for question, text in [("q1", "a"), ("q2", "B"), ("q1", "a")]:
        many.add(question, 0.8, 3, text)
    assert (one.differing(one), many.differing(one), many.answers, many.rate) == (0, 1, 3, 1.5)
    many.add("q1", 0.9, 3, "a, twice", tpot=0.05, gap=0.3)
    assert many.differing(one) == 2
    assert "| 4 | 4 | 0 | 2 | 3.0 | 2.0 | 2.00 | 2.00 |" in table([one, many])
    assert many.tpot(0.5) == 0.05 and many.gap(0.99) == 0.3
    assert table([one, many]).endswith("| 50 | 50 | 0.30 | 0.30 | 0 |")


def test_an_answers_longest_gap_is_its_longest_wait_between_pieces():
    from kvedge.bench.load import longest_gap

    assert longest_gap([0.5, 0.6, 1.4, 1.5]) == pytest.approx(0.8)
    assert longest_gap([0.5]) is None and longest_gap([]) is None


def test_the_start_bound_is_one_answer_per_mean_start():
    """One client: 4 answers in 8 s, starts of 0.5 s on average → were decoding free, one
    answer per 0.5 s: 4× its rate at most."""
    from kvedge.bench.load import Round, start_bound

    one = Round(1, wall_s=8.0)
    for ttft in (0.4, 0.6, 0.5, 0.5):
        one.add("q", ttft, 20, "a")
    assert start_bound(one) == pytest.approx(4.0)
    assert start_bound(Round(1)) == 0.0  # no answers: nothing to bound by


def test_load_conversations_run_with_and_without_session_kv(tmp_path):
    """`kvctl bench load --conversations`: each client's questions are turns of one chat
    through a real daemon's OpenAI API; the same rounds run with the edge keeping each
    conversation's KV and with `--session-bytes 0`, no answer lost either way, and only the
    first reuses earlier turns (the daemons decoding with fp16 weights, as `kvctl bench load
    --decode-weights fp16` runs them, and starting stall-free, as `--max-stall 0` does)."""
    from kvedge.apps.demo import DEMO_KB
    from kvedge.bench.load import questions_in, run_load

    rounds = run_load(MODEL, DEMO_KB, questions_in(DEMO_KB), clients=(1, 2), per_client=2,
                      echo=lambda *_: None, work=tmp_path, conversations=True,
                      max_new_tokens=3, decode_weights="fp16",  # the daemons take both
                      serve_args=("--max-stall", "0"))
    assert [r.label for r in rounds] == ["1, session KV", "2, session KV", "1, no session KV",
                                         "2, no session KV"]
    assert all(not r.lost and r.answers == 2 * r.clients for r in rounds)
    kept, cold = rounds[:2], rounds[2:]
    assert all(sum(r.reused) > 0 for r in kept) and all(sum(r.reused) == 0 for r in cold)
