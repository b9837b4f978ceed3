"""`keel doctor` on this host: the report parses, covers every area, and
places the data dir on the filesystem findmnt reports."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KEEL = Path(os.environ.get("KEEL_BIN", REPO / "target" / "debug" / "keel"))


def doctor(*args: str) -> subprocess.CompletedProcess:
    assert KEEL.exists(), f"keel binary not found at {KEEL} (build it, or set KEEL_BIN)"
    return subprocess.run([str(KEEL), "doctor", *args], capture_output=True, text=True, timeout=60)


def findings(report: dict, area: str, check: str | None = None) -> list[dict]:
    return [f for f in report["findings"]
            if f["area"] == area and (check is None or f["check"] == check)]


def test_doctor_reads_this_host(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    run = doctor("--json", "--sample-secs", "1", "--data-dir", str(data))
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["sample_secs"] == 1
    for area in ("memory", "reclaim", "kernel", "disk"):
        assert findings(report, area), f"no {area} findings: {report}"
    for f in report["findings"]:
        assert f["severity"] in ("ok", "info", "warn", "error"), f
        assert f["found"], f
        if f["severity"] in ("warn", "error"):
            assert f["fix"], f"a {f['severity']} without a fix: {f}"
    # The sample ran: the direct-reclaim verdict is there, with its counters.
    [direct] = findings(report, "reclaim", "direct_reclaim")
    assert "pgscan_direct +" in direct["found"]
    assert findings(report, "memory", "budgets")
    assert "keel doctor itself" in report["cgroup_of"]

    # The data dir is on the filesystem findmnt says it is on.
    [mount] = findings(report, "disk", "mount")
    assert str(data) in mount["subject"]
    m = re.search(r" is on (\S+) (\S+) mounted at (\S+) \(dev (\d+):(\d+)", mount["found"])
    assert m, mount["found"]
    fstype, source, target = m.group(1), m.group(2), m.group(3)
    if shutil.which("findmnt"):
        out = subprocess.run(["findmnt", "-n", "-o", "FSTYPE,TARGET", "-T", str(data)],
                             capture_output=True, text=True, check=True).stdout.split()
        assert (fstype, target) == (out[0], out[1]), (mount, out)
    # And stat -f agrees on its device's filesystem family.
    magic = subprocess.run(["stat", "-f", "-c", "%T", str(data)],
                           capture_output=True, text=True, check=True).stdout.strip()
    families = {"ext4": "ext2/ext3", "ext3": "ext2/ext3", "ext2": "ext2/ext3"}
    assert families.get(fstype, fstype) == magic, (fstype, magic)
    # The directory exists, so O_DIRECT was probed (and the probe removed).
    [direct_io] = findings(report, "disk", "direct_io")
    assert "not probed" not in direct_io["found"]
    assert direct_io["severity"] in ("ok", "info"), direct_io
    assert list(data.iterdir()) == []
    # Free space as statvfs has it (to the GiB: the disk is shared).
    [space] = findings(report, "disk", "space")
    st = os.statvfs(data)
    free_gib = st.f_bavail * st.f_frsize / 2**30
    shown = re.match(r"([\d.]+) (\w+) free of", space["found"])
    assert shown, space
    value = float(shown.group(1)) * {"GiB": 1, "TiB": 1024, "MiB": 1 / 1024}.get(shown.group(2), 0)
    assert abs(value - free_gib) < 1.0, (space, free_gib)
    # One verdict for the check, by the share free (the disk is shared: skip the edge).
    share = st.f_bavail / st.f_blocks
    if abs(share - 0.10) > 0.005 and free_gib > 2:
        assert space["severity"] == ("warn" if share < 0.10 else "ok"), (space, share)


def test_doctor_table_and_pid(tmp_path):
    run = doctor("--sample-secs", "0", "--data-dir", str(tmp_path), "--pid", str(os.getpid()))
    assert run.returncode == 0, run.stderr
    for area in ("memory", "reclaim", "kernel", "disk"):
        assert f"== {area}\n" in run.stdout, run.stdout
    assert f"process {os.getpid()}" in run.stdout
    assert "sampling skipped" in run.stdout


def test_doctor_refuses_a_missing_pid(tmp_path):
    run = doctor("--sample-secs", "0", "--data-dir", str(tmp_path), "--pid", "999999999")
    assert run.returncode != 0
    assert "no such process" in run.stderr
