"""Live sequences survive their model moving between scheduler replicas: a replica joining
(fair share moves the model to it) and a replica stopping cleanly, with two real replicas."""

from __future__ import annotations

import signal

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.cluster import running_cluster, scheduler_statuses
from tests.integration.test_sequence_batcher import _int_input, _python_model
from tests.serving import wait_until

MODEL = "py_acc"  # sorts before py_zz: the model a replica above its fair share hands over first


class Sequences:
    """Clients of live sequences of the accumulator that check every running sum."""

    def __init__(self, url: str, ids: list[int]) -> None:
        self.client = httpclient.InferenceServerClient(url, network_timeout=60)
        self.sums = dict.fromkeys(ids, 0)
        self.steps = 0

    def start(self) -> None:
        for corrid in self.sums:
            self._send(corrid, corrid, start=True)

    def step(self) -> None:
        self.steps += 1
        for corrid in self.sums:
            self._send(corrid, self.steps)

    def end(self) -> None:
        for corrid in self.sums:
            self._send(corrid, 1, end=True)
        self.client.close()

    def _send(self, corrid: int, value: int, start: bool = False, end: bool = False) -> None:
        result = self.client.infer(MODEL, _int_input(value), sequence_id=corrid, sequence_start=start, sequence_end=end)
        self.sums[corrid] += value
        assert int(result.as_numpy("OUTPUT")[0, 0]) == self.sums[corrid], (corrid, self.sums[corrid])


def schedulers(running) -> dict[str, dict]:
    """scheduler id -> its status, for the replicas that answer."""
    return scheduler_statuses(running.nats.url)


def owner(running) -> str | None:
    return next((sid for sid, status in schedulers(running).items() if MODEL in status["owned"]), None)


def summary(running, sid: str) -> dict:
    return schedulers(running).get(sid, {}).get("sequences", {}).get(f"{MODEL}/1", {})


def handing_over(running, sid: str) -> str | None:
    return schedulers(running).get(sid, {}).get("handing_over", {}).get(f"{MODEL}/1")


def step_until(sequences: Sequences, condition, timeout: float = 60.0) -> None:
    """Keep the sequences running (well within their idle time) until `condition()`."""

    def stepped() -> bool:
        if condition():
            return True
        sequences.step()
        return False

    wait_until(stepped, timeout, "the condition, the sequences stepping", 0)


def check_residue(running, old: str, new: str, sequences: Sequences) -> None:
    """The old owner serves its sequences after the overlap; the new owner leaves their slots alone."""
    step_until(sequences, lambda: owner(running) == new and handing_over(running, old) == "final")
    held = summary(running, old)
    assert held["live"] == len(sequences.sums) and held["free_slots"] == 0, held
    assert summary(running, new)["reserved"] == held["bound"]
    # a new sequence meanwhile is the new owner's, on a slot nobody else holds
    fresh = Sequences(running.url, [900])
    fresh.start()
    assert summary(running, new)["bound"] == 1
    fresh.end()
    for _ in range(3):
        sequences.step()


def test_live_sequences_survive_a_joining_replica_and_a_clean_shutdown(tmp_path):
    for name in (MODEL, "py_zz"):
        _python_model(tmp_path, name, count=2)  # 2 instances x 4 slots
    with running_cluster(
        tmp_path, schedulers=2, supervise=False, worker={"credits_per_instance": 1}, shape="standalone"
    ) as running:
        first = running.cluster.child("scheduler")
        second = running.cluster.child("scheduler-1")
        first_id, second_id = first.settings.scheduler_id, second.settings.scheduler_id
        # one replica alone serves both models
        second.process.send_signal(signal.SIGTERM)
        assert second.process.wait(30) == 0
        wait_until(
            lambda: owner(running) == first_id, 30, "the first replica owning it", detail=lambda: schedulers(running)
        )

        # a replica joins while sequences are live: the model moves to it, the sequences go on
        sequences = Sequences(running.url, [1, 2, 3, 4, 5])
        sequences.start()
        sequences.step()
        running.cluster.restart("scheduler-1")
        check_residue(running, first_id, second_id, sequences)
        sequences.end()
        wait_until(lambda: handing_over(running, first_id) is None)
        assert summary(running, first_id)["live"] == 0 and summary(running, second_id)["reserved"] == 0

        # the model's owner stops cleanly while sequences are live: the other replica takes the
        # model at once, the stopping one serves its sequences until they end, then exits
        sequences = Sequences(running.url, [11, 12, 13])
        sequences.start()
        sequences.step()
        second = running.cluster.child("scheduler-1")
        second.process.send_signal(signal.SIGTERM)
        check_residue(running, second_id, first_id, sequences)
        assert second.process.poll() is None  # still serving them
        sequences.end()
        assert second.process.wait(30) == 0
        assert summary(running, first_id)["reserved"] == 0
        again = Sequences(running.url, [11, 21])  # an id of a finished sequence starts afresh
        again.start()
        again.step()
        again.end()

        # a replica that dies holding sequences loses them, and says so (not Triton's START-flag error)
        sequences = Sequences(running.url, [31, 32])
        sequences.start()
        running.cluster.restart("scheduler-1")
        check_residue(running, first_id, second_id, sequences)
        first.process.kill()
        first.process.wait(30)
        for corrid in sequences.sums:
            with pytest.raises(InferenceServerException) as err:
                sequences.client.infer(MODEL, _int_input(1), sequence_id=corrid)
            assert err.value.status() == "400" and err.value.message() == (
                f"sequence {corrid} to model '{MODEL}' was lost: scheduler {first_id} stopped responding; start it "
                "again with the START flag"
            )
        restarted = Sequences(running.url, [31])
        restarted.start()
        restarted.end()
        sequences.client.close()
