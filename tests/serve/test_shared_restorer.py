"""The GPU order of `SharedRestorer`: batches are submitted one at a time, and a staging slot (two, alternating) is
reused only once its previous batch was collected. A GPU does not run here, so the restorer is a stand-in that
keeps the real one's slot rule and says which batch each slot held."""

from __future__ import annotations

import threading

import torch

from gpen_tune.serve.steps import SharedRestorer


class _Batch:
    def __init__(self, slot: int, log: list[str], name: str):
        self.slot, self.log, self.name = slot, log, name
        self.release = threading.Event()

    def result(self) -> list[str]:
        self.release.wait(30)
        if f"collected {self.name}" not in self.log:      # collected once; later calls read the same result
            self.log.append(f"collected {self.name}")
        return [self.name]


class _SlotRestorer:
    """Two staging slots used in turn, as the CUDA restorer's `PinnedStaging`."""

    device = torch.device("cuda")

    def __init__(self):
        self.log: list[str] = []
        self.batches: dict[str, _Batch] = {}
        self.in_slot: dict[int, _Batch] = {}
        self.turn = 0

    def submit(self, crops: list[str], download: bool = True) -> _Batch:
        slot, self.turn = self.turn, self.turn ^ 1
        held = self.in_slot.get(slot)
        if held is not None:
            assert f"collected {held.name}" in self.log, f"slot {slot} reused before {held.name} was collected"
        batch = self.in_slot[slot] = self.batches[crops[0]] = _Batch(slot, self.log, crops[0])
        self.log.append(f"submitted {crops[0]}")
        return batch


def _start(shared: SharedRestorer, name: str, done: dict[str, list]) -> threading.Thread:
    thread = threading.Thread(target=lambda: done.setdefault(name, shared.submit([name]).result()))
    thread.start()
    return thread


def _until(condition, seconds: float = 10.0) -> None:
    event = threading.Event()
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        event.wait(0.01)
    raise AssertionError("condition not reached")


def test_a_slot_waits_for_its_previous_batch_to_be_collected():
    inner, done = _SlotRestorer(), {}
    shared = SharedRestorer(inner)
    a = _start(shared, "a", done)
    _until(lambda: "a" in inner.batches)
    b = _start(shared, "b", done)                       # a second batch while the first computes
    _until(lambda: "b" in inner.batches)
    inner.batches["b"].release.set()                    # b is collected before a
    b.join(10)
    c = _start(shared, "c", done)                       # would take a's slot: it must wait for a
    threading.Event().wait(0.3)
    assert "c" not in inner.batches and inner.log == ["submitted a", "submitted b", "collected b"]
    inner.batches["a"].release.set()
    a.join(10)
    _until(lambda: "c" in inner.batches)
    inner.batches["c"].release.set()
    c.join(10)
    assert inner.log == ["submitted a", "submitted b", "collected b", "collected a", "submitted c", "collected c"]
    assert done == {"a": ["a"], "b": ["b"], "c": ["c"]}


def test_in_turn_callers_never_wait():
    inner, done = _SlotRestorer(), {}
    shared = SharedRestorer(inner)
    for name in "abcd":
        thread = _start(shared, name, done)
        _until(lambda n=name: n in inner.batches)
        inner.batches[name].release.set()
        thread.join(10)
    assert inner.log == [f"{kind} {n}" for n in "abcd" for kind in ("submitted", "collected")]
