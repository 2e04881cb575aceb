"""`common.model.attention.sdpa` on the CPU: one query over a short context runs on one
thread (ONE_THREAD_KEYS), the caller's thread count restored after, other threads untouched;
the results are the kernel's own at one thread."""
import threading

import torch
import torch.nn.functional as F

from kvedge.common.model import attention
from kvedge.common.model.attention import ONE_THREAD_KEYS, sdpa


def test_one_query_over_a_short_context_runs_on_one_thread(monkeypatch):
    seen = []
    kernel = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return kernel(*args, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        q, k = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 64, 8)
        out = sdpa(q, k, k, scale=0.3, enable_gqa=True)
        with attention.one_thread():  # the kernel's bits at one thread (two may split keys)
            assert torch.equal(out, kernel(q, k, k, scale=0.3, enable_gqa=True))
        sdpa(torch.randn(1, 4, 3, 8), k, k, enable_gqa=True)  # several queries: untouched
        long = torch.randn(1, 2, ONE_THREAD_KEYS + 1, 8)
        sdpa(q, long, long, enable_gqa=True)  # a long context: split as torch likes
        assert seen == [1, 2, 2] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def test_the_setting_is_this_threads_own():
    """OpenMP keeps the thread count per thread: a scheduler thread's one-thread section does
    not slow another thread's matmuls (what `one_thread` relies on)."""
    counts, inside, leave = [], threading.Event(), threading.Event()

    def hold():
        with attention.one_thread():
            inside.set()
            leave.wait(10)

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        worker = threading.Thread(target=hold)
        worker.start()
        inside.wait(10)
        counts.append(torch.get_num_threads())
        leave.set()
        worker.join()
        assert counts == [2]
    finally:
        torch.set_num_threads(threads)
