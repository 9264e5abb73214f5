"""triggers.yaml is the one place a trigger is declared: each gets its schedule, queues, function, least-privilege
roles and alarms in template.yaml (as SAM translates it), and removing it removes all of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devstack.agents import AGENTS_FILE, TEMPLATE_FILE, load_agents, render_template
from devstack.sam import translate
from devstack.template import SqsEventSpec, Stack, TemplateError, load_template
from devstack.triggers import TriggersFileError, load_triggers, triggers_file

NIGHTLY = """\
triggers:
  nightly-report:
    kind: schedule
    definition: report
    version: 3
    expression: cron(0 2 * * ? *)
    timezone: Europe/Paris
    start_date: "2027-01-01T00:00:00Z"
    input:
      day.$: scheduled_time
"""


def rendered(tmp_path: Path, triggers_text: str | None) -> Path:
    """template.yaml rendered with the repository's agents and ``triggers_text`` as triggers.yaml."""
    declared = tmp_path / "triggers.yaml"
    if triggers_text is not None:
        declared.write_text(triggers_text)
    template = tmp_path / "template.yaml"
    template.write_text(render_template(TEMPLATE_FILE.read_text(), load_agents(), load_triggers(declared)))
    return template


def added_resources(
    tmp_path: Path, triggers_text: str, *prefixes: str
) -> tuple[dict[str, Any], set[str], dict[str, Any]]:
    """The resources (as SAM translates them) of template.yaml rendered with ``triggers_text``, the logical ids of
    the triggers' own (those starting with one of ``prefixes``), and the resources without any trigger; checks that
    the triggers add their own and change nothing else."""
    with_it = translate(load_template(rendered(tmp_path, triggers_text)))["Resources"]
    without = translate(load_template(rendered(tmp_path, "triggers: {}\n")))["Resources"]
    mine = {logical_id for logical_id in with_it if logical_id.startswith(prefixes)}
    assert set(with_it) - mine == set(without)
    return with_it, mine, without


def test_one_entry_gives_a_schedule_its_queues_function_roles_and_alarms_and_removing_it_removes_them(
    tmp_path: Path,
) -> None:
    with_it, mine, without = added_resources(tmp_path, NIGHTLY, "NightlyReport")
    assert mine == {
        "NightlyReportTriggerQueue",
        "NightlyReportTriggerDeadLetterQueue",
        "NightlyReportSchedule",
        "NightlyReportScheduleRole",
        "NightlyReportTriggerFunction",
        "NightlyReportTriggerFunctionRole",
        "NightlyReportTriggerOccurrences",
        "NightlyReportTriggerLogGroup",
        "NightlyReportTriggerFunctionErrorsAlarm",
        "NightlyReportTriggerFunctionThrottlesAlarm",
        "NightlyReportTriggerDeadLetterAlarm",
    }
    assert not any("NightlyReport" in json.dumps(resource) for resource in without.values())
    # the schedule: its time zone and start, no flexible window, retried, undeliverable ticks to the DLQ
    schedule = with_it["NightlyReportSchedule"]["Properties"]
    assert schedule["ScheduleExpression"] == "cron(0 2 * * ? *)"
    assert (schedule["ScheduleExpressionTimezone"], schedule["StartDate"]) == ("Europe/Paris", "2027-01-01T00:00:00Z")
    assert schedule["FlexibleTimeWindow"] == {"Mode": "OFF"}
    assert schedule["State"] == "ENABLED"  # not a sample: it ticks once deployed
    target = schedule["Target"]
    assert target["Arn"] == {"Fn::GetAtt": ["NightlyReportTriggerQueue", "Arn"]}
    assert json.loads(target["Input"]) == {"scheduled_time": "<aws.scheduler.scheduled-time>"}
    assert target["RetryPolicy"] == {"MaximumEventAgeInSeconds": 86400, "MaximumRetryAttempts": 185}
    assert target["DeadLetterConfig"] == {"Arn": {"Fn::GetAtt": ["NightlyReportTriggerDeadLetterQueue", "Arn"]}}
    # the scheduler's role: assumed by EventBridge Scheduler of this account only, sends to the two queues only
    role = with_it["NightlyReportScheduleRole"]["Properties"]
    [trust] = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "scheduler.amazonaws.com"}
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}
    [[send]] = [policy["PolicyDocument"]["Statement"] for policy in role["Policies"]]
    assert (send["Action"], send["Resource"]) == (
        "sqs:SendMessage",
        [
            {"Fn::GetAtt": ["NightlyReportTriggerQueue", "Arn"]},
            {"Fn::GetAtt": ["NightlyReportTriggerDeadLetterQueue", "Arn"]},
        ],
    )
    # the operators list and redrive its dead letters like every other
    redrive = with_it["DeadLetterRedrivePolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert {"Fn::GetAtt": ["NightlyReportTriggerDeadLetterQueue", "Arn"]} in redrive[0]["Resource"]
    assert {"Fn::GetAtt": ["NightlyReportTriggerQueue", "Arn"]} in redrive[1]["Resource"]


def test_the_trigger_function_reads_its_own_queue_and_starts_as_its_own_principal(tmp_path: Path) -> None:
    stack = Stack(
        load_template(rendered(tmp_path, NIGHTLY)),
        template_dir=TEMPLATE_FILE.parent,
        parameters={"DeploySampleServices": "false"},
    )
    function = stack.function("NightlyReportTriggerFunction")
    assert function.environment["TRIGGER_PRINCIPAL"] == "trigger:nightly-report"
    assert json.loads(function.environment["TRIGGER"]) == {
        "name": "nightly-report",
        "kind": "schedule",
        "definition": "report",
        "version": 3,
        "input": {"day.$": "scheduled_time"},
        "dead_letter_url": stack.physical_id("NightlyReportTriggerDeadLetterQueue"),
    }
    [mapping] = [event for event in function.events if isinstance(event, SqsEventSpec)]
    assert (mapping.queue_logical_id, mapping.report_batch_item_failures) == ("NightlyReportTriggerQueue", True)
    assert "NightlyReportTriggerDeadLetterQueue" in stack.function("OpsFunction").environment["DEAD_LETTER_QUEUES"]
    [schedule] = stack.scheduler_schedules()
    assert (schedule.queue_url, schedule.enabled) == (stack.physical_id("NightlyReportTriggerQueue"), True)


def test_a_sample_trigger_ticks_only_when_the_parameter_enables_it() -> None:
    def state(parameters: dict[str, str]) -> bool:
        stack = Stack.from_file(TEMPLATE_FILE, parameters={"DeploySampleServices": "false", **parameters})
        [schedule] = [s for s in stack.scheduler_schedules() if s.logical_id == "EveryMinuteTripSchedule"]
        return schedule.enabled

    assert state({}) is False  # a deployment does not book a trip a minute unless asked
    assert state({"SampleTriggersState": "ENABLED"}) is True


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("  x:\n    kind: schedule\n    definition: d\n    expression: rate(0 minutes)\n", "expression"),
        ("  x:\n    kind: schedule\n    definition: d\n    expression: every day\n", "expression"),
        ("  x:\n    kind: schedule\n    definition: d\n", "expression"),
        ("  X:\n    kind: schedule\n    definition: d\n    expression: rate(1 day)\n", "should match pattern"),
        ("  x:\n    kind: mqtt\n    definition: d\n    expression: rate(1 day)\n", "kind"),
        ("  x:\n    kind: schedule\n    definition: d\n    expression: rate(1 day)\n    colour: red\n", "colour"),
        (
            "  x:\n    kind: schedule\n    definition: d\n    expression: rate(1 day)\n    start_date: soon\n",
            "start_date",
        ),
    ],
)
def test_a_bad_entry_is_refused_with_the_trigger_and_the_reason(tmp_path: Path, entry: str, reason: str) -> None:
    declared = tmp_path / "triggers.yaml"
    declared.write_text("triggers:\n" + entry)
    with pytest.raises(TriggersFileError, match=reason) as refused:
        load_triggers(declared)
    assert "trigger" in str(refused.value)


def test_no_triggers_file_declares_none_and_the_repositorys_sits_beside_agents_yaml(tmp_path: Path) -> None:
    assert load_triggers(tmp_path / "triggers.yaml") == []
    assert triggers_file(AGENTS_FILE) == AGENTS_FILE.parent / "triggers.yaml"
    assert [t.name for t in load_triggers(triggers_file(AGENTS_FILE))] == [
        "every-minute-trip",
        "trip-requested",
        "trip-queue",
        "trip-uploads",
    ]


def test_make_up_names_each_schedule_and_whether_it_ticks_here() -> None:
    from types import SimpleNamespace

    from devstack.cli import trigger_lines

    stack = Stack.from_file(TEMPLATE_FILE, parameters={"DeploySampleServices": "false"})
    queue = "http://127.0.0.1:5000/123456789012/sasflow-TripQueueTriggerQueue"
    send = "sasflow-TripQueueTriggerQueue: each message starts a workflow of trip-queue: python -m devstack send "
    ids = {"TripQueueTriggerQueue": queue, "TripRequestsBucket": "5f2a-triprequestsbucket"}
    upload = (
        "5f2a-triprequestsbucket: each upload of requests/*.json starts a workflow of trip-uploads: python -m devstack "
        "upload --trigger trip-uploads --key requests/NAME.json"
    )
    quiet = SimpleNamespace(stack=stack, scheduler_schedules={}, physical_ids=ids, template_path=TEMPLATE_FILE)
    assert trigger_lines(quiet) == [
        "EveryMinuteTripSchedule: rate(1 minute) UTC, DISABLED (its State)",
        "TripRequestedRule: events on bus default, DISABLED (its State)",
        f"{send}--trigger trip-queue --body JSON",  # a queue trigger is never a sample: it reads what is sent
        upload,
    ]
    enabled = Stack.from_file(
        TEMPLATE_FILE, parameters={"DeploySampleServices": "false", "SampleTriggersState": "ENABLED"}
    )
    ticking = SimpleNamespace(
        stack=enabled,
        scheduler_schedules={"EveryMinuteTripSchedule": object()},
        physical_ids=ids,
        template_path=TEMPLATE_FILE,
    )
    assert trigger_lines(ticking) == [
        "EveryMinuteTripSchedule: rate(1 minute) UTC, ticks here",
        "TripRequestedRule: events on bus default matching "
        '{"source":["sasflow.demo"],"detail-type":["TripRequested"]}: '
        "python -m devstack emit --source ... --detail-type ... --detail JSON",
        f"{send}--trigger trip-queue --body JSON",
        upload,
    ]


@pytest.mark.parametrize(
    ("window", "seconds", "event_age"),
    [("all", None, 86_400), ("none", 0, 60), ("90s", 90, 90), ("15m", 900, 900), ("2d", 172_800, 86_400)],
)
def test_the_catch_up_window_reaches_the_function_and_bounds_the_schedulers_retries(
    tmp_path: Path, window: str, seconds: int | None, event_age: int
) -> None:
    template = rendered(tmp_path, NIGHTLY + f"    catch_up_window: {window}\n")
    resources = load_template(template)["Resources"]
    retry = resources["NightlyReportSchedule"]["Properties"]["Target"]["RetryPolicy"]
    assert retry["MaximumEventAgeInSeconds"] == event_age  # a tick later than the window would be missed anyway
    stack = Stack(
        load_template(template), template_dir=TEMPLATE_FILE.parent, parameters={"DeploySampleServices": "false"}
    )
    config = json.loads(stack.function("NightlyReportTriggerFunction").environment["TRIGGER"])
    assert config.get("catch_up_seconds") == seconds


@pytest.mark.parametrize("window", ["soon", "0s", "5w", "5d", "15"])
def test_a_catch_up_window_that_is_not_one_is_refused(tmp_path: Path, window: str) -> None:
    declared = tmp_path / "triggers.yaml"
    declared.write_text(NIGHTLY + f"    catch_up_window: {window}\n")
    with pytest.raises(TriggersFileError, match="catch_up_window"):
        load_triggers(declared)


def test_overlap_reaches_the_function_and_the_engine_may_give_a_slot_back_and_send_the_waiting_tick(
    tmp_path: Path,
) -> None:
    resources = translate(load_template(rendered(tmp_path, NIGHTLY + "    overlap: buffer_one\n")))["Resources"]
    stack = Stack(
        load_template(rendered(tmp_path, NIGHTLY + "    overlap: buffer_one\n")),
        template_dir=TEMPLATE_FILE.parent,
        parameters={"DeploySampleServices": "false"},
    )
    config = json.loads(stack.function("NightlyReportTriggerFunction").environment["TRIGGER"])
    assert (config["overlap"], config["queue_url"]) == ("buffer_one", stack.physical_id("NightlyReportTriggerQueue"))
    queue = {"Fn::GetAtt": ["NightlyReportTriggerQueue", "Arn"]}
    # the trigger sends a waiting tick whose message was lost to its own queue again, and to no other
    [own] = [p for p in resources["NightlyReportTriggerFunctionRole"]["Properties"]["Policies"]]
    [waiting] = [s for s in own["PolicyDocument"]["Statement"] if s.get("Sid") == "WaitingTick"]
    assert (waiting["Action"], waiting["Resource"]) == ("sqs:SendMessage", queue)
    # every engine function that can end a run gives its slot back (its own trigger's item only) and sends the tick
    slots = resources["TriggerSlotsPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert [s["Sid"] for s in slots] == ["TriggerSlots", "WaitingTicks"]
    assert slots[0]["Action"] == "dynamodb:UpdateItem"
    assert slots[0]["Condition"] == {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["TRIGGER#*"]}}
    assert slots[1]["Resource"] == [queue]
    for function in ("ApiFunction", "OpsFunction", "SchedulerFunction", "SupervisorFunction"):
        assert {"Ref": "TriggerSlotsPolicy"} in resources[f"{function}Role"]["Properties"]["ManagedPolicyArns"]
    # skip keeps nothing waiting: no queue to send to
    skip = translate(load_template(rendered(tmp_path, NIGHTLY + "    overlap: skip\n")))["Resources"]
    assert [s["Sid"] for s in skip["TriggerSlotsPolicy"]["Properties"]["PolicyDocument"]["Statement"]] == [
        "TriggerSlots"
    ]
    statements = skip["NightlyReportTriggerFunctionRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
    assert "WaitingTick" not in [s.get("Sid") for s in statements]


def test_an_overlap_that_is_not_one_is_refused(tmp_path: Path) -> None:
    declared = tmp_path / "triggers.yaml"
    declared.write_text(NIGHTLY + "    overlap: queue\n")
    with pytest.raises(TriggersFileError, match="overlap"):
        load_triggers(declared)


ORDERS = """\
triggers:
  order-placed:
    kind: event
    definition: fulfil
    bus: orders
    pattern:
      source: [shop.orders]
      detail-type: [OrderPlaced]
      detail:
        total: [{numeric: [">", 0]}]
    input:
      order.$: detail.order_id
"""


def test_an_event_trigger_gets_its_rule_bus_queue_policy_and_function_and_removing_it_removes_them(
    tmp_path: Path,
) -> None:
    with_it, mine, _ = added_resources(tmp_path, ORDERS, "OrderPlaced", "Orders")
    assert mine == {
        "OrdersEventBus",
        "OrderPlacedRule",
        "OrderPlacedTriggerQueuePolicy",
        "OrderPlacedTriggerQueue",
        "OrderPlacedTriggerDeadLetterQueue",
        "OrderPlacedTriggerFunction",
        "OrderPlacedTriggerFunctionRole",
        "OrderPlacedTriggerOccurrences",
        "OrderPlacedTriggerLogGroup",
        "OrderPlacedTriggerFunctionErrorsAlarm",
        "OrderPlacedTriggerFunctionThrottlesAlarm",
        "OrderPlacedTriggerDeadLetterAlarm",
    }
    assert with_it["OrdersEventBus"]["Properties"]["Name"] == {"Fn::Sub": "${AWS::StackName}-orders"}
    # the rule: its pattern on its bus, the queue as target (the event as it is), retried, then the DLQ
    rule = with_it["OrderPlacedRule"]["Properties"]
    assert rule["EventBusName"] == {"Ref": "OrdersEventBus"} and rule["State"] == "ENABLED"
    assert rule["EventPattern"] == {
        "source": ["shop.orders"],
        "detail-type": ["OrderPlaced"],
        "detail": {"total": [{"numeric": [">", 0]}]},
    }
    [target] = rule["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": ["OrderPlacedTriggerQueue", "Arn"]} and "Input" not in target
    assert target["RetryPolicy"] == {"MaximumEventAgeInSeconds": 86400, "MaximumRetryAttempts": 185}
    assert target["DeadLetterConfig"] == {"Arn": {"Fn::GetAtt": ["OrderPlacedTriggerDeadLetterQueue", "Arn"]}}
    # the queues take events from EventBridge for this rule only
    policy = with_it["OrderPlacedTriggerQueuePolicy"]["Properties"]
    assert policy["Queues"] == [{"Ref": "OrderPlacedTriggerQueue"}, {"Ref": "OrderPlacedTriggerDeadLetterQueue"}]
    [statement] = policy["PolicyDocument"]["Statement"]
    assert (statement["Principal"], statement["Action"]) == ({"Service": "events.amazonaws.com"}, "sqs:SendMessage")
    assert statement["Condition"] == {"ArnEquals": {"aws:SourceArn": {"Fn::GetAtt": ["OrderPlacedRule", "Arn"]}}}
    # the function starts an event's workflow: no catch-up, no overlap (a schedule's)
    stack = Stack(
        load_template(rendered(tmp_path, ORDERS)),
        template_dir=TEMPLATE_FILE.parent,
        parameters={"DeploySampleServices": "false"},
    )
    config = json.loads(stack.function("OrderPlacedTriggerFunction").environment["TRIGGER"])
    assert config == {
        "name": "order-placed",
        "kind": "event",
        "definition": "fulfil",
        "input": {"order.$": "detail.order_id"},
        "dead_letter_url": stack.physical_id("OrderPlacedTriggerDeadLetterQueue"),
    }
    [local] = stack.event_rules()
    assert (local.bus, local.enabled, local.queue_urls) == (
        "sasflow-orders",
        True,
        (stack.physical_id("OrderPlacedTriggerQueue"),),
    )
    assert stack.get_att("OrderPlacedRule", "Arn").endswith(":rule/sasflow-orders/sasflow-OrderPlacedRule")


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ("    expression: rate(1 hour)\n", "expression: a schedule's"),
        ("    overlap: skip\n", "overlap: a schedule's"),
        ("    catch_up_window: 1h\n", "catch_up_window: a schedule's"),
    ],
)
def test_an_event_trigger_with_a_schedules_field_is_refused(tmp_path: Path, extra: str, reason: str) -> None:
    declared = tmp_path / "triggers.yaml"
    declared.write_text(ORDERS + extra)
    with pytest.raises(TriggersFileError, match=reason):
        load_triggers(declared)


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("    pattern: {}\n", "an event trigger needs an EventBridge event pattern"),
        ("    pattern:\n      source: shop.orders\n", "not an EventBridge event pattern"),
        ("    pattern:\n      source: []\n", "not an EventBridge event pattern"),
    ],
)
def test_an_event_trigger_without_a_valid_pattern_is_refused(tmp_path: Path, pattern: str, reason: str) -> None:
    declared = tmp_path / "triggers.yaml"
    text = ORDERS.split("    pattern:")[0] + pattern + "    input:\n      order.$: detail.order_id\n"
    declared.write_text(text)
    with pytest.raises(TriggersFileError, match=reason):
        load_triggers(declared)


def test_a_schedule_with_an_events_fields_is_refused(tmp_path: Path) -> None:
    declared = tmp_path / "triggers.yaml"
    declared.write_text(NIGHTLY + "    bus: orders\n")
    with pytest.raises(TriggersFileError, match="bus and pattern: an event trigger's"):
        load_triggers(declared)


PAYMENTS = """\
triggers:
  payment-received:
    kind: sqs
    definition: settle
    batch_size: 4
    input:
      payment.$: body.payment_id
      channel.$: attributes.channel
"""


def test_an_sqs_trigger_gets_its_queue_a_producers_policy_and_a_function_reading_its_batch_and_no_more(
    tmp_path: Path,
) -> None:
    with_it, mine, _ = added_resources(tmp_path, PAYMENTS, "PaymentReceived")
    assert mine == {
        "PaymentReceivedTriggerQueue",
        "PaymentReceivedTriggerDeadLetterQueue",
        "PaymentReceivedTriggerSendPolicy",
        "PaymentReceivedTriggerFunction",
        "PaymentReceivedTriggerFunctionRole",
        "PaymentReceivedTriggerOccurrences",
        "PaymentReceivedTriggerLogGroup",
        "PaymentReceivedTriggerFunctionErrorsAlarm",
        "PaymentReceivedTriggerFunctionThrottlesAlarm",
        "PaymentReceivedTriggerDeadLetterAlarm",
    }
    queue = with_it["PaymentReceivedTriggerQueue"]["Properties"]
    assert queue["RedrivePolicy"] == {
        "deadLetterTargetArn": {"Fn::GetAtt": ["PaymentReceivedTriggerDeadLetterQueue", "Arn"]},
        "maxReceiveCount": 5,
    }
    # what sends the messages attaches this policy: send to this queue, nothing else
    [send] = with_it["PaymentReceivedTriggerSendPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert (send["Action"], send["Resource"]) == (
        "sqs:SendMessage",
        {"Fn::GetAtt": ["PaymentReceivedTriggerQueue", "Arn"]},
    )
    mapping = with_it["PaymentReceivedTriggerOccurrences"]["Properties"]
    assert (mapping["BatchSize"], mapping["FunctionResponseTypes"]) == (4, ["ReportBatchItemFailures"])
    assert mapping["EventSourceArn"] == {"Fn::GetAtt": ["PaymentReceivedTriggerQueue", "Arn"]}
    # its role: its queue (read; send one back while paused), its dead-letter queue, its own trigger item
    statements = {
        s["Sid"]: s
        for policy in with_it["PaymentReceivedTriggerFunctionRole"]["Properties"]["Policies"]
        for s in policy["PolicyDocument"]["Statement"]
        if "Sid" in s
    }
    assert statements["HeldMessages"]["Action"] == "sqs:SendMessage"
    assert statements["HeldMessages"]["Resource"] == {"Fn::GetAtt": ["PaymentReceivedTriggerQueue", "Arn"]}
    assert statements["OwnTriggerItem"]["Condition"] == {
        "ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["TRIGGER#payment-received"]}
    }
    stack = Stack(
        load_template(rendered(tmp_path, PAYMENTS)),
        template_dir=TEMPLATE_FILE.parent,
        parameters={"DeploySampleServices": "false"},
    )
    function = stack.function("PaymentReceivedTriggerFunction")
    assert json.loads(function.environment["TRIGGER"]) == {
        "name": "payment-received",
        "kind": "sqs",
        "definition": "settle",
        "input": {"payment.$": "body.payment_id", "channel.$": "attributes.channel"},
        "queue_url": stack.physical_id("PaymentReceivedTriggerQueue"),
        "dead_letter_url": stack.physical_id("PaymentReceivedTriggerDeadLetterQueue"),
    }
    [event] = [e for e in function.events if isinstance(e, SqsEventSpec)]
    assert (event.queue_url, event.batch_size) == (stack.physical_id("PaymentReceivedTriggerQueue"), 4)
    # the operators see it with the queue to send to
    triggers = json.loads(stack.function("OpsFunction").environment["TRIGGERS"])
    assert triggers["payment-received"]["kind"] == "sqs"
    assert (
        triggers["payment-received"]["source"] == f"queue {stack.physical_id('PaymentReceivedTriggerQueue')}, batch 4"
    )


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ("    expression: rate(1 hour)\n", "expression: another kind's"),
        ("    overlap: skip\n", "overlap: another kind's"),
        ("    pattern:\n      source: [shop]\n", "pattern: another kind's"),
        ("    sample: true\n", "sample: turns a schedule or an event rule on"),
        ("    batch_size: 11\n", "batch_size"),
        ("    batch_size: 0\n", "batch_size"),
    ],
)
def test_an_sqs_trigger_with_another_kinds_field_or_a_bad_batch_is_refused(
    tmp_path: Path, extra: str, reason: str
) -> None:
    declared = tmp_path / "triggers.yaml"
    declared.write_text(PAYMENTS.replace("    batch_size: 4\n", "") + extra)
    with pytest.raises(TriggersFileError, match=reason):
        load_triggers(declared)


EXISTING_ORDERS = """\
triggers:
  orders:
    kind: sqs
    definition: settle
    queue: arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:orders
    dead_letter_queue: arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:orders-dlq
    batch_size: 5
"""
ORDERS_ARN = {"Fn::Sub": "arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:orders"}
ORDERS_DLQ_ARN = {"Fn::Sub": "arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:orders-dlq"}


def test_an_sqs_trigger_on_an_existing_queue_creates_no_queue_and_its_function_reads_and_refuses_to_those_named(
    tmp_path: Path,
) -> None:
    with_it, mine, _ = added_resources(tmp_path, EXISTING_ORDERS, "Orders")
    assert mine == {
        "OrdersTriggerSendPolicy",
        "OrdersTriggerFunction",
        "OrdersTriggerFunctionRole",
        "OrdersTriggerOccurrences",
        "OrdersTriggerLogGroup",
        "OrdersTriggerFunctionErrorsAlarm",
        "OrdersTriggerFunctionThrottlesAlarm",
        "OrdersTriggerDeadLetterAlarm",
    }
    mapping = with_it["OrdersTriggerOccurrences"]
    assert (mapping["Properties"]["EventSourceArn"], mapping["Properties"]["BatchSize"]) == (ORDERS_ARN, 5)
    assert mapping["Metadata"]["sasflow-existing-queue"] == {"dead_letter_queue": "orders-dlq"}
    statements = {
        s["Sid"]: s
        for policy in with_it["OrdersTriggerFunctionRole"]["Properties"]["Policies"]
        for s in policy["PolicyDocument"]["Statement"]
        if "Sid" in s
    }
    assert (statements["Occurrences"]["Resource"], statements["HeldMessages"]["Resource"]) == (ORDERS_ARN, ORDERS_ARN)
    assert statements["RefusedOccurrences"]["Resource"] == ORDERS_DLQ_ARN
    [send] = with_it["OrdersTriggerSendPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert send["Resource"] == ORDERS_ARN
    # the alarm watches the existing dead-letter queue; the operators list it and redrive it to the existing queue
    [dimension] = with_it["OrdersTriggerDeadLetterAlarm"]["Properties"]["Dimensions"]
    assert dimension == {"Name": "QueueName", "Value": "orders-dlq"}
    redrive = {
        s["Sid"]: s["Resource"] for s in with_it["DeadLetterRedrivePolicy"]["Properties"]["PolicyDocument"]["Statement"]
    }
    assert ORDERS_DLQ_ARN in redrive["DeadLetterQueues"] and ORDERS_ARN in redrive["SourceQueues"]
    # resolved in an account: the function's URLs are SQS's for those ARNs
    stack = Stack(
        load_template(rendered(tmp_path, EXISTING_ORDERS)),
        template_dir=TEMPLATE_FILE.parent,
        parameters={"DeploySampleServices": "false"},
        region="eu-west-1",
    )
    account = stack.account_id
    config = json.loads(stack.function("OrdersTriggerFunction").environment["TRIGGER"])
    assert (config["queue_url"], config["dead_letter_url"]) == (
        f"https://sqs.eu-west-1.amazonaws.com/{account}/orders",
        f"https://sqs.eu-west-1.amazonaws.com/{account}/orders-dlq",
    )
    dead_letters = json.loads(stack.function("OpsFunction").environment["DEAD_LETTER_QUEUES"])
    assert dead_letters["OrdersTriggerDeadLetterQueue"] == {
        "url": f"https://sqs.eu-west-1.amazonaws.com/{account}/orders-dlq",
        "arn": f"arn:aws:sqs:eu-west-1:{account}:orders-dlq",
    }
    [existing] = stack.existing_queues()
    assert (existing.arn, existing.dead_letter_arn) == (
        f"arn:aws:sqs:eu-west-1:{account}:orders",
        f"arn:aws:sqs:eu-west-1:{account}:orders-dlq",
    )


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ("    queue: arn:aws:sqs:eu-west-1:123456789012:orders\n", "an existing queue needs both"),
        ("    dead_letter_queue: arn:aws:sqs:eu-west-1:123456789012:orders-dlq\n", "an existing queue needs both"),
        (
            "    queue: https://sqs.eu-west-1.amazonaws.com/123456789012/orders\n"
            "    dead_letter_queue: arn:aws:sqs:eu-west-1:123456789012:orders-dlq\n",
            "queue: 'https://sqs.eu-west-1.amazonaws.com/123456789012/orders' is not an SQS queue's ARN",
        ),
        (
            "    queue: arn:aws:sqs:eu-west-1:123456789012:orders.fifo\n"
            "    dead_letter_queue: arn:aws:sqs:eu-west-1:123456789012:dlq.fifo\n",
            "a FIFO queue cannot hold a message",
        ),
        (
            "    queue: arn:aws:sqs:eu-west-1:123456789012:orders\n"
            "    dead_letter_queue: arn:aws:sqs:eu-west-1:123456789012:orders\n",
            "another queue than queue",
        ),
        (  # found by a trial: a standard queue's dead-letter queue must be standard too
            "    queue: arn:aws:sqs:eu-west-1:123456789012:orders\n"
            "    dead_letter_queue: arn:aws:sqs:eu-west-1:123456789012:orders-dlq.fifo\n",
            "use standard queues",
        ),
    ],
)
def test_an_existing_queue_without_its_dead_letter_queue_or_not_an_arn_or_fifo_is_refused(
    tmp_path: Path, fields: str, reason: str
) -> None:
    declared = tmp_path / "triggers.yaml"
    declared.write_text("triggers:\n  orders:\n    kind: sqs\n    definition: settle\n" + fields)
    with pytest.raises(TriggersFileError, match=reason):
        load_triggers(declared)


@pytest.mark.parametrize("kind", ["schedule", "event", "s3"])
def test_an_existing_queue_is_an_sqs_triggers_field_only(tmp_path: Path, kind: str) -> None:
    fields = {
        "schedule": "    expression: rate(1 hour)\n",
        "event": "    pattern:\n      source: [shop]\n",
        "s3": "    bucket: Uploads\n",
    }[kind]
    declared = tmp_path / "triggers.yaml"
    declared.write_text(
        f"triggers:\n  orders:\n    kind: {kind}\n    definition: settle\n{fields}"
        "    queue: arn:aws:sqs:eu-west-1:123456789012:orders\n"
    )
    with pytest.raises(TriggersFileError, match="queue"):
        load_triggers(declared)


def test_the_local_stack_stands_in_for_an_existing_queue_of_its_own_account_only(tmp_path: Path) -> None:
    elsewhere = EXISTING_ORDERS.replace("${AWS::AccountId}", "111122223333")
    stack = Stack(
        load_template(rendered(tmp_path, elsewhere)),
        template_dir=TEMPLATE_FILE.parent,
        parameters={"DeploySampleServices": "false"},
    )
    with pytest.raises(TemplateError, match=r"own account and region .* write the queue's ARN with \$\{AWS::Region\}"):
        stack.existing_queues()


def test_batch_size_and_a_bucket_are_not_a_schedules(tmp_path: Path) -> None:
    declared = tmp_path / "triggers.yaml"
    for extra, reason in (
        ("    batch_size: 5\n", "batch_size: an sqs or s3 trigger's"),
        ("    prefix: a/\n", "prefix"),
    ):
        declared.write_text(NIGHTLY + extra)
        with pytest.raises(TriggersFileError, match=reason):
            load_triggers(declared)


UPLOADS = """\
triggers:
  invoice-uploaded:
    kind: s3
    definition: ingest
    bucket: InvoicesBucket
    prefix: incoming/
    suffix: .pdf
  receipt-uploaded:
    kind: s3
    definition: ingest
    bucket: InvoicesBucket
    prefix: receipts/
"""


def test_an_s3_trigger_gets_a_versioned_private_bucket_that_notifies_its_queue_alone_and_removing_it_removes_them(
    tmp_path: Path,
) -> None:
    with_it, mine, _ = added_resources(tmp_path, UPLOADS, "InvoiceUploaded", "ReceiptUploaded", "InvoicesBucket")
    assert {"InvoicesBucket", "InvoicesBucketPolicy", "InvoiceUploadedTriggerQueuePolicy"} <= mine
    bucket = with_it["InvoicesBucket"]
    # created after the queues' policies (S3 checks it may send when the notification is configured), kept on delete
    assert sorted(bucket["DependsOn"]) == ["InvoiceUploadedTriggerQueuePolicy", "ReceiptUploadedTriggerQueuePolicy"]
    assert (bucket["DeletionPolicy"], bucket["UpdateReplacePolicy"]) == ("Retain", "Retain")
    props = bucket["Properties"]
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert all(props["PublicAccessBlockConfiguration"].values())
    assert props["NotificationConfiguration"]["QueueConfigurations"] == [
        {
            "Event": "s3:ObjectCreated:*",
            "Queue": {"Fn::GetAtt": ["InvoiceUploadedTriggerQueue", "Arn"]},
            "Filter": {
                "S3Key": {"Rules": [{"Name": "prefix", "Value": "incoming/"}, {"Name": "suffix", "Value": ".pdf"}]}
            },
        },
        {
            "Event": "s3:ObjectCreated:*",
            "Queue": {"Fn::GetAtt": ["ReceiptUploadedTriggerQueue", "Arn"]},
            "Filter": {"S3Key": {"Rules": [{"Name": "prefix", "Value": "receipts/"}]}},
        },
    ]
    # the queue takes notifications from S3 for that bucket of this account only, named before it exists
    [statement] = with_it["InvoiceUploadedTriggerQueuePolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert (statement["Principal"], statement["Action"]) == ({"Service": "s3.amazonaws.com"}, "sqs:SendMessage")
    assert statement["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    stack = Stack(
        load_template(rendered(tmp_path, UPLOADS)),
        template_dir=TEMPLATE_FILE.parent,
        parameters={"DeploySampleServices": "false"},
    )
    name = stack.physical_id("InvoicesBucket")
    assert name.endswith("-invoicesbucket") and name == name.lower() and len(name) <= 63
    assert stack.resolve(statement["Condition"]["ArnEquals"]["aws:SourceArn"]) == f"arn:aws:s3:::{name}"
    assert stack.get_att("InvoicesBucket", "Arn") == f"arn:aws:s3:::{name}"
    config = json.loads(stack.function("InvoiceUploadedTriggerFunction").environment["TRIGGER"])
    assert config == {
        "name": "invoice-uploaded",
        "kind": "s3",
        "definition": "ingest",
        # the function refuses another bucket's notification, and keys it does not watch
        "bucket": name,
        "prefix": "incoming/",
        "suffix": ".pdf",
        "queue_url": stack.physical_id("InvoiceUploadedTriggerQueue"),
        "dead_letter_url": stack.physical_id("InvoiceUploadedTriggerDeadLetterQueue"),
    }
    triggers = json.loads(stack.function("OpsFunction").environment["TRIGGERS"])
    assert triggers["invoice-uploaded"]["source"] == f"bucket {name}, keys incoming/*.pdf, batch 10"


@pytest.mark.parametrize(
    ("second", "overlaps"),
    [
        ("    prefix: incoming/\n", True),  # the same keys, any suffix
        ("    prefix: incoming/2027/\n    suffix: .pdf\n", True),  # within the first's
        ("    prefix: incoming/\n    suffix: .csv\n", False),  # other suffixes
        ("    prefix: archive/\n", False),  # other prefixes
    ],
)
def test_two_s3_triggers_of_one_bucket_whose_keys_overlap_are_refused_naming_both(
    tmp_path: Path, second: str, overlaps: bool
) -> None:
    declared = tmp_path / "triggers.yaml"
    head = UPLOADS.split("  receipt-uploaded:")[0]
    declared.write_text(
        f"{head}  receipt-uploaded:\n    kind: s3\n    definition: ingest\n    bucket: InvoicesBucket\n{second}"
    )
    if not overlaps:
        assert len(load_triggers(declared)) == 2
        return
    with pytest.raises(
        TriggersFileError, match="triggers invoice-uploaded and receipt-uploaded watch overlapping keys"
    ):
        load_triggers(declared)


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ("    expression: rate(1 hour)\n", "expression: another kind's"),
        ("    sample: true\n", "sample: turns a schedule or an event rule on"),
        ("    bucket: invoices\n", "bucket: 'invoices' is not a logical id"),  # a logical id: upper camel case
        # found by the trial: a raw pattern error
        ("    bucket: " + "B" * 27 + "\n", "at most 26 in all .* or {parameter: Name}"),
        # found by the trial: a '*' was taken literally by S3, so nothing matched
        ("    prefix: requests/*\n", "prefix: 'requests/\\*': S3 matches a key's prefix as it is, with no wildcard"),
        ("    suffix: '*.json'\n", "suffix: '\\*.json': S3 matches"),
        ("    prefix: ${AWS::Region}/\n", "is not allowed"),
    ],
)
def test_an_s3_trigger_with_another_kinds_field_or_no_bucket_logical_id_is_refused(
    tmp_path: Path, extra: str, reason: str
) -> None:
    declared = tmp_path / "triggers.yaml"
    single = "triggers:\n  invoice-uploaded:\n    kind: s3\n    definition: ingest\n"
    declared.write_text(single + (extra if "bucket" in extra else "    bucket: InvoicesBucket\n" + extra))
    with pytest.raises(TriggersFileError, match=reason):
        load_triggers(declared)
    declared.write_text(single)
    with pytest.raises(TriggersFileError, match="bucket: an s3 trigger needs the logical id"):
        load_triggers(declared)


def test_an_s3_trigger_naming_a_resource_the_template_has_is_refused(tmp_path: Path) -> None:
    """Found by the trial: ``bucket: PayloadBucket`` rendered the engine's claim-check bucket a second time."""
    declared = tmp_path / "triggers.yaml"
    declared.write_text("triggers:\n  x:\n    kind: s3\n    definition: d\n    bucket: PayloadBucket\n")
    with pytest.raises(TriggersFileError, match="already has a resource PayloadBucket of its own"):
        render_template(TEMPLATE_FILE.read_text(), load_agents(), load_triggers(declared))
    # the same trigger rendered twice (make template run again) is no clash with itself
    declared.write_text(UPLOADS)
    once = render_template(TEMPLATE_FILE.read_text(), load_agents(), load_triggers(declared))
    assert render_template(once, load_agents(), load_triggers(declared)) == once


INCOMING = """\
triggers:
  invoice-arrived:
    kind: s3
    definition: ingest
    bucket: {parameter: IncomingBucketName}
    prefix: invoices/
  receipt-arrived:
    kind: s3
    definition: ingest
    bucket: {parameter: IncomingBucketName}
    prefix: receipts/
    suffix: .png
"""


def test_an_s3_trigger_on_an_existing_bucket_takes_its_name_as_a_parameter_and_lets_only_it_send_to_the_queue(
    tmp_path: Path,
) -> None:
    template = load_template(rendered(tmp_path, INCOMING))
    # no bucket: the queues, their policies, the functions
    with_it, mine, _ = added_resources(tmp_path, INCOMING, "InvoiceArrived", "ReceiptArrived")
    assert not [r for r in mine if with_it[r]["Type"] == "AWS::S3::Bucket"]
    # one parameter for the two triggers of the bucket, checked as S3 names buckets
    parameter = template["Parameters"]["IncomingBucketName"]
    assert (parameter["Type"], parameter["AllowedPattern"]) == ("String", "^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    assert "invoice-arrived, receipt-arrived" in parameter["Description"]
    policy = with_it["ReceiptArrivedTriggerQueuePolicy"]
    [statement] = policy["Properties"]["PolicyDocument"]["Statement"]
    assert statement["Condition"] == {
        "ArnEquals": {"aws:SourceArn": {"Fn::Sub": "arn:${AWS::Partition}:s3:::${IncomingBucketName}"}},
        "StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}},
    }
    assert policy["Metadata"]["sasflow-existing-bucket"] == {
        "bucket_parameter": "IncomingBucketName",
        "prefix": "receipts/",
        "suffix": ".png",
    }
    # the outputs give the queue to send its uploads to
    outputs = template["Outputs"]
    assert outputs["ReceiptArrivedTriggerQueueArn"]["Value"] == {"Fn::GetAtt": ["ReceiptArrivedTriggerQueue", "Arn"]}
    stack = Stack(
        template,
        template_dir=TEMPLATE_FILE.parent,
        parameters={"DeploySampleServices": "false", "IncomingBucketName": "acme-incoming"},
    )
    triggers = json.loads(stack.function("OpsFunction").environment["TRIGGERS"])
    assert triggers["receipt-arrived"]["source"] == "bucket acme-incoming, keys receipts/*.png, batch 10"
    stand_ins = {(b.name, b.prefix, b.suffix, b.queue_arn.rsplit(":", 1)[-1]) for b in stack.existing_buckets()}
    assert stand_ins == {
        ("acme-incoming", "invoices/", "", "sasflow-InvoiceArrivedTriggerQueue"),
        ("acme-incoming", "receipts/", ".png", "sasflow-ReceiptArrivedTriggerQueue"),
    }


@pytest.mark.parametrize(
    ("bucket", "reason"),
    [
        ("{parameter: LogLevel}", "bucket parameter LogLevel: template.yaml already has a parameter or resource"),
        # a resource agents.yaml or triggers.yaml gives the template (found by a trial)
        ("{parameter: FlightsRequestQueue}", "bucket parameter FlightsRequestQueue: template.yaml already has"),
        ("{parameter: InvoiceArrivedTriggerQueue}", "bucket parameter InvoiceArrivedTriggerQueue: template.yaml"),
        ("{parameter: lower}", "parameter"),
        ("{name: acme}", "parameter"),
    ],
)
def test_an_existing_buckets_parameter_that_clashes_or_is_not_one_is_refused(
    tmp_path: Path, bucket: str, reason: str
) -> None:
    text = INCOMING.replace("{parameter: IncomingBucketName}", bucket, 1)
    with pytest.raises(TriggersFileError, match=reason):
        rendered(tmp_path, text)


def test_two_triggers_of_one_existing_bucket_whose_keys_overlap_are_refused(tmp_path: Path) -> None:
    declared = tmp_path / "triggers.yaml"
    declared.write_text(INCOMING.replace("    prefix: receipts/\n", "    prefix: invoices/\n"))
    with pytest.raises(TriggersFileError, match="overlapping keys of bucket IncomingBucketName"):
        load_triggers(declared)


def test_two_triggers_of_one_existing_queue_are_refused_naming_both(tmp_path: Path) -> None:
    """Found by a trial: make template took them, and each function would have taken a share of the messages."""
    declared = tmp_path / "triggers.yaml"
    second = EXISTING_ORDERS.split("triggers:\n", 1)[1].replace("  orders:", "  orders-too:", 1)
    declared.write_text(EXISTING_ORDERS + second)
    with pytest.raises(TriggersFileError, match="triggers orders and orders-too read the same queue"):
        load_triggers(declared)
