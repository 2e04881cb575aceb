"""The gateway's upload staging alone: resumable by offset, verified by sha256, no gRPC."""
import hashlib

import pytest

from kvedge.cloud.staging import Staging
from kvedge.common.errors import BadInput

DATA = b"paragraph one\n\nparagraph two\n" * 40
SHA = hashlib.sha256(DATA).hexdigest()


def test_a_file_resumes_from_what_is_held_and_counts_once_verified(tmp_path):
    staging = Staging(tmp_path)
    assert staging.offset("ns", SHA) == 0
    assert staging.write("ns", SHA, 0, DATA[:100], len(DATA)) is False
    assert Staging(tmp_path).offset("ns", SHA) == 100  # a restarted gateway resumes
    with pytest.raises(BadInput, match="offset 50, but 100 bytes are held"):
        staging.write("ns", SHA, 50, DATA[50:], len(DATA))
    assert staging.write("ns", SHA, 100, DATA[100:], len(DATA)) is True
    assert staging.offset("ns", SHA) is None and staging.read("ns", SHA) == DATA
    assert sorted(p.name for p in (tmp_path / "ns").iterdir()) == [SHA]


def test_bad_files_are_refused_and_not_kept(tmp_path):
    staging = Staging(tmp_path)
    with pytest.raises(BadInput, match="larger than its declared"):
        staging.write("ns", SHA, 0, DATA, len(DATA) - 1)
    wrong = DATA[:-1] + b"!"
    with pytest.raises(BadInput, match="does not match its sha256"):
        staging.write("ns", SHA, 0, wrong, len(DATA))
    assert staging.offset("ns", SHA) == 0 and list((tmp_path / "ns").iterdir()) == []
    with pytest.raises(BadInput, match="sha256"):
        staging.path("ns", "../../etc")
