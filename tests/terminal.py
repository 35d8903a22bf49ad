"""A command run at a pseudo-terminal, as a person runs it: stdin, stdout and stderr are all the terminal, so the
CLI asks its questions and draws its live line. The test reads what the screen receives and types answers."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


class Terminal:
    def __init__(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]) -> None:
        primary, secondary = pty.openpty()
        self.process = subprocess.Popen(list(argv), stdin=secondary, stdout=secondary, stderr=secondary, cwd=cwd,
                                        env=dict(env), start_new_session=True)
        os.close(secondary)
        self._primary = primary
        self.screen = b""  # everything the terminal received so far
        self._closed = False

    def _read(self, timeout: float) -> bool:
        """Take what the terminal received within ``timeout`` seconds; False once the command closed it."""
        if self._closed or self._primary < 0:
            return False
        ready, _, _ = select.select([self._primary], [], [], max(timeout, 0.0))
        if not ready:
            return True
        try:
            chunk = os.read(self._primary, 65536)
        except OSError:  # EIO: every process holding the terminal has ended
            chunk = b""
        if not chunk:
            self._closed = True
            return False
        self.screen += chunk
        return True

    def read_until(self, text: str, timeout: float = 60.0) -> str:
        """Read until ``text`` is on the screen; returns the screen. A wait this long only ends a broken test."""
        wanted = text.encode()
        deadline = time.monotonic() + timeout
        while wanted not in self.screen:
            if time.monotonic() > deadline or not self._read(deadline - time.monotonic()):
                raise AssertionError(f"{text!r} never came; the terminal shows:\n{self.text()}")
        return self.text()

    def read_for(self, seconds: float) -> bytes:
        """What arrives in the next ``seconds``."""
        start = len(self.screen)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self._read(deadline - time.monotonic()):
            pass
        return self.screen[start:]

    def type(self, text: str) -> None:
        os.write(self._primary, text.encode())

    def wait(self, timeout: float = 60.0) -> int:
        """Read to the end and return the exit code."""
        deadline = time.monotonic() + timeout
        while self._read(deadline - time.monotonic()) and time.monotonic() < deadline:
            pass
        try:
            return self.process.wait(max(deadline - time.monotonic(), 1.0))
        finally:
            self.close()

    def text(self) -> str:
        return self.screen.decode("utf-8", "replace")

    def close(self) -> None:
        """End the command if it still runs, and let go of the terminal."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self._primary >= 0:
            os.close(self._primary)
            self._primary = -1
        self._closed = True
