"""A script with no mxprof calls: `mxprof run --sample 1000 tests/sampling/plain.py`."""

import time


def hot(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def cold(n):
    return sum(range(n))


if __name__ == "__main__":
    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:
        hot(20_000)
        cold(5_000)
