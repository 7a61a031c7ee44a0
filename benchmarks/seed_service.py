"""Start the seed service (``RamaAditya49/titen``, TypeScript on Bun with SQLite, one
process) on a loopback port, for ``benchmarks/rest.py --compare-url URL --compare-key KEY``
(issue #16). Nothing of its code is kept in this repository: this script takes a checkout
of it, fetches Bun with npm and runs both from a work directory.

Steps (each skipped when its result is already in ``--dir``):

1. Bun: ``npm pack @oven/bun-linux-x64@<--bun-version>`` (the npm registry npm is set up
   for), unpacked to ``DIR/bun/package/bin/bun``;
2. the source: ``git clone --no-checkout <--source>`` (a local bare repository, e.g. one the
   tool library fetched, or a git URL) into ``DIR/titen``, checked out at ``--commit``;
3. a fresh database ``DIR/run-<port>/service.db``: ``bootstrap`` (org ``OrgA``, owner
   ``ownera``), then an agent key with the lease, handoff, checkpoint and event scopes;
4. ``bun src/runtime/bun/cli.ts serve --db ... --host 127.0.0.1 --port PORT`` in the
   background (its request log, one line per request as it writes by default, to
   ``DIR/run-<port>/serve.log``), waited for until it answers.

Prints three shell lines, ``SEED_URL=...``, ``SEED_KEY=...`` and ``SEED_PID=...`` (``eval``
them), and leaves the server running; stop it with ``kill $SEED_PID`` or
``python benchmarks/seed_service.py --stop PID``. Usage::

    eval "$(python benchmarks/seed_service.py --source /work/.mirror/RamaAditya49+titen/repo)"
    python benchmarks/rest.py --clients 1,16 --compare-url "$SEED_URL" --compare-key "$SEED_KEY"
    kill "$SEED_PID"
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request

DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".cache", "baton-bench", "seed-service")
DEFAULT_SOURCE = "https://github.com/RamaAditya49/titen.git"
#: The commit measured in issue #16 (v0.8.7).
DEFAULT_COMMIT = "3eae3f6"
BUN_VERSION = "1.4.5"
SCOPES = (
    "leases:read,leases:write,handoffs:read,handoffs:write,"
    "checkpoints:read,checkpoints:write,events:read"
)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _run(cmd: list[str], cwd: str | None = None, env: dict[str, str] | None = None) -> str:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-2000:]}")
    return res.stdout


def install_bun(work: str, version: str) -> str:
    """The path of the ``bun`` binary, unpacked from the npm package into ``work/bun``."""
    target = os.path.join(work, "bun")
    binary = os.path.join(target, "package", "bin", "bun")
    if not os.path.exists(binary):
        os.makedirs(target, exist_ok=True)
        _log(f"npm pack @oven/bun-linux-x64@{version}")
        name = _run(["npm", "pack", f"@oven/bun-linux-x64@{version}"], cwd=target).split()[-1]
        with tarfile.open(os.path.join(target, name)) as tar:
            tar.extractall(target, filter="data")
        os.chmod(binary, 0o755)
    return binary


def checkout(work: str, source: str, commit: str) -> str:
    """A checkout of the seed service at ``commit`` in ``work/titen``."""
    tree = os.path.join(work, "titen")
    if not os.path.isdir(os.path.join(tree, ".git")):
        _log(f"git clone {source}")
        _run(["git", "clone", "-q", "--no-checkout", source, tree])
    _run(["git", "-C", tree, "checkout", "-q", "--force", commit])
    return tree


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _field(text: str, name: str) -> str:
    m = re.search(rf"^{name}:\s*(\S+)", text, re.MULTILINE)
    if m is None:
        raise SystemExit(f"no {name} in the seed service's output:\n{text}")
    return m.group(1)


def start(bun: str, tree: str, work: str, port: int) -> tuple[str, str, int]:
    """Bootstrap a fresh database, make an agent key, serve; ``(url, key, pid)``."""
    run_dir = os.path.join(work, f"run-{port}")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    db = os.path.join(run_dir, "service.db")
    env = dict(os.environ, PATH=os.path.dirname(bun) + os.pathsep + os.environ.get("PATH", ""))
    cli = [bun, "src/runtime/bun/cli.ts"]
    out = _run([*cli, "bootstrap", "--db", db, "--org", "OrgA", "--username", "ownera"], tree, env)
    org = _field(out, "organization")
    create = ["key", "create", "--db", db, "--org-id", org, "--principal", "alice"]
    out = _run([*cli, *create, "--scopes", SCOPES], tree, env)
    key = _field(out, "api_key")
    with open(os.path.join(run_dir, "serve.log"), "wb") as log:
        proc = subprocess.Popen(
            [*cli, "serve", "--db", db, "--host", "127.0.0.1", "--port", str(port)],
            cwd=tree,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives this script
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the seed service exited; see {run_dir}/serve.log")
        try:
            req = urllib.request.Request(url + "/v1/leases", headers={"Authorization": "Bearer x"})
            urllib.request.urlopen(req, timeout=2)
            break
        except urllib.error.HTTPError:
            break  # it answers (401)
        except OSError:
            if time.time() > deadline:
                proc.kill()
                raise SystemExit(
                    f"the seed service did not answer; see {run_dir}/serve.log"
                ) from None
            time.sleep(0.2)
    return url, key, proc.pid


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv`` and start the seed service (or ``--stop`` one), printing
    ``SEED_URL``, ``SEED_KEY`` and ``SEED_PID`` lines.

    Raises:
        SystemExit: npm, git or the seed service failed (the reason is printed).
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=DEFAULT_DIR, help="work directory (Bun, checkout, db)")
    ap.add_argument("--source", default=DEFAULT_SOURCE, help="git repository to clone")
    ap.add_argument("--commit", default=DEFAULT_COMMIT)
    ap.add_argument("--bun-version", default=BUN_VERSION)
    ap.add_argument("--port", type=int, default=0, help="loopback port (default: a free one)")
    ap.add_argument("--stop", type=int, metavar="PID", help="stop a server this script started")
    args = ap.parse_args(argv)
    if args.stop:
        os.kill(args.stop, signal.SIGTERM)
        return
    os.makedirs(args.dir, exist_ok=True)
    bun = install_bun(args.dir, args.bun_version)
    tree = checkout(args.dir, args.source, args.commit)
    url, key, pid = start(bun, tree, args.dir, args.port or _free_port())
    print(f"SEED_URL={url}")
    print(f"SEED_KEY={key}")
    print(f"SEED_PID={pid}")


if __name__ == "__main__":
    main()
