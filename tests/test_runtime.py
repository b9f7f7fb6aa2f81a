"""The kernels' shared host helpers (`kernels._runtime`)."""

import triton

from kernels import _runtime


def test_cdiv_and_next_pow2_agree_with_triton():
    for a in list(range(0, 70)) + [2**31 - 1, 2**31, 2**40 + 3]:
        for b in (1, 2, 3, 16, 64, 1000):
            assert _runtime.cdiv(a, b) == triton.cdiv(a, b)
        assert _runtime.next_pow2(a) == triton.next_power_of_2(a)
