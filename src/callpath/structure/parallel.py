"""``fork_map``: one function over a few work items in forked processes, results by pipe.

The analysis of one large module shares big read-only inputs (decoded line tables, inlining
records, section bytes) between its parts; ``fork`` hands them to the children for free
(copy-on-write), where ``multiprocessing`` would pickle them. It also works inside a
``multiprocessing`` pool worker, whose daemonic processes may not start a pool of their own.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
from collections.abc import Callable
from typing import TypeVar

from callpath.errors import CallpathError

T = TypeVar("T")
R = TypeVar("R")


def fork_map(fn: Callable[[T], R], items: list[T]) -> list[R]:
    """``[fn(x) for x in items]``, every item but the last in a forked child.

    A child that raises sends the message back and the parent raises it: a
    :class:`CallpathError` as such, anything else as a RuntimeError naming it; a child killed
    by a signal (the out-of-memory killer, a user's ``kill``) is a :class:`CallpathError`
    naming the signal. When the parent's own item raises, the children are killed, not waited
    for. Falls back to running in this process if ``fork`` fails.
    """
    children: list[tuple[int, int]] = []  # (pid, read end)
    for x in items[:-1]:
        try:
            r, w = os.pipe()
            pid = os.fork()
        except OSError:
            break
        if pid == 0:  # child: never returns into the caller's code
            status = 0
            try:
                os.close(r)
                try:
                    payload = pickle.dumps(("ok", fn(x)), protocol=pickle.HIGHEST_PROTOCOL)
                except CallpathError as e:
                    payload = pickle.dumps(("user", str(e)))
                except BaseException as e:
                    payload = pickle.dumps(("bug", f"{type(e).__name__}: {e}"))
                with os.fdopen(w, "wb") as f:
                    f.write(payload)
            except BaseException:
                status = 1
            finally:
                os._exit(status)
        os.close(w)
        children.append((pid, r))
    done = len(children)
    ok = False
    try:
        tail = [fn(x) for x in items[done:]]
        ok = True
    finally:
        got: list[tuple[str, object]] = []
        for pid, r in children:
            if not ok:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            with os.fdopen(r, "rb") as f:
                data = f.read() if ok else b""
            _, status = os.waitpid(pid, 0)
            if data:
                got.append(pickle.loads(data))
            elif os.WIFSIGNALED(status):
                got.append(("killed", os.WTERMSIG(status)))
            else:
                got.append(("bug", "a worker process died"))
    out: list[R] = []
    for kind, value in got:
        if kind == "user":
            raise CallpathError(str(value))
        if kind == "killed":
            sig = int(value)  # type: ignore[call-overload]
            raise CallpathError(f"a worker process was killed by signal {sig} "
                                f"({signal.Signals(sig).name}; out of memory?)")
        if kind != "ok":
            raise RuntimeError(f"parallel work failed: {value}")
        out.append(value)  # type: ignore[arg-type]
    return out + tail
