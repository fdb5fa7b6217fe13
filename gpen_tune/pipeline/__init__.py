"""The face restoration pipeline, one straight line:

    source ──> decode ──> detect ──> align ──> restore ──> paste ──> sink (encode)
               imageio    face.detect face.align restore.   face.paste  sinks.FileSink
                                                 Restorer   face.parse

* `sources` / `sinks`: what is read and where results go (photo files, arrays; a video reader or a Ray batch is
  a new Source, a video encoder a new Sink with `ordered = True`).
* `steps.Steps`: the contract every executor drives, three calls: `prepare(jobs)` (decode, detect, track, align,
  cut; the placement decided once), `restore(faces)` (a generator batch with its parse masks), `finish(job)`
  (paste, and the sink). Each step calls the one home of its work; no scheduling.
* `scheduler.run_serial` (the calls inline) and `threads.run_threaded` (prepare workers -> one GPU stage that
  batches faces across images -> finish workers): scheduling only. `video`: a video as a source, a tracker and
  an ordered sink.
* `api.Pipeline`: builds the restorer (generator + TuneConfig switches), the detector service and the parser
  once; `api.enhance` (many inputs to a folder) and `api.enhance_image` (one image in memory) are the entry
  points; `outputs` plans every output path before any work; `report` writes the summary.

To plug in a new input or output, write a Source (iterable of `SourceItem(name, stem, load)`) or a Sink
(`write(job)`, `ordered`) and call `Pipeline.run(source, sink)`; a new executor (several GPUs, a cluster) runs
`Pipeline.run` per worker on a share of the source, or loops over `Pipeline.steps(sink)`'s three calls
(docs/architecture.md).
"""

from __future__ import annotations

import importlib

_LAZY = {
    "Pipeline": "api", "enhance": "api", "enhance_image": "api", "EnhanceResult": "api",
    "EnhanceSettings": "settings", "SchedulerConfig": "scheduler", "RunSummary": "scheduler",
    "FileSource": "sources", "ArraySource": "sources", "SourceItem": "sources",
    "FileSink": "sinks", "MemorySink": "sinks", "OutputNaming": "outputs", "ImageJob": "job",
    "Steps": "steps", "enhance_video": "video", "enhance_frames": "video",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"gpen_tune.pipeline.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'gpen_tune.pipeline' has no attribute {name!r}")
