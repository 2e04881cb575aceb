"""`CloudClient.wait_ready` ends on the ingest's outcome or on a stall, not on a wall clock:
a large KB whose segments keep arriving is waited for however long it takes."""
import itertools

import pytest

from kvedge.common.errors import BadInput, DeadlineExceeded, Stalled
from kvedge.common.net.cloud_client import CloudClient
from kvedge.common.net.proto import kvedge_pb2 as pb


def client_seeing(infos) -> CloudClient:
    """A client (its channel never used) whose GetKB answers come from `infos` in turn."""
    client = CloudClient("127.0.0.1:9", "token")
    answers = iter(infos)
    client.get_kb = lambda namespace, kb: next(answers)
    return client


def ingesting(done: int, total: int = 50) -> pb.KBInfo:
    return pb.KBInfo(kb="big", status="ingesting", segments_done=done, segments_total=total,
                     updated=float(done))


def test_progress_keeps_the_wait_going_past_the_stall_window():
    # each poll (0.3 s apart) brings a segment: 12 polls ≈ 3.6 s, ten times the stall window
    infos = [*(ingesting(i) for i in range(12)), pb.KBInfo(kb="big", status="ready")]
    with client_seeing(infos) as client:
        assert client.wait_ready("default", "big", stall=0.35).status == "ready"


def test_no_progress_is_a_named_stall_saying_where_it_stands():
    with client_seeing(itertools.repeat(ingesting(7))) as client:
        with pytest.raises(Stalled, match=r"no progress for 1 s .*7/50 segments"):
            client.wait_ready("default", "big", stall=1.0)


def test_a_failed_ingest_and_an_overall_timeout_are_named_errors():
    failed = pb.KBInfo(kb="big", status="failed", error="worker died")
    with client_seeing([failed]) as client:
        with pytest.raises(BadInput, match="worker died"):
            client.wait_ready("default", "big")
    with client_seeing(ingesting(i) for i in itertools.count()) as client:
        with pytest.raises(DeadlineExceeded, match="not ready after 1 s"):
            client.wait_ready("default", "big", timeout=1.0)
