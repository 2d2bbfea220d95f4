"""A progress bar for long runs (benchmarks, WAN and NAT beds) on stderr.

On a terminal it redraws one line: ``[#####.....] 12/40 30% 1m05s left:
allreduce 1 MiB erdmampi``.  Elsewhere (CI logs, files) it prints a plain line
when a step starts, at most every ``every`` seconds, so logs stay short.
``ERDMA_PROGRESS=0`` turns it off.
"""
import sys
import time

__all__ = ["Progress"]


def _fmt_secs(s):
    s = int(round(s))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class Progress:
    """``with Progress(total, "bench") as p: ... p.step("what comes next")``."""

    def __init__(self, total, name="", file=None, width=30, every=30.0, clock=time.monotonic):
        self.total = max(int(total), 1)
        self.name = name
        self.file = file if file is not None else sys.stderr
        self.width = width
        self.every = every
        self.clock = clock
        self.done = 0
        self.t0 = clock()
        self._last_plain = None
        from erdmampi import config
        self.enabled = config.get("ERDMA_PROGRESS")
        try:
            self.tty = self.file.isatty()
        except Exception:
            self.tty = False

    def line(self, what=""):
        frac = min(self.done / self.total, 1.0)
        filled = int(frac * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = self.clock() - self.t0
        left = f", {_fmt_secs(elapsed / self.done * (self.total - self.done))} left" \
            if self.done else ""
        head = f"{self.name}: " if self.name else ""
        tail = f": {what}" if what else ""
        return f"{head}[{bar}] {self.done}/{self.total} {frac:4.0%}{left}{tail}"

    def _show(self, what, force=False):
        if not self.enabled:
            return
        now = self.clock()
        if self.tty:
            self.file.write("\r\033[K" + self.line(what))
        elif force or self._last_plain is None or now - self._last_plain >= self.every:
            self._last_plain = now
            self.file.write(self.line(what) + "\n")
        else:
            return
        self.file.flush()

    def step(self, what=""):
        """Announce the next step (counts the previous one as done)."""
        self._show(what)

    def advance(self, n=1, what=""):
        """Count n steps done (logs get a line only for the last one)."""
        self.done = min(self.done + n, self.total)
        if self.tty or self.done == self.total:
            self._show(what, force=True)

    def close(self):
        if self.enabled and self.tty:
            self.file.write("\n")
            self.file.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
