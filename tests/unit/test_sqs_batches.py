"""SendMessageBatch grouping: 10 entries and 262,144 bytes in all per request."""

from __future__ import annotations

from sasflow.adapters.sqs_bus import batches


def test_ten_small_messages_per_batch() -> None:
    assert batches([100] * 23) == [list(range(10)), list(range(10, 20)), [20, 21, 22]]


def test_large_messages_are_split_so_no_batch_exceeds_262144_bytes() -> None:
    # six parallel steps with 200 KB inputs: one message per request
    assert batches([200_000] * 6) == [[0], [1], [2], [3], [4], [5]]
    # exactly 262,144 bytes in all fits; one byte more starts a new request
    assert batches([131_072, 131_072, 1]) == [[0, 1], [2]]
    assert batches([131_072, 131_073]) == [[0], [1]]
