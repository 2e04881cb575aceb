"""bench/entropy_bound.py's ideal code lengths on codes whose entropy is known."""
import numpy as np

from kvedge.bench.entropy_bound import TABLE_BITS, order0_bits, order1_bits


def test_uniform_codes_cost_their_width_and_a_copied_row_costs_nothing_more():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, size=(4096, 64))
    assert abs(order0_bits(codes, 16) / codes.size - 4.0) < 0.01
    # every token repeats the one before it: given the previous code, nothing is left to say
    repeated = np.repeat(codes[:1], 4096, axis=0)
    assert (order1_bits(repeated, 16) - 256 * TABLE_BITS) / repeated.size < 0.01
    # a constant tensor: zero bits of payload, only the table
    assert order0_bits(np.zeros((10, 8), dtype=np.int64), 4) == 4 * TABLE_BITS
