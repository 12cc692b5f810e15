"""A sampling profiler inside the operator process, for the scale bench's ``--profile``.

A deterministic profiler (cProfile) slows meshrun's operator several times over, and a slow
operator behaves differently (its watches lag its own creates). This one looks at every thread's
Python stack every ``INTERVAL`` seconds while it is on (SIGUSR1 starts it, SIGUSR2 stops it and
writes what it saw as JSON), which costs a few percent. A thread counts as busy in a sample unless
its innermost frame is a known wait (the event loop's select, an idle pool worker, a socket read).

The bench starts the operator as ``python -c "...; _stack_sampler.run(OUT, ARGS)"``; running this
file does nothing.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections import Counter
from types import FrameType

INTERVAL = 0.01
# (file name ending, function) of innermost frames that mean the thread is waiting, not working.
WAITS = {
    ("selectors.py", "select"),
    ("thread.py", "_worker"),
    ("wait.py", "do_poll"),
    ("threading.py", "wait"),
    ("queue.py", "get"),
    ("socket.py", "readinto"),
    ("ssl.py", "read"),
    ("ssl.py", "recv_into"),
    ("_stack_sampler.py", "_loop"),
}


def _frames(frame: FrameType | None) -> list[str]:
    stack = []
    while frame is not None:
        code = frame.f_code
        stack.append(f"{code.co_filename}:{code.co_firstlineno}:{code.co_name}")
        frame = frame.f_back
    return stack


def _waiting(top: str) -> bool:
    filename, _, function = top.rsplit(":", 2)
    return any(filename.endswith(f"/{f}") and function == g for f, g in WAITS)


class Sampler:
    def __init__(self) -> None:
        self.on = threading.Event()
        self.main = threading.main_thread().ident
        self.samples = Counter[str]()
        self.own: dict[str, Counter[str]] = {"loop": Counter(), "other": Counter()}
        self.inclusive: dict[str, Counter[str]] = {"loop": Counter(), "other": Counter()}

    def _loop(self) -> None:
        me = threading.get_ident()
        while True:
            self.on.wait()
            time.sleep(INTERVAL)
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                role = "loop" if ident == self.main else "other"
                stack = _frames(frame)
                self.samples[role] += 1
                if not stack or _waiting(stack[0]):
                    continue
                self.samples[f"{role} busy"] += 1
                self.own[role][stack[0]] += 1
                self.inclusive[role].update(set(stack))

    def dump(self, path: str) -> None:
        self.on.clear()
        time.sleep(2 * INTERVAL)
        data = {
            "interval": INTERVAL,
            "samples": dict(self.samples),
            "own": {k: dict(v.most_common(200)) for k, v in self.own.items()},
            "inclusive": {k: dict(v.most_common(400)) for k, v in self.inclusive.items()},
        }
        with open(path, "w") as out:
            json.dump(data, out)


def run(out: str, argv: list[str]) -> int:
    """Run the operator's main() with the sampler armed on SIGUSR1 / SIGUSR2."""
    from meshrun_operator.main import main

    sampler = Sampler()
    threading.Thread(target=sampler._loop, daemon=True, name="stack-sampler").start()
    signal.signal(signal.SIGUSR1, lambda *_: sampler.on.set())
    signal.signal(signal.SIGUSR2, lambda *_: sampler.dump(out))
    return main(argv)
