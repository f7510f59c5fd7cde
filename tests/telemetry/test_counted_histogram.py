"""`CountedHistogram.observe_n` against ``n`` plain observations of the same value."""

import pytest
from prometheus_client import CollectorRegistry, Histogram

from spyglass.telemetry.counted_histogram import CountedHistogram

BUCKETS = (0.001, 0.01, 0.1)


def _samples(histogram_type, observe) -> dict:
    registry = CollectorRegistry()
    histogram = histogram_type(
        "latency", "A latency.", ["engine"], buckets=BUCKETS, registry=registry
    )
    observe(histogram.labels("e0"))
    return {
        (s.name, tuple(s.labels.items())): s.value for f in registry.collect() for s in f.samples
    }


# Below the first bound, on a bound (it belongs to that bucket), between bounds, past the last.
@pytest.mark.parametrize("amount", [0.0, 0.0005, 0.001, 0.005, 0.1, 0.25])
@pytest.mark.parametrize("n", [1, 3])
def test_observe_n_counts_as_n_observations_of_one_value(amount, n):
    def plain(child):
        for _ in range(n):
            child.observe(amount)
        child.observe(0.05)  # and a second value, once

    def counted(child):
        child.observe_n(amount, n)
        child.observe_n(0.05, 1)

    expected = _samples(Histogram, plain)
    actual = _samples(CountedHistogram, counted)
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        assert actual[key] == pytest.approx(value), key
