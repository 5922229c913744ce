"""``fork_map``: one function over a few work items in forked processes, results by pipe.

The analysis of one large module shares big read-only inputs (decoded line tables, inlining
records, section bytes) between its parts; ``fork`` hands them to the children for free
(copy-on-write), where ``multiprocessing`` would pickle them. It also works inside a
``multiprocessing`` pool worker, whose daemonic processes may not start a pool of their own.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from typing import TypeVar

from callpath.errors import CallpathError

T = TypeVar("T")
R = TypeVar("R")


def fork_map(fn: Callable[[T], R], items: list[T]) -> list[R]:
    """``[fn(x) for x in items]``, every item but the last in a forked child.

    A child that raises sends the message back and the parent raises it: a
    :class:`CallpathError` as such, anything else as a RuntimeError naming it. Falls back to
    running in this process if ``fork`` fails.
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
    try:
        tail = [fn(x) for x in items[done:]]
    finally:
        got: list[tuple[str, object]] = []
        for pid, r in children:
            with os.fdopen(r, "rb") as f:
                data = f.read()
            os.waitpid(pid, 0)
            got.append(pickle.loads(data) if data else ("bug", "a worker process died"))
    out: list[R] = []
    for kind, value in got:
        if kind == "user":
            raise CallpathError(str(value))
        if kind != "ok":
            raise RuntimeError(f"parallel structure analysis failed: {value}")
        out.append(value)  # type: ignore[arg-type]
    return out + tail
