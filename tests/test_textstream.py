"""StopText: streamed text cut at the first stop string, no piece of one ever returned."""
import pytest

from kvedge.common.model.textstream import StopText


def run(pieces, stops):
    cut = StopText(stops)
    out = []
    for piece in pieces:
        out.append(cut.push(piece))
        if cut.hit:
            break
    out.append(cut.flush())
    return "".join(out), cut


@pytest.mark.parametrize("pieces,stops,shown,hit", [
    (["Hello", " wor", "ld"], ["wor"], "Hello ", True),
    (["ab", "c", "d"], ["cd", "bx"], "ab", True),          # a stop string across pieces
    (["a", "b", "x", "y"], ["bz"], "abxy", False),         # held back, then released
    (["one\n", "\nTwo"], ["\n\n"], "one", True),
    (["xyz"], ["y", "x"], "", True),                        # the earliest stop wins
    (["plain"], [], "plain", False),
])
def test_text_is_cut_at_the_first_stop_string(pieces, stops, shown, hit):
    text, cut = run(pieces, stops)
    assert text == shown and cut.text == shown and cut.hit is hit


def test_a_possible_stop_start_is_held_until_decided():
    cut = StopText(["END"])
    assert cut.push("the E") == "the "
    assert cut.push("N") == ""
    assert cut.push("X") == "ENX"
    assert cut.push(" EN") == " "
    assert cut.push("D more") == "" and cut.hit and cut.text == "the ENX "
