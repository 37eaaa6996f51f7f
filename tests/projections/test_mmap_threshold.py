"""`onward projector` fixes glibc's mmap threshold so large freed buffers (fetch responses,
decompressed record batches) go back to the system: a process that freed one large block and
then frees a smaller large block keeps that block's pages in its heap without it, and not with
it. Run in fresh interpreters, since the setting is process-wide."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

PROBE = """
import sys
from onward.projections.kafka import fixed_mmap_threshold

def rss_kib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])

fixed = fixed_mmap_threshold() if sys.argv[1] == "fixed" else False
first = bytearray(24 * 1024 * 1024)
del first
block = bytearray(8 * 1024 * 1024)
held = rss_kib()
del block
print(fixed, held - rss_kib())
"""


def returned_kib(mode: str) -> tuple[bool, int]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="mallopt's mmap threshold is glibc's",
)
def test_freed_large_blocks_go_back_to_the_system() -> None:
    fixed, returned = returned_kib("fixed")
    assert fixed
    assert returned >= 7 * 1024, returned
    unfixed, kept_back = returned_kib("default")
    assert not unfixed
    assert kept_back < 1024, kept_back
