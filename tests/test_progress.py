"""The progress bar of the benchmarks and beds (erdmampi.testing.progress)."""
import io

from erdmampi.testing.progress import Progress


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_terminal_redraws_one_line_with_time_left():
    out, clock = Tty(), Clock()
    with Progress(4, "bench", file=out, width=8, clock=clock) as p:
        p.step("first")
        clock.t = 10.0
        p.advance()
        p.step("second")
    text = out.getvalue()
    assert text.count("\r\033[K") == 3 and text.endswith("\n")
    last = text.split("\r\033[K")[-1]
    # one of four done after 10 s: 30 s left
    assert last == "bench: [##......] 1/4  25%, 30s left: second\n", last


def test_logs_get_a_line_at_most_every_interval():
    out, clock = io.StringIO(), Clock()
    p = Progress(3, "wan", file=out, every=30.0, clock=clock)
    p.step("a")               # printed: the first line
    clock.t = 5.0
    p.advance()
    p.step("b")               # 5 s later: not printed
    clock.t = 40.0
    p.advance()
    p.step("c")               # 35 s after the last line: printed
    clock.t = 41.0
    p.advance()               # the end is always printed
    p.close()
    lines = out.getvalue().splitlines()
    assert lines == ["wan: [" + "." * 30 + "] 0/3   0%: a",
                     "wan: [" + "#" * 20 + "." * 10 + "] 2/3  67%, 20s left: c",
                     "wan: [" + "#" * 30 + "] 3/3 100%, 0s left"], lines


def test_off_switch(monkeypatch):
    monkeypatch.setenv("ERDMA_PROGRESS", "0")
    out = Tty()
    with Progress(2, file=out) as p:
        p.step("x")
        p.advance()
    assert out.getvalue() == ""
