"""A loopback HTTP server that answers `POST /v1/enhance` with the request's own body at once: the load generator
of `serve_load.py --client-ceiling` measures its own limit against it (no model, no image work on the server).

    python benchmarks/loopback_echo.py PORT
"""

from __future__ import annotations

import sys

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route


async def enhance(request: Request) -> Response:
    body = await request.body()
    return Response(body, media_type=request.headers.get("content-type", "application/octet-stream"))


async def ready(_request: Request) -> Response:
    return PlainTextResponse("ok")


app = Starlette(routes=[Route("/v1/enhance", enhance, methods=["POST"]), Route("/readyz", ready),
                        Route("/metrics", ready)])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
