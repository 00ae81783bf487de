"""The rules of a provider's protection (gateway.providers.gates) on their own: the rate
limit's arithmetic, the cap's leases, the pause and the circuit breaker's transitions. The
shared state in Redis and the real workers are tests/gateway/test_provider_protection.py."""

from __future__ import annotations

import pytest

from gateway.choices import Outcome
from gateway.providers import gates
from gateway.providers.gates import (
    CIRCUIT,
    CLOSED,
    HALF_OPEN,
    IN_FLIGHT,
    OPEN,
    PAUSED,
    RATE,
    GateState,
    Policy,
    Rate,
    parse_rate,
)


@pytest.mark.parametrize(
    ("text", "count", "per"),
    [("50/s", 50, 1.0), ("600/min", 600, 60.0), ("10/2s", 10, 2.0), ("1000/hour", 1000, 3600.0),
     (" 5 / 0.5 sec ", 5, 0.5)],
)  # fmt: skip
def test_rates_parse(text, count, per):
    rate = parse_rate(text)
    assert (rate.count, rate.per) == (count, per)


@pytest.mark.parametrize("text", ["", "50", "50/day", "0/s", "-1/s", "x/s", "5/0s", "5/s/s"])
def test_malformed_rates_are_refused(text):
    with pytest.raises(ValueError):
        parse_rate(text)


@pytest.mark.parametrize(("text", "burst"), [("50/s", 1), ("100/s", 2), ("1000/s", 20),
                                              ("6000/min", 2), ("100000/s", 2000)])  # fmt: skip
def test_a_claim_may_take_twenty_milliseconds_of_a_fast_rate_at_once(text, burst):
    rate = parse_rate(text)
    assert rate.burst == burst
    granted, _ = gates.rate_take(rate, 0.0, 100.0, 10_000)
    assert granted == burst


def test_permits_are_evenly_spaced_one_per_interval():
    rate = parse_rate("10/s")  # one every 0.1 s
    granted, tat = gates.rate_take(rate, 0.0, 100.0, 25)
    assert granted == 1
    assert gates.rate_take(rate, tat, 100.0, 1)[0] == 0
    assert gates.rate_next_at(rate, tat) == pytest.approx(100.1)
    assert gates.rate_take(rate, tat, 100.05, 1)[0] == 0  # half an interval: nothing yet
    granted, tat = gates.rate_take(rate, tat, 100.1, 5)
    assert granted == 1
    # An idle second is no credit: still one at a time.
    assert gates.rate_take(rate, tat, 1000.0, 50)[0] == 1


def test_a_burst_lets_that_many_go_at_once_then_paces():
    rate = Rate(10, 1.0, burst=4)
    granted, tat = gates.rate_take(rate, 0.0, 100.0, 25)
    assert granted == 4
    assert gates.rate_take(rate, tat, 100.05, 1)[0] == 0
    granted, tat = gates.rate_take(rate, tat, 100.1, 5)
    assert granted == 1
    granted, _ = gates.rate_take(rate, tat, 100.55, 10)
    assert granted == 4  # 0.45 s later: refilled to the burst, no further


@pytest.mark.parametrize("burst", [1, 3])
def test_no_stretch_of_one_period_holds_more_than_the_rate(burst):
    rate = Rate(7, 1.0, burst=burst)
    tat, sent = 0.0, []
    for step in range(400):  # asking for 3 every 10 ms for 4 s
        now = 50.0 + step * 0.01
        granted, tat = gates.rate_take(rate, tat, now, 3)
        sent += [now] * granted
    assert len(sent) >= 7 * 4 - 1
    for index, start in enumerate(sent):
        in_window = [t for t in sent[index:] if t < start + rate.per - 1e-9]
        assert len(in_window) <= rate.count + burst - 1


def test_permits_given_back_are_taken_again_but_time_gone_is_not_credit():
    rate = Rate(4, 1.0, burst=4)
    granted, tat = gates.rate_take(rate, 0.0, 10.0, 4)
    assert granted == 4
    tat = gates.rate_give_back(rate, tat, 10.0, 3)
    assert gates.rate_take(rate, tat, 10.0, 4)[0] == 3
    assert gates.rate_give_back(rate, 10.5, 20.0, 3) == 20.0


def test_the_window_count_shown_starts_over_each_period():
    rate = parse_rate("5/s")
    window = gates.window_count(rate, [], 10.0, 2)
    assert window == [10.0, 2]
    window = gates.window_count(rate, window, 10.5, 1)
    assert window == [10.0, 3]
    assert gates.window_count(rate, window, 10.6, -1) == [10.0, 2]
    assert gates.window_count(rate, window, 11.0) == [11.0, 0]


def policy(**kwargs) -> Policy:
    return Policy("p", rate_key="p", **kwargs)


def test_the_cap_grants_leases_up_to_it_and_they_expire():
    state, rules = GateState(), policy(max_in_flight=3, lease_seconds=60)
    first = gates.admit(state, rules, 0.0, 2, ["a", "b"])
    assert (first.granted, first.leases) == (2, ("a", "b"))
    second = gates.admit(state, rules, 1.0, 5, ["c", "d", "e"])
    assert (second.granted, second.leases) == (1, ("c",))
    held = gates.admit(state, rules, 2.0, 1, ["f"])
    assert held.granted == 0 and held.hold is not None and held.hold.gate == IN_FLIGHT
    gates.give_back(state, rules, 3.0, leases=["a"])
    assert gates.admit(state, rules, 3.0, 4, ["g", "h"]).leases == ("g",)
    # A worker killed with its calls out: their leases run out, the slots come back.
    assert gates.admit(state, rules, 62.0, 4, ["i", "j", "k", "l"]).granted == 2


def test_a_rate_and_a_cap_together_grant_the_smaller():
    state, rules = GateState(), policy(rate=Rate(2, 1.0, burst=2), max_in_flight=5)
    admission = gates.admit(state, rules, 0.0, 5, list("abcde"))
    assert admission.granted == 2 and len(admission.leases) == 2
    assert gates.admit(state, rules, 0.1, 5, list("fghij")).hold.gate == RATE


def test_retry_after_pauses_every_admission_until_it_runs_out():
    state, rules = GateState(), policy()
    gates.observe(state, rules, 100.0, [False], retry_after=3.0)
    hold = gates.admit(state, rules, 101.0, 1, []).hold
    assert hold is not None and (hold.gate, hold.until) == (PAUSED, 103.0)
    gates.observe(state, rules, 101.0, [False], retry_after=1.0)  # a shorter one: no change
    assert state.paused_until("p", 102.0) == 103.0
    assert gates.admit(state, rules, 103.0, 1, []).granted == 1


def test_the_circuit_opens_after_failures_in_a_row_probes_once_and_closes():
    state, rules = GateState(), policy(failures_to_open=3, open_seconds=10)
    gates.observe(state, rules, 0.0, [True, True, False, True, True])
    assert (state.circuit, state.failures) == (CLOSED, 2)  # a success in between: not in a row
    gates.observe(state, rules, 1.0, [True])
    assert (state.circuit, state.since, state.open_until) == (OPEN, 1.0, 11.0)
    hold = gates.admit(state, rules, 5.0, 8, []).hold
    assert hold is not None and (hold.gate, hold.until) == (CIRCUIT, 11.0)
    probe = gates.admit(state, rules, 11.0, 8, [])
    assert (probe.granted, probe.probe, state.circuit) == (1, True, HALF_OPEN)
    assert gates.admit(state, rules, 11.5, 8, []).hold.gate == CIRCUIT  # one probe at a time
    gates.observe(state, rules, 12.0, [False])
    assert (state.circuit, state.failures, state.since) == (CLOSED, 0, 12.0)
    assert gates.admit(state, rules, 12.0, 8, []).granted == 8


def test_a_failed_probe_opens_the_circuit_again_and_a_lost_one_is_given_up():
    state, rules = GateState(), policy(failures_to_open=1, open_seconds=10, lease_seconds=30)
    gates.observe(state, rules, 0.0, [True])
    assert gates.admit(state, rules, 10.0, 1, []).probe
    gates.observe(state, rules, 10.5, [True])
    assert (state.circuit, state.open_until) == (OPEN, 20.5)
    assert gates.admit(state, rules, 20.5, 1, []).probe  # its worker dies with it: no answer
    assert gates.admit(state, rules, 30.0, 1, []).granted == 0
    assert gates.admit(state, rules, 50.5, 1, []).probe  # the probe's lease ran out
    gates.give_back(state, rules, 51.0, probe=True)  # its claim found nothing to send
    assert gates.admit(state, rules, 51.0, 1, []).probe


@pytest.mark.parametrize(
    ("outcome", "status", "failure"),
    [
        (Outcome.NOT_STARTED, None, True),  # connection refused
        (Outcome.UNKNOWN, None, False),  # lost after sending: the reconciler's, not down
        (Outcome.UNKNOWN, 503, True),
        (Outcome.UNKNOWN, 500, True),
        (Outcome.UNKNOWN, 429, False),  # the provider's pacing: Retry-After, not a failure
        (Outcome.REJECTED, 400, False),
        (Outcome.UNKNOWN, 422, False),  # a key mismatch: an answer
        (Outcome.CONFIRMED, 201, False),
        (Outcome.IN_PROGRESS, 202, False),
    ],
)
def test_what_the_breaker_counts_as_a_failure(outcome, status, failure):
    assert gates.is_failure(outcome, status) is failure


def test_a_state_survives_its_round_trip_through_json():
    state, rules = GateState(), policy(rate=parse_rate("5/s"), max_in_flight=2)
    gates.admit(state, rules, 3.0, 2, ["a", "b"])
    gates.observe(state, rules, 3.5, [True], retry_after=2)
    assert GateState.from_data(state.as_data()) == state


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"rate_limit": "fast"}, "rate_limit 'fast' is not a rate"),
        ({"rate_limit": 50}, "rate_limit 50 is not a rate"),
        ({"max_in_flight": 0}, "max_in_flight must be a positive whole number"),
        ({"max_in_flight": True}, "max_in_flight must be a positive whole number"),
        ({"circuit": {"failures": 0}}, "circuit.failures must be a positive whole number"),
        ({"circuit": {"open_seconds": -1}}, "circuit.open_seconds must be a positive number"),
        ({"circuit": {"tries": 3}}, "circuit must be a JSON object with failures and open_seconds"),
    ],
)
def test_the_start_up_check_names_a_bad_protection_setting(entry, problem):
    from gateway.providers.config import entry_problems

    assert any(problem in found for found in entry_problems("tickets", entry)), entry_problems(
        "tickets", entry
    )


def test_an_entry_reads_its_protection():
    from gateway.providers.config import parse_entry

    entry = parse_entry(
        "tickets",
        {
            "rate_limit": "600/min",
            "max_in_flight": 4,
            "circuit": {"failures": 3, "open_seconds": 9},
        },
    )
    assert (entry.rate_limit.count, entry.rate_limit.per) == (600, 60.0)
    assert (entry.max_in_flight, entry.circuit_failures, entry.circuit_open_seconds) == (4, 3, 9.0)
