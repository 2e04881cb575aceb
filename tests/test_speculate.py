"""Prompt-lookup speculation (common/model/speculate.py, batch.decode_step's `spec_rows`): drafts
come from the first earlier occurrence of the longest matching n-gram; a step that runs drafts
picks exactly the tokens plain steps pick and leaves exactly their cache, whether the drafts are
all right, all wrong or partly right, alone or in a batch; sampled requests never draft; the
served path (scheduler) gives the same answers with drafts on and off, on the real model too.
"""
import pytest
import torch

from conftest import TINY, tiny_runtime
from test_batching import REQUESTS, cache_state, same, started
from kvedge.common.model.batch import ROW_MULTIPLE, SPEC_ROWS, decode_step
from kvedge.common.model.decoding import Decoding, Prompt, Sampler
from kvedge.common.model.generate import decode
from kvedge.common.model.speculate import PromptLookup


# ---------------------------------------------------------------- the drafter


def test_lookup_proposes_what_followed_the_first_occurrence_of_the_longest_suffix():
    lookup = PromptLookup([5, 6, 7, 8, 9, 1, 6, 7, 2, 3, 6, 7])
    # suffix (6, 7): first seen at 1..2, followed by 8, 9, 1, ...; (3, 6, 7) never seen before
    assert lookup.draft(3) == [8, 9, 1]
    lookup.push(2)  # suffix (6, 7, 2) was seen at 6..8: what followed it there
    assert lookup.draft(4) == [3, 6, 7, 2]
    assert lookup.draft(0) == []


def test_lookup_falls_back_to_shorter_ngrams_and_to_nothing():
    lookup = PromptLookup([1, 2, 3, 4])
    lookup.push(9)
    assert lookup.draft(2) == []          # 9 never seen
    lookup.push(3)                        # (9, 3) unseen, 3 seen: followed by 4, 9
    assert lookup.draft(5) == [4, 9, 3]   # a draft may run into the answer itself
    with pytest.raises(ValueError):
        PromptLookup([1], max_ngram=0)


# ---------------------------------------------------------------- exactness of a step


def plain(rt, kind, n, seed, steps):
    """(tokens, state) of `steps` padded plain steps (no drafts), the scheduler's default."""
    state = started(rt, kind, n, seed)
    tokens = [state.token]
    for _ in range(steps):
        tokens.append(decode_step(rt, [state])[0])
    return tokens, state


def drafting(rt, kind, n, seed, source):
    """A started request whose lookup holds `source` then its first token."""
    state = started(rt, kind, n, seed)
    state.lookup = PromptLookup([*source, state.token])
    return state


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("truth", ["right", "wrong", "half"])
def test_drafted_steps_pick_and_keep_what_plain_steps_do(name, truth):
    """Source = the plain answer (every draft right), noise (none right) or the plain answer
    with every third token changed: the picks, logits and the cache (K/V, positions, extent)
    equal plain stepping's, bit for bit, and right drafts save steps."""
    rt = tiny_runtime(name)
    for seed, (kind, n) in enumerate(REQUESTS):
        want, reference = plain(rt, kind, n, seed, 6)
        source = {"right": want, "wrong": [t + 1 for t in want],
                  "half": [t + 1 if i % 3 == 2 else t for i, t in enumerate(want)]}[truth]
        state = drafting(rt, kind, n, seed, source)  # the answer "seen earlier"
        got = [state.token]
        while len(got) < len(want):
            decode_step(rt, [state], ROW_MULTIPLE, SPEC_ROWS)
            got += state.fresh
        assert got[:len(want)] == want, (kind, n)
        if len(got) == len(want):  # stopped where plain stepping stopped: same cache
            assert same(cache_state(state), cache_state(reference)), (kind, n)
            assert torch.equal(state.logits, reference.logits)
        if truth == "right" and kind != "gapped":
            assert state.steps < 6 and state.accepted > 0


def test_a_batch_of_drafting_requests_equals_each_plain_alone():
    """Five requests with right drafts share steps (the rows dealt in turn): each one's
    tokens equal its plain steps alone."""
    rt = tiny_runtime("tiny-mistral")
    wants = [plain(rt, kind, n, seed, 10)[0] for seed, (kind, n) in enumerate(REQUESTS)]
    batch = [drafting(rt, kind, n, seed, want)
             for seed, ((kind, n), want) in enumerate(zip(REQUESTS, wants))]
    got = [[s.token] for s in batch]
    for _ in range(10):
        live = [s for s, g in zip(batch, got) if len(g) < 11]
        if not live:
            break
        decode_step(rt, live, ROW_MULTIPLE, 16)
        for s, g in zip(batch, got):
            if s in live:
                g += s.fresh
    assert [g[:11] for g in got] == wants
    assert sum(s.accepted for s in batch) > 0


def test_drafts_stop_at_max_new_tokens_and_at_a_stop_token():
    rt = tiny_runtime("tiny-llama")
    want, _ = plain(rt, "dense", 9, 0, 7)  # started() allows 8 tokens
    state = drafting(rt, "dense", 9, 0, want)
    while not state.finished:
        decode_step(rt, [state], ROW_MULTIPLE, SPEC_ROWS)
    assert state.picked == 8 and state.lookup.tokens[-8:] == want
    stop = want[3]
    state = drafting(rt, "dense", 9, 0, want)
    state.stop_ids = (stop,)
    tokens = [state.token]
    while not state.finished:
        decode_step(rt, [state], ROW_MULTIPLE, SPEC_ROWS)
        tokens += state.fresh
    assert tokens == want[:want.index(stop) + 1]


def test_sampled_requests_never_draft():
    rt = tiny_runtime("tiny-llama")
    ids = torch.randint(0, 300, (12,), generator=torch.Generator().manual_seed(3))
    state = Decoding.start(rt, Prompt(rt.empty_cache(), ids, torch.arange(12)), 6,
                           sampler=Sampler(temperature=0.7, seed=1), lookup=ids.tolist())
    assert state.lookup is None and state.draft(5) == []


def test_generate_with_lookup_gives_the_served_answer():
    """`decode(lookup=...)` steps as the scheduler does (padded rows, drafts): the answer
    equals plain padded steps', and a prompt that repeats itself gets drafts accepted."""
    rt = tiny_runtime("tiny-llama")
    ids = torch.randint(0, 300, (20,), generator=torch.Generator().manual_seed(4))
    prompt = lambda: Prompt(rt.empty_cache(), ids, torch.arange(20))  # noqa: E731
    with_drafts = list(decode(rt, prompt(), 12, lookup=ids.tolist()))
    state = Decoding.start(rt, prompt(), 12)
    plain_tokens = [state.token]
    while not state.finished:
        plain_tokens.append(decode_step(rt, [state])[0])
    assert with_drafts == plain_tokens


def test_real_model_answer_is_the_same_with_drafts_and_copies_from_the_prompt(smollm2,
                                                                               smollm2_rt):
    """SmolLM2 answering from a passage: drafts on, the greedy answer is the plain one token
    for token, in fewer steps (it copies names and dates from the passage)."""
    rt, tok = smollm2_rt, smollm2.tokenizer
    passage = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris. "
               "It is named after the engineer Gustave Eiffel, whose company designed and built "
               "the tower from 1887 to 1889 as the centrepiece of the 1889 World's Fair. ")
    ids = tok.apply_chat_template(
        [{"role": "user", "content": passage * 3 + "\nWho was the tower named after, and "
          "when was it built? Answer in one sentence."}], add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    prompt = lambda: Prompt(rt.empty_cache(), torch.tensor(ids), torch.arange(len(ids)))  # noqa
    state = Decoding.start(rt, prompt(), 40, stop_ids=(tok.eos_token_id,))
    plain_tokens = [state.token]
    while not state.finished:
        plain_tokens.append(decode_step(rt, [state])[0])
    state = Decoding.start(rt, prompt(), 40, stop_ids=(tok.eos_token_id,), lookup=ids)
    drafted = list(state.fresh)
    while not state.finished:
        decode_step(rt, [state], ROW_MULTIPLE, SPEC_ROWS)
        drafted += state.fresh
    assert drafted == plain_tokens
    assert "Gustave Eiffel" in tok.decode(drafted)
    assert state.steps < len(plain_tokens) - 1 - 5  # at least 5 steps saved
