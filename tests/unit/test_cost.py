"""The tally of a workflow's cost (sasflow.cost): its stored forms, its prices, and the ledger that carries it."""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Iterator

import pytest

import sasflow.cost
from sasflow import prices
from sasflow.cost import NOBODY, Ledger, Tally, _body_size, carried, metered, sqs_records


class Timer:
    """Seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float) -> dict[str, object]:
        self.now += seconds
        return {}


@contextlib.contextmanager
def book_of(book: Ledger) -> Iterator[None]:
    """Make ``book`` this thread's ledger (what `metered` and the hooks use) for the block."""
    sasflow.cost._LOCAL.ledgers = {"": book}
    try:
        yield
    finally:
        sasflow.cost.forget_ledgers()


def test_the_stored_tally_takes_45_bytes_whatever_its_values_and_reads_back() -> None:
    # A write's size must not depend on how long an invocation took (each KB is billed)
    small = Tally(wru=1)
    large = Tally(wru=123_456, rru=7.5, sqs=3.25, mb_ms=98_765_432.0, log_bytes=12_345, api=2, events=1)
    assert len(small.pack()) == len(large.pack()) == 45
    back = Tally.unpack(large.pack())
    assert back.wru == 123_456 and back.rru == 7.5 and back.sqs == 3.25 and back.events == 1
    assert back.mb_ms == pytest.approx(98_765_432.0, rel=1e-6)  # float32
    # an item without a tally, or with one of another version, has none
    assert Tally.unpack(None) == Tally() and Tally.unpack(b"\x02" + large.pack()[1:]) == Tally()


def test_a_message_attribute_carries_a_tally_and_refuses_what_is_not_one() -> None:
    tally = Tally(wru=2, sqs=0.125, invocations=0.25, mb_ms=1234.5)
    assert tally.attribute() == "2,,0.125,,,,0.25,1234.5"
    assert Tally.from_attribute(tally.attribute()) == tally
    for bad in ("x,1", "1,-2", "inf", ",".join(["1"] * 12)):
        assert Tally.from_attribute(bad) == Tally()
    record = {"messageAttributes": {"sasflow-cost": {"stringValue": "3", "dataType": "String"}}}
    assert carried(record) == Tally(wru=3) and carried({}) == Tally()


def test_a_tally_is_priced_line_by_line_with_the_price_list() -> None:
    tally = Tally(wru=12, rru=4.5, sqs=6, invocations=2, mb_ms=1024 * 1000, log_bytes=1000, api=1, events=1)
    lines = {line.name: line.dollars for line in tally.lines()}
    assert lines["DynamoDB writes"] == pytest.approx(12 * prices.DYNAMODB_PER_WRU)
    assert lines["DynamoDB reads"] == pytest.approx(4.5 * prices.DYNAMODB_PER_RRU)
    assert lines["SQS"] == pytest.approx(6 * prices.SQS_PER_REQUEST)
    assert lines["Lambda requests"] == pytest.approx(2 * prices.LAMBDA_PER_REQUEST)
    assert lines["Lambda compute"] == pytest.approx(1 * prices.LAMBDA_PER_GB_SECOND)  # 1 GB for 1 s
    assert lines["CloudWatch Logs"] == pytest.approx(1000 * prices.CLOUDWATCH_LOGS_PER_BYTE)
    assert lines["API Gateway"] == pytest.approx(prices.HTTP_API_PER_REQUEST)
    assert lines["EventBridge"] == pytest.approx(prices.EVENTBRIDGE_PER_EVENT)
    assert tally.dollars() == pytest.approx(sum(lines.values()))


def test_an_invocation_charges_each_stretch_to_the_workflow_that_takes_it_and_the_rest_to_the_next() -> None:
    timer = Timer()
    book = Ledger(timer)
    with book.invocation(512):
        book.charge(None, Tally(invocations=1, api=1))  # the request, no workflow's yet
        timer.now += 0.010
        first = book.take("wf-1")  # the start's write: the request and the first 10 ms
        timer.now += 0.004
        book.charge("wf-1", Tally(sqs=0.5))  # its message, sent after the write
        carried_by_message = book.take("wf-1")
        timer.now += 0.0025  # the response: nobody's
    assert first == Tally(invocations=1, api=1, mb_ms=pytest.approx(10 * 512))
    assert carried_by_message.sqs == 0.5 and carried_by_message.mb_ms == pytest.approx(4 * 512)
    # the last 2.5 ms and the rounding of 16.5 ms up to 17 are the next workflow's
    with book.invocation(512):
        rest = book.take("wf-2")
    assert rest.mb_ms == pytest.approx((2.5 + 0.5) * 512)


def test_a_record_of_a_batch_gets_its_own_time_and_what_the_batch_spent_before_it() -> None:
    timer = Timer()
    book = Ledger(timer)
    with book.invocation(1024):
        timer.now += 0.001  # set-up: the first record's
        with book.working_on("wf-a"):
            timer.now += 0.100
            book.log(200)
        with book.working_on("wf-b"):
            timer.now += 0.050
        a, b = book.take("wf-a"), book.take("wf-b")
    assert a.mb_ms == pytest.approx(101 * 1024) and a.log_bytes == 200
    assert b.mb_ms == pytest.approx(50 * 1024) and b.log_bytes == 0


def test_what_a_function_of_no_workflow_leaves_unattributed_is_dropped_and_a_lost_write_gives_back() -> None:
    timer = Timer()
    book = Ledger(timer)
    with book.invocation(256, carry=False):  # a sweep that found nothing
        book.charge(None, Tally(rru=10))
        timer.now += 0.02
    with book.invocation(256):
        owed = book.take("wf-1")
        book.give_back("wf-1", owed)  # the conditional write failed: billed, carried by the next
        assert book.take("wf-1") == owed
    assert owed.rru == 0 and owed.mb_ms == 0


def test_a_batch_shares_its_invocation_receive_and_delete_among_its_records() -> None:
    records = [
        {"body": '{"workflow_id": "wf-1"}', "messageAttributes": {"sasflow-cost": {"stringValue": "2"}}},
        {"body": "x" * 70_000},  # two 64 KB chunks for the receive, with the first
        {"body": '{"workflow_id": "wf-3"}'},
    ]
    shares = sqs_records(lambda r: r["body"][17:21] if r["body"].startswith('{"w') else None, delivered=True)
    charged = shares({"Records": records})
    assert [workflow for workflow, _ in charged] == ["wf-1", None, "wf-3"]
    # the receive (2 chunks) and the delete, and the invocation, shared by three; the delivery of each, its own
    assert charged[0][1] == Tally(wru=2, sqs=(2 + 1) / 3 + 1, invocations=pytest.approx(1 / 3))
    assert charged[1][1].sqs == pytest.approx(1 + 2)


def test_a_poison_message_is_no_workflows_cost_even_the_next_ones() -> None:
    # Found by the trial: a poison message's five receives were billed to the next workflow started
    timer = Timer()
    book = Ledger(timer)
    handler = metered(records=sqs_records(lambda record: None))(lambda event, context: timer.tick(0.05))
    with_memory = type("Context", (), {"memory_limit_in_mb": 256})()
    with book_of(book):
        for _ in range(5):  # a batch of only the poison message, received five times
            handler({"Records": [{"body": "not json"}]}, with_memory)
    # Then none of it waits for the next workflow of this sandbox
    with book_of(book), book.invocation(256):
        assert book.take("wf-next") == Tally()
    # And in a batch with a workflow's record, the poison record's share is dropped, the other's kept
    with book_of(book), book.invocation(256):
        book.charge(NOBODY, Tally(sqs=0.5, invocations=0.5))
        with book.working_on(None):
            timer.tick(0.01)
        book.charge("wf-1", Tally(sqs=0.5, invocations=0.5))
        assert book.take("wf-1") == Tally(sqs=0.5, invocations=0.5)


def test_the_bytes_of_an_s3_write_are_counted_when_botocore_wraps_them_in_a_file() -> None:
    body = io.BytesIO(b"x" * 40_000)
    body.seek(123)
    assert _body_size(body) == 40_000 and body.tell() == 123  # its position is left where it was
    assert _body_size(b"abc") == 3 and _body_size(None) == 0


def test_records_worked_on_at_once_share_the_time_they_overlap_and_keep_their_own_calls() -> None:
    # Given an invocation whose two records run on two threads, steps sequenced by the test
    timer = Timer()
    book = Ledger(timer)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def record_a() -> None:
        with book.adopted(), sasflow.cost.ledger().working_on("wf-a"):
            a_in.set()
            b_in.wait(5)
            sasflow.cost.ledger().charge(None, Tally(wru=2))  # this thread's call: its record's workflow's
        a_out.set()

    def record_b() -> None:
        a_in.wait(5)
        timer.now += 0.010  # 10 ms of wf-a alone
        with book.adopted(), sasflow.cost.ledger().working_on("wf-b"):
            timer.now += 0.020  # 20 ms of both at once
            b_in.set()
            a_out.wait(5)
            timer.now += 0.010  # 10 ms of wf-b alone
            sasflow.cost.ledger().log(100)

    with book.invocation(1000):
        threads = [threading.Thread(target=record_a), threading.Thread(target=record_b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(5)
        a, b = book.take("wf-a"), book.take("wf-b")
    # Then each paid its time alone and half of the time they shared, at the function's memory, and its own calls
    assert a.mb_ms == pytest.approx((10 + 20 / 2) * 1000) and a.wru == 2 and a.log_bytes == 0
    assert b.mb_ms == pytest.approx((20 / 2 + 10) * 1000) and b.wru == 0 and b.log_bytes == 100
