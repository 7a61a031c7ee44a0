"""Fenced object writes on stores with conditional writes: a generation-precondition
bucket in memory (as Google Cloud Storage), and an ETag store over real HTTP (``If-Match``
and ``If-None-Match: *``, as S3 and Azure Blob)."""

from __future__ import annotations

import hashlib
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import pytest

from prefect_baton import StaleFenceError, ValidationError
from prefect_baton.fencing import (
    METADATA_KEY,
    FencingToken,
    PreconditionFailed,
    StoredObject,
    conditional_put,
    object_metadata,
    token_from_metadata,
)
from prefect_baton.testing import ManualClock, memory_baton


@dataclass
class Bucket:
    """Objects with generations; a write conditional on the generation (0: must not exist)
    fails with PreconditionFailed otherwise, as ``if_generation_match`` does."""

    objects: dict[str, tuple[int, dict[str, str], str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    history: list[tuple[int, str]] = field(default_factory=list)  # (token, body) landed
    generations: int = 0

    def read(self, name: str) -> StoredObject[int]:
        with self.lock:
            gen, meta, _ = self.objects.get(name, (0, {}, ""))
        return StoredObject(token=token_from_metadata(meta), precondition=gen)

    def write(self, name: str, body: str, meta: dict[str, str], if_generation_match: int) -> int:
        with self.lock:
            current = self.objects.get(name, (0, {}, ""))[0]
            if current != if_generation_match:
                raise PreconditionFailed(f"generation is {current}, not {if_generation_match}")
            self.generations += 1
            self.objects[name] = (self.generations, meta, body)
            self.history.append((int(meta[METADATA_KEY]), body))
            return self.generations

    def body(self, name: str) -> str:
        return self.objects[name][2]


def put(bucket: Bucket, fence: object, body: str, before: Callable[[], None] | None = None) -> int:
    """A fenced write of ``body`` to ``report.json``; ``before`` runs before the store call
    of the first attempt (a pause between the check and the write)."""
    calls = []

    def write(generation: int) -> int:
        calls.append(generation)
        if before is not None and len(calls) == 1:
            before()
        return bucket.write("report.json", body, object_metadata(fence), generation)  # type: ignore[arg-type]

    return conditional_put(fence, lambda: bucket.read("report.json"), write)  # type: ignore[arg-type]


def test_paused_old_holder_is_refused_after_the_new_holders_write() -> None:
    """The old holder writes after the new holder did: refused, the new object stands."""
    bucket = Bucket()
    clock = ManualClock()
    with memory_baton(principal="worker-1", clock=clock) as b:
        old = b.leases.acquire("report", "daily", ttl_seconds=60)
        put(bucket, old, "old-1")
        clock.advance(61)
        new = b.as_principal("worker-2").leases.acquire("report", "daily", ttl_seconds=60)
        put(bucket, new, "new-1")
        with pytest.raises(StaleFenceError, match=f"token {new.epoch} has written"):
            put(bucket, old, "old-2")
    assert bucket.body("report.json") == "new-1"


def test_old_holder_paused_between_check_and_write_is_refused() -> None:
    """The old holder checked, paused, and the new holder wrote meanwhile: the old write's
    precondition fails, the re-check refuses it, and the new object stands."""
    bucket = Bucket()
    put(bucket, FencingToken("report", "daily", 1), "old-1")
    with pytest.raises(StaleFenceError):
        put(
            bucket,
            FencingToken("report", "daily", 1),
            "old-2",
            before=lambda: put(bucket, FencingToken("report", "daily", 2), "new-1"),
        )
    assert bucket.body("report.json") == "new-1"
    assert bucket.history == [(1, "old-1"), (2, "new-1")]


def test_same_token_retries_a_refused_precondition() -> None:
    """A precondition refused by a write of the same epoch is read and tried again."""
    bucket = Bucket()
    token = FencingToken("report", "daily", 4)
    put(bucket, token, "a", before=lambda: put(bucket, token, "b"))
    assert bucket.history == [(4, "b"), (4, "a")]


def test_attempts_run_out_with_the_stores_error() -> None:
    """Every attempt refused: the store's last precondition error comes back."""
    token = FencingToken("report", "daily", 1)

    def refuse(_gen: int) -> None:
        raise PreconditionFailed("changed again")

    with pytest.raises(PreconditionFailed, match="changed again"):
        conditional_put(token, lambda: StoredObject(None, 0), refuse, attempts=2)


def test_other_errors_of_the_write_are_not_retried() -> None:
    """An error that is not a refused precondition goes straight back."""
    calls: list[int] = []

    def fail(gen: int) -> None:
        calls.append(gen)
        raise OSError("network down")

    with pytest.raises(OSError, match="network down"):
        conditional_put(FencingToken("r", "i", 1), lambda: StoredObject(None, 0), fail)
    assert calls == [0]


@pytest.mark.parametrize("attempts", [0, 101, True, 2.0, "3"])
def test_bad_attempts(attempts: object) -> None:
    """attempts must be an integer from 1 to 100; nothing is read or written."""
    with pytest.raises(ValidationError, match="attempts must be an integer from 1 to 100"):
        conditional_put(FencingToken("r", "i", 1), lambda: 1 / 0, print, attempts=attempts)  # type: ignore[arg-type]


def test_metadata_round_trip_and_bad_values() -> None:
    """The token goes into metadata and comes back (any key case); bad values are clear."""
    assert object_metadata(FencingToken("r", "i", 12)) == {METADATA_KEY: "12"}
    assert token_from_metadata({"Baton_Fencing_Token": " 12 "}) == 12
    assert token_from_metadata(None) is None
    assert token_from_metadata({"other": "1"}) is None
    for bad in ("-1", "1.0", "x", "٣", str(2**53)):
        with pytest.raises(ValidationError, match=METADATA_KEY):
            token_from_metadata({METADATA_KEY: bad})


def test_many_threads_with_interleaved_tokens() -> None:
    """Ten threads write one object with interleaved tokens: tokens never go down."""
    bucket = Bucket()
    rng = random.Random(4)
    plans = [sorted(rng.randint(1, 30) for _ in range(20)) for _ in range(10)]
    refused: list[int] = []
    start = threading.Barrier(len(plans))

    def run(i: int, tokens: list[int]) -> None:
        start.wait()
        for token in tokens:
            try:
                put(bucket, FencingToken("report", "daily", token), f"w{i}@{token}")
            except StaleFenceError:
                refused.append(token)
            except PreconditionFailed:
                pass  # three rounds lost to equal-token writers: allowed, nothing written

    threads = [threading.Thread(target=run, args=(i, p)) for i, p in enumerate(plans)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    tokens = [t for t, _ in bucket.history]
    assert tokens == sorted(tokens), f"a lower token wrote after a higher one: {tokens}"
    assert refused
    assert all(t < tokens[-1] for t in refused)


# --------------------------------------------------------------------------- real HTTP


def etag_store_app() -> tuple[object, list[int]]:
    """A Starlette object store: ``GET`` gives the body with its ``ETag`` and metadata
    header ``x-meta-baton_fencing_token``; ``PUT`` honours ``If-Match`` and
    ``If-None-Match: *`` with ``412``, as S3 and Azure Blob conditional writes do. Also
    returns the tokens of the writes that landed, in order."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    objects: dict[str, tuple[str, str, bytes]] = {}  # name -> (etag, token, body)
    lock = threading.Lock()
    landed: list[int] = []

    async def get(request: Request) -> Response:
        found = objects.get(request.path_params["name"])
        if found is None:
            return Response(status_code=404)
        etag, token, body = found
        return Response(body, headers={"ETag": etag, f"x-meta-{METADATA_KEY}": token})

    async def put_(request: Request) -> Response:
        name, body = request.path_params["name"], await request.body()
        with lock:
            current = objects.get(name)
            if_match, if_none = (
                request.headers.get("if-match"),
                request.headers.get("if-none-match"),
            )
            if (if_none == "*" and current is not None) or (
                if_match is not None and (current is None or current[0] != if_match)
            ):
                return Response(status_code=412)
            etag = '"' + hashlib.sha256(body + str(len(objects)).encode()).hexdigest()[:16] + '"'
            token = request.headers[f"x-meta-{METADATA_KEY}"]
            objects[name] = (etag, token, body)
            landed.append(int(token))
        return Response(status_code=200, headers={"ETag": etag})

    routes = [Route("/o/{name}", get, methods=["GET"]), Route("/o/{name}", put_, methods=["PUT"])]
    return Starlette(routes=routes), landed


def http_put(client: httpx.Client, fence: FencingToken, body: str) -> None:
    """A fenced HTTP write of ``body``: conditional on the ETag read (or on absence)."""

    def read() -> StoredObject[dict[str, str]]:
        resp = client.get("/o/report")
        if resp.status_code == 404:
            return StoredObject(None, {"If-None-Match": "*"})
        meta = {k.removeprefix("x-meta-"): v for k, v in resp.headers.items()}
        return StoredObject(token_from_metadata(meta), {"If-Match": resp.headers["etag"]})

    def write(precondition: dict[str, str]) -> None:
        meta = {f"x-meta-{k}": v for k, v in object_metadata(fence).items()}
        resp = client.put("/o/report", content=body, headers={**precondition, **meta})
        if resp.status_code == 412:
            raise PreconditionFailed(resp.text)
        resp.raise_for_status()

    conditional_put(fence, read, write, attempts=20)


def test_real_http_etag_store_many_writers_and_a_paused_old_holder() -> None:
    """Over real HTTP with If-Match: interleaved writers never let a lower token overwrite
    a higher one's object, and an old holder after the new holder is refused."""
    from tests.fencing.test_web import serve

    rng = random.Random(5)
    plans = [sorted(rng.randint(1, 30) for _ in range(10)) for _ in range(6)]
    refused: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(len(plans))
    app, landed = etag_store_app()
    with serve(app) as url:  # type: ignore[arg-type]

        def run(tokens: list[int]) -> None:
            with httpx.Client(base_url=url, timeout=60) as client:
                start.wait()
                for token in tokens:
                    try:
                        http_put(client, FencingToken("report", "daily", token), str(token))
                    except StaleFenceError:
                        refused.append(token)
                    except BaseException as exc:
                        errors.append(exc)

        threads = [threading.Thread(target=run, args=(p,)) for p in plans]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        with httpx.Client(base_url=url) as client:
            top = int(client.get("/o/report").text)
            with pytest.raises(StaleFenceError):
                http_put(client, FencingToken("report", "daily", top - 1), "zombie")
            assert client.get("/o/report").text == str(top)
    assert not errors, errors[:3]
    assert landed == sorted(landed), f"a lower token wrote after a higher one: {landed}"
    assert top == landed[-1] == max(t for p in plans for t in p)
    assert refused
