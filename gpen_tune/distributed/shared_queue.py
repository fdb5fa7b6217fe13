"""What the thread lanes of a `DevicePool` share: one queue of inputs, the reorder buffer of an ordered sink, and
the one tracker of a video spread over devices.

    source ──read in order──> SharedQueue ──take (lowest first)──> LaneSource (one per device) -> Pipeline.run
                                  ^ give_back: a lost device's inputs, a frame to redo        |
                                                                                                v
    ordered sink <──source order── ReorderBuffer <──────── LaneSink (one per device) <── restored jobs

The source is read lazily (a video is never decoded ahead of what the lanes take), each input is handed out
once and given back only when a device lost it, so every input is processed exactly as on one device.

Tracking a video over several devices (`OrderedTracker`): each device detects faces in the frames it took;
the tracker (tracking + One-Euro smoothing, `gpen_tune.video.track`) is called in source order across the
devices, each frame's call waiting for the frames before it, and its answer is kept until the frame is written,
so a frame redone on another device (its device was lost) aligns with the same smoothed landmarks. A frame that
waits for one that went back to the queue untracked (its device was lost before tracking it), or for one taken
after it (which may sit behind it in its own device's order), is redone: it goes back to the queue too, with no
faces written, so no device's in-flight slots stay held by frames that cannot be tracked yet.
"""

from __future__ import annotations

import copy
import heapq
import threading
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from gpen_tune.pipeline.job import ImageJob, one_line
from gpen_tune.pipeline.sinks import Sink
from gpen_tune.pipeline.sources import SourceItem

POLL_S = 0.05


class Taker(Protocol):
    """A device that takes inputs (devices.Lane): it takes none once lost."""

    @property
    def lost(self) -> bool: ...


class SharedQueue:
    """The one queue of a run: the source read in order as the devices take, given-back inputs first (a heap of
    positions), what became of each; an input's item is dropped once its result is recorded."""

    def __init__(self, source: Iterable[SourceItem]):
        self._rest: Iterator[SourceItem] = iter(source)
        self.items: dict[int, SourceItem] = {}          # read, no result yet
        self.read = 0                                    # items read from the source so far
        self.exhausted = False
        self.read_error: BaseException | None = None    # the source's own failure (re-raised by the run)
        self.pending: list[int] = []                     # a heap: given-back inputs go before later ones
        self.results: dict[int, ImageJob] = {}
        self.window: int | None = None                  # ordered runs: how far ahead of `written` to hand out
        self.written = 0
        self.stopped = False
        self.takes = 0
        self.taken_at: dict[int, int] = {}               # input -> when it was last taken (a running count)
        self.index_of: dict[int, int] = {}               # id(item.meta) -> input, for the tracker
        self.cond = threading.Condition()
        if hasattr(source, "__len__"):             # a list of photos or arrays: cheap items, all listed up front
            self.drain()

    def _next(self) -> int | None:
        if self.pending:
            return self.pending[0]
        return None if self.exhausted else self.read

    def _read_one(self) -> bool:
        """The source's next item into `items` (called holding the lock: positions follow the source's order)."""
        try:
            item = next(self._rest)
        except StopIteration:
            self.exhausted = True
            return False
        except BaseException as e:                      # raised again by DevicePool.run, after the lanes end
            self.read_error, self.exhausted, self.stopped = e, True, True
            self.cond.notify_all()
            return False
        self.items[self.read] = item
        if item.meta is not None:
            self.index_of[id(item.meta)] = self.read
        self.read += 1
        return True

    def take(self, lane: Taker) -> int | None:
        with self.cond:
            while not self.stopped and not lane.lost and (index := self._next()) is not None:
                if self.window is not None and index >= self.written + self.window:
                    self.cond.wait(POLL_S)
                    continue
                if self.pending:
                    heapq.heappop(self.pending)
                elif not self._read_one():
                    continue
                self.taken_at[index] = self.takes
                self.takes += 1
                return index
            return None

    def has_work(self) -> bool:
        with self.cond:
            return not self.stopped and self._next() is not None

    def give_back(self, index: int) -> None:
        with self.cond:
            heapq.heappush(self.pending, index)
            self.cond.notify_all()

    def settle(self, index: int, job: ImageJob) -> None:
        """The input's result: recorded, its item (a decoded frame) let go."""
        with self.cond:
            self.results[index] = job
            item = self.items.pop(index, None)
            if item is not None and item.meta is not None:
                self.index_of.pop(id(item.meta), None)
            self.taken_at.pop(index, None)
            self.cond.notify_all()

    def drain(self) -> None:
        """Every input not read yet into the queue (a list of photos up front; after a stop, so that they are
        reported as not processed, as on one pipeline)."""
        with self.cond:
            while not self.exhausted and self._read_one():
                heapq.heappush(self.pending, self.read - 1)

    def hand_on(self, lane: Any, source: LaneSource) -> None:
        """A failed lane's inputs without a result (and not given back already) go back in the queue."""
        with self.cond:
            for index in source.taken:
                if index not in self.results and index not in source.handed_on:
                    source.handed_on.add(index)
                    heapq.heappush(self.pending, index)
                    lane.retried += 1
            self.cond.notify_all()


class LaneSource:
    """The shared queue as one device's source; remembers which input each local position is."""

    ordered = False

    def __init__(self, shared: SharedQueue, lane: Taker):
        self.shared, self.lane = shared, lane
        self.taken: list[int] = []
        self.handed_on: set[int] = set()            # taken, then queued again for the other devices

    def __iter__(self) -> Iterator[SourceItem]:
        while (index := self.shared.take(self.lane)) is not None:
            self.taken.append(index)
            self.handed_on.discard(index)           # taken again (a frame to redo): this lane holds it now
            yield self.shared.items[index]


class ReorderBuffer:
    """An ordered sink fed from several devices: jobs are held until every earlier one is settled."""

    def __init__(self, sink: Sink, shared: SharedQueue):
        self.sink, self.shared = sink, shared
        self.held: dict[int, ImageJob | None] = {}   # None: settled without a write (dropped)
        self.lock = threading.Lock()

    def offer(self, index: int, job: ImageJob | None) -> None:
        with self.lock:
            if index < self.shared.written:
                return
            self.held[index] = job
            while self.shared.written in self.held:
                keep = self.held.pop(self.shared.written)
                if keep is not None:
                    try:
                        self.sink.write(keep)
                    except (OSError, ValueError, RuntimeError) as e:
                        keep.fail(one_line(keep.source, e))
                    keep.release(meta=True)
                with self.shared.cond:
                    self.shared.written += 1
                    self.shared.cond.notify_all()


class LaneSink:
    """One device's sink: writes straight through, or into the shared reorder buffer for an ordered sink (a frame
    to redo is not written: its other run is)."""

    ordered = False

    def __init__(self, sink: Sink, source: LaneSource, reorder: ReorderBuffer | None,
                 tracker: OrderedTracker | None = None):
        self.sink, self.source, self.reorder, self.tracker = sink, source, reorder, tracker

    def write(self, job: ImageJob) -> Any:
        if self.reorder is None:
            return self.sink.write(job)
        index = self.source.taken[job.index]
        if self.tracker is not None and index in self.tracker.redo:
            return None
        kept = copy.copy(job)                        # the lane releases its job's pixels after this returns
        kept.index = index
        self.reorder.offer(index, kept)
        return None


class OrderedTracker:
    """A video's tracker shared by the devices: called in source order whichever device detected the frame (see
    the module docstring). Items must carry a meta (a video frame): it names the frame's position."""

    def __init__(self, tracker: Any, shared: SharedQueue):
        self.tracker, self.shared = tracker, shared
        self.next = 0                                # the first frame not tracked yet
        self.tracked: dict[int, list] = {}           # the tracker's answer per frame, until its result is settled
        self.redo: set[int] = set()                  # frames that go back to the queue (settled by no device)

    def update(self, detections: list, meta: Any) -> list:
        shared = self.shared
        with shared.cond:
            index = shared.index_of[id(meta)]
            while index not in self.tracked:
                while self.next in shared.results:   # failed before tracking: one device skips it too
                    self.next += 1
                if self.next == index:
                    self.tracked[index] = self.tracker.update(detections, meta)
                    self.next += 1
                    shared.cond.notify_all()
                    break
                if (shared.stopped or self.next in shared.pending
                        or shared.taken_at.get(self.next, -1) > shared.taken_at.get(index, -1)):
                    self.redo.add(index)
                    return []
                shared.cond.wait(POLL_S)
            return self.tracked[index]

    def take_redo(self, index: int) -> bool:
        """Whether the frame is to be redone (then it is no longer marked)."""
        with self.shared.cond:
            if index in self.redo:
                self.redo.discard(index)
                return True
            return False

    def forget(self, index: int) -> None:
        with self.shared.cond:
            self.tracked.pop(index, None)
