"""CUDA graphs as a one-shot run and a pipeline use them: no capture for a bucket used once, and a capture that
holds while other threads keep the GPU busy on their own streams (the video pipeline's detector and paste), take
pooled streams, upload from pageable memory, warm up (synchronize, empty the cache) or capture themselves."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from gpen_tune.load import load_model
from gpen_tune.restore.restorer import build_restorer
from gpen_tune.tune import TuneConfig, cuda_graph

pytestmark = pytest.mark.gpu


def _restorer():
    model = load_model("synthetic", model="GPEN-BFR-256", device="cuda")
    return model, build_restorer(copy.deepcopy(model), TuneConfig(cuda_graph=True), device="cuda")


def test_a_bucket_used_once_is_not_captured(no_tf32):
    model, restore = _restorer()
    x = torch.rand(5, 3, 256, 256, device="cuda") * 2 - 1
    with torch.no_grad():
        ref = model(x)
    out = restore(x)
    assert isinstance(restore.forward, cuda_graph.GraphedForward)
    assert restore.forward.graphs == {} and restore.forward.disabled is None
    assert (out - ref).abs().max() < 1e-3


def test_capture_holds_while_another_thread_runs_cuda_work(no_tf32):
    model, restore = _restorer()
    x = torch.rand(2, 3, 256, 256, device="cuda") * 2 - 1
    with torch.no_grad():
        ref = model(x)
    stop = threading.Event()

    def busy() -> None:                      # as the detector thread does: its own stream, kernels and copies
        stream = torch.cuda.Stream()
        a = torch.rand(1024, 1024, device="cuda")
        with torch.cuda.stream(stream):
            while not stop.is_set():
                (a @ a).sum().item()

    t = threading.Thread(target=busy)
    t.start()
    try:
        restore(x)
        outs = [restore(x) for _ in range(3)]
    finally:
        stop.set()
        t.join()
    assert restore.forward.disabled is None, restore.forward.disabled
    assert len(restore.forward.graphs) == 1
    assert all((o - ref).abs().max() < 1e-3 for o in outs)


def test_capture_holds_while_another_thread_takes_pooled_streams_and_copies_from_pageable_memory(no_tf32):
    """The pipeline's threads take streams from PyTorch's pool and upload decoded photos from ordinary memory: a
    capture on a pooled stream can share that stream, and the other thread's copy then fails mid-capture."""
    model, restore = _restorer()
    x = torch.rand(2, 3, 256, 256, device="cuda") * 2 - 1
    with torch.no_grad():
        ref = model(x)
    stop = threading.Event()
    errors: list[BaseException] = []
    host = torch.rand(256, 256, 3)                  # pageable, as a decoded photo is

    def uploads() -> None:
        try:
            while not stop.is_set():
                with torch.cuda.stream(torch.cuda.Stream()):          # walks the pool, as stage threads do
                    host.to("cuda").sum().item()
        except BaseException as e:                  # noqa: BLE001 (reported below)
            errors.append(e)

    t = threading.Thread(target=uploads)
    t.start()
    try:
        for _ in range(6):
            restore.forward.reset()                 # a fresh capture each time: many chances to collide
            restore.forward.seen.clear()
            restore(x)
            out = restore(x)
    finally:
        stop.set()
        t.join()
    assert not errors, errors[0]
    assert restore.forward.disabled is None, restore.forward.disabled
    assert (out - ref).abs().max() < 1e-3


def test_two_threads_capture_at_once(no_tf32):
    """The detector's P-Net and the generator capture their graphs from their own threads, at any moment."""
    model, first = _restorer()
    second = build_restorer(copy.deepcopy(model), TuneConfig(cuda_graph=True), device="cuda")
    x = torch.rand(2, 3, 256, 256, device="cuda") * 2 - 1
    with torch.no_grad():
        ref = model(x)
    outs: dict[int, torch.Tensor] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def run(i: int, restore) -> None:
        try:
            start.wait()
            for _ in range(4):
                restore.forward.reset()
                restore.forward.seen.clear()
                restore(x)
                outs[i] = restore(x)
                torch.cuda.current_stream().synchronize()   # stream-level: a device-wide sync goes through settle
        except BaseException as e:                  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i, r)) for i, r in enumerate((first, second))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert first.forward.disabled is None and second.forward.disabled is None
    assert all((outs[i] - ref).abs().max() < 1e-3 for i in (0, 1))
