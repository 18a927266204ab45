"""The load generator's rates count only the measured window: a request answered after it counts for its share
inside, so a run's drain (fewer clients left) is not credited to the window."""

from bench.load import LoadResult


def test_rates_count_straddling_requests_pro_rata() -> None:
    result = LoadResult(clients=2, seconds=10.0)
    result.answered = [(0.0, 4.0, 40), (4.0, 9.0, 50), (9.0, 13.0, 40)]  # the last is 1 s of 4 inside
    requests, tokens = result.in_window()
    assert requests == 2.25 and tokens == 100.0
    result.statuses = {200: 3}
    result.latencies = [4.0, 5.0, 4.0]
    summary = result.summary()
    assert summary["requests_per_s"] == 0.225 and summary["tokens_per_s"] == 10.0
