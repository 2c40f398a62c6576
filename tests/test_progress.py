"""Progress: one live line on a terminal (a real pty), a short log otherwise, nothing on request."""
from __future__ import annotations

import fcntl
import io
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from conftest import write_parquet
from tokenshards.errors import UserError
from tokenshards.cluster.progress import Progress, format_eta
from tokenshards.wording import human


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_bar_is_one_line_redrawn_in_place():
    clock, out = Clock(), io.StringIO()
    progress = Progress(4, mode="bar", stream=out, clock=clock, refresh=None, width=100)
    for _ in range(4):
        clock.now += 5
        progress.update(1_000_000)
    progress.close()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    frames = [f.removesuffix("\x1b[K") for f in text.rstrip("\n").split("\r")[1:]]
    assert len(frames) == 6  # drawn at start, on each of 4 updates, and once more on close
    assert frames[0].startswith("[......") and "  0%  partitions 0/4       0 tokens" in frames[0] and frames[0].endswith("ETA     --")
    half = re.fullmatch(r"\[(#+)(\.+)\]  50%  partitions 2/4    2\.0M tokens  200\.0k tokens/s  elapsed    10s  ETA    10s",
                        frames[2])
    assert half and len(half.group(1)) == len(half.group(2))
    assert re.match(r"\[#+\] 100%  partitions 4/4", frames[-1]) and frames[-1].endswith("ETA     0s")
    assert all(len(f) <= 99 for f in frames)


def test_bar_keeps_its_width_as_the_numbers_grow():
    """Counts, amounts, rates and times padded to their widest: every frame as wide as the first,
    the count's digits and the amounts in the same columns."""
    clock, out = Clock(), io.StringIO()
    progress = Progress(1200, mode="bar", stream=out, clock=clock, refresh=None, width=160)
    for i in range(1200):
        clock.now += 0.5 if i % 100 else 4000
        progress.update(7 ** (i % 12))
    progress.close()
    frames = [f.removesuffix("\x1b[K") for f in out.getvalue().rstrip("\n").split("\r")[1:]]
    assert len(frames) == 1202 and len({len(f) for f in frames}) == 1, sorted({len(f) for f in frames})
    assert len({f.index(" tokens ") for f in frames}) == 1
    assert "partitions    0/1200" in frames[0] and "partitions 1200/1200" in frames[-1]


def test_bar_fits_a_narrow_terminal():
    progress = Progress(10, mode="bar", stream=io.StringIO(), clock=Clock(), refresh=None, width=40)
    assert len(progress.bar_line(40)) == 39 and not progress.bar_line(40).startswith("[")


def test_log_mode_prints_every_tenth_and_a_heartbeat():
    clock, out = Clock(), io.StringIO()
    progress = Progress(100, mode="log", stream=out, clock=clock, heartbeat=300)
    for i in range(100):
        clock.now += 1 if i != 33 else 400  # one slow partition: the heartbeat speaks once more
        progress.update(10)
    progress.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert len(lines) == 11
    assert [int(re.match(r"partitions (\d+)/100", line).group(1)) for line in lines] == \
        [10, 20, 30, 34, 40, 50, 60, 70, 80, 90, 100]


def test_resumed_runs_count_from_what_was_committed():
    clock, out = Clock(), io.StringIO()
    progress = Progress(20, mode="log", stream=out, clock=clock, already_done=16)
    clock.now += 4
    progress.update(100)
    assert out.getvalue() == ""  # still in the 80% step
    clock.now += 4
    progress.update(100)
    # ETA and rate come from the partitions this run finished, not the resumed ones.
    assert out.getvalue() == "partitions 18/20  200 tokens  25 tokens/s  elapsed 8s  ETA 8s\n"


def test_none_prints_nothing_and_say_passes_messages_through():
    out, said = io.StringIO(), []
    progress = Progress(3, mode="none", stream=out, refresh=None)
    progress.update(5)
    progress.say(said.append, "skipping unreadable partition 1")
    progress.close()
    assert out.getvalue() == "" and said == ["skipping unreadable partition 1"]


def test_say_clears_the_bar_first():
    out = io.StringIO()
    progress = Progress(3, mode="bar", stream=out, clock=Clock(), refresh=None, width=100)
    progress.say(lambda m: out.write(m + "\n"), "a note")
    progress.close()
    assert "\r\x1b[Ka note\n\r[" in out.getvalue()


def test_auto_is_log_off_a_terminal_and_bar_on_one():
    assert Progress(1, mode="auto", stream=io.StringIO()).mode == "log"
    master, slave = os.openpty()
    try:
        with os.fdopen(slave, "w", closefd=False) as tty:
            progress = Progress(1, mode="auto", stream=tty, refresh=None)
            assert progress.mode == "bar"
            progress.close()
    finally:
        os.close(slave)
        os.close(master)


def test_unknown_mode():
    with pytest.raises(UserError, match=r"progress='fancy' not supported, expected one of auto, bar, log, none"):
        Progress(1, mode="fancy")


def test_units():
    assert [human(n) for n in (999, 1500, 2_500_000, 3e12)] == ["999", "1.5k", "2.5M", "3.0T"]
    assert [human(n) for n in (999.6, 999_960, 999_949)] == ["1.0k", "1.0M", "999.9k"]  # never "1000" nor "1000.0k"
    assert [format_eta(s) for s in (9, 75, 3725, 99 * 3600 + 3599, 100 * 3600, 99 * 86400 + 86399, 100 * 86400)] == \
        ["9s", "1m15s", "1h02m", "99h59m", "4d04h", "99d23h", ">99d"]


def test_a_real_run_on_a_terminal_shows_one_live_line(cluster, tmp_path):
    """The CLI in a real pseudo-terminal: the progress is a single line redrawn with \\r."""
    texts = [f"text number {i} " * 20 for i in range(300)]
    path = write_parquet(tmp_path / "in.parquet", {"text": texts}, row_group_size=50)
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))  # a 120-column terminal
    cmd = [str(Path(sys.executable).with_name("tokenshards")), "tokenize", "--input", str(path),
           "--out", str(tmp_path / "out"), "--scheduler", cluster.scheduler_address, "--partition-mb", "0.001"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    stdout = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 0, b"".join(chunks).decode(errors="replace")
    err = b"".join(chunks).decode().replace("\r\n", "\n")  # the tty turns \n into \r\n
    progress_lines = [line for line in err.split("\n") if "partitions " in line and "%" in line]
    assert len(progress_lines) == 1  # every redraw is on the same line
    frames = [f.removesuffix("\x1b[K") for f in progress_lines[0].split("\r") if f]
    assert frames[0].startswith("[") and "partitions 0/6" in frames[0]
    assert "] 100%  partitions 6/6" in frames[-1]
    assert "done: 300 documents" in stdout
